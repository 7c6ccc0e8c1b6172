"""Peak throughput per GPU model: the denominator of $ per TFLOP-hour.

Owns the table of published dense peaks (no structured-sparsity doubling), keyed by canonical
GPU model (``seedance.events.gpus``), and the rule that picks one. Models without a published
peak (the Alibaba trace's anonymised G1/G2/G3) are not here on purpose: their peak comes from
the price book as a configured value and reports flag it as an assumption. Models whose
datasheet figure was not checked when the table was keyed by canonical model are left out too
(their lines carry no $/TFLOP-hour and the report says so). Must not hold prices or read files.

Sources (NVIDIA datasheets; the SXM form factor unless said otherwise):
- P100: "Tesla P100 PCIe" datasheet: 9.3 TFLOPS FP32, 18.7 TFLOPS FP16 (no tensor cores).
- V100 (16 and 32 GB): "Tesla V100" datasheet, SXM2: 15.7 FP32, 125 tensor FP16.
- T4: "NVIDIA T4" datasheet: 8.1 FP32, 65 FP16 mixed-precision tensor.
- A10: "NVIDIA A10" datasheet: 31.2 FP32, 125 FP16 tensor dense (250 with sparsity).
- A100 (40 and 80 GB, SXM4 and PCIe): "NVIDIA A100" datasheet: 19.5 FP32, 312 FP16 tensor dense
  for every variant.
- H100: "NVIDIA H100" datasheet, SXM: 67 FP32, 989.5 FP16 tensor dense (1,979 sparse).
- H200: "NVIDIA H200" datasheet, SXM: 67 FP32, 989.5 FP16 tensor dense (1,979 sparse).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

__all__ = ["PEAK_TFLOPS", "PeakTflops", "Precision"]

Precision = Literal["fp16", "fp32"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakTflops:
    """Dense peak TFLOPS of one GPU model and where the figure comes from."""

    fp16_dense: Fraction
    fp32: Fraction
    source: str
    assumed: bool = False

    def at(self, precision: Precision) -> Fraction:
        return self.fp16_dense if precision == "fp16" else self.fp32


def _peak(fp16: str, fp32: str, source: str) -> PeakTflops:
    return PeakTflops(fp16_dense=Fraction(fp16), fp32=Fraction(fp32), source=source)


_A100 = _peak("312", "19.5", "NVIDIA A100 datasheet (dense; same for 40/80 GB, SXM4/PCIe)")

PEAK_TFLOPS: dict[str, PeakTflops] = {
    "P100-PCIE-16GB": _peak("18.7", "9.3", "NVIDIA Tesla P100 PCIe datasheet"),
    "V100-SXM2-16GB": _peak("125", "15.7", "NVIDIA Tesla V100 SXM2 datasheet"),
    "V100-SXM2-32GB": _peak("125", "15.7", "NVIDIA Tesla V100 SXM2 datasheet"),
    "T4-PCIE-16GB": _peak("65", "8.1", "NVIDIA T4 datasheet"),
    "A10-PCIE-24GB": _peak("125", "31.2", "NVIDIA A10 datasheet (dense)"),
    "A100-SXM4-40GB": _A100,
    "A100-SXM4-80GB": _A100,
    "A100-PCIE-40GB": _A100,
    "A100-PCIE-80GB": _A100,
    "H100-SXM5-80GB": _peak("989.5", "67", "NVIDIA H100 SXM datasheet (dense)"),
    "H200-SXM-141GB": _peak("989.5", "67", "NVIDIA H200 SXM datasheet (dense)"),
}
