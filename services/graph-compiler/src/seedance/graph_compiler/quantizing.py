"""ONNX Runtime's quantiser as the compiler core's ``Quantizer``.

Owns the calls into ``onnxruntime.quantization`` and their settings: static QDQ (per-channel
INT8 weights, UINT8 activations, MinMax calibration) for convolutional nets, dynamic INT8
weights over the core's ``DYNAMIC_OPS`` for MatMul nets, and the temporary files the quantiser
insists on. Must not choose the method or the excluded nodes (``core/int8.py`` and the
compiler do) nor judge the result.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

from seedance.graph_compiler.core.int8 import DYNAMIC_OPS, ModelKind
from seedance.graph_compiler.core.runtime import Feeds

__all__ = ["OrtQuantizer"]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds: Sequence[Feeds]) -> None:
        self._it = iter(list(feeds))

    def get_next(self) -> Feeds | None:
        return next(self._it, None)


class OrtQuantizer:
    def quantize(
        self,
        model: onnx.ModelProto,
        kind: ModelKind,
        calibration: Sequence[Feeds],
        exclude: Sequence[str] = (),
    ) -> onnx.ModelProto:
        """The INT8 model; ``exclude`` names nodes that stay in float (the fallback set)."""
        with tempfile.TemporaryDirectory(prefix="gc-int8-") as tmp:
            src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
            onnx.save(model, src)
            if kind is ModelKind.CONV:
                quantize_static(
                    src,
                    dst,
                    _Reader(calibration),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    nodes_to_exclude=list(exclude),
                )
            else:
                quantize_dynamic(
                    src,
                    dst,
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=list(DYNAMIC_OPS),
                    nodes_to_exclude=list(exclude),
                    # Without this, ORT's quantiser fails on tensors shape inference could not
                    # type (research note, §9).
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
            return onnx.load(str(dst))
