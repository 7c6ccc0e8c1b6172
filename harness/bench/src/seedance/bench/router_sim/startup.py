"""Replica start-up times for the autoscaling replay: measured load times, scaled by weight size.

Owns `StartupModel`: the empirical distribution of base-model load times in Alibaba's GenAI
serving trace (GenTD26, `basemodel_update_latency_anon.csv`: 7,531 loads, p50 22.7 s, p95 45.4 s,
bimodal: ~2.6 s when the weights were already near the GPU, 20-40 s when they were fetched),
every sample scaled by the simulated profile's weight bytes over the weights those loads moved,
and seeded draws from it for the replay. Must not do: read clocks or global randomness.

Why scaled, and by what. Those loads are of diffusion base models; a load is dominated by moving
the weights (storage to host to GPU), so its time grows with their size, and a 70B engine's 70 GB
take ten times an SDXL checkpoint's 6.9 GB. The reference is the SDXL base checkpoint
(6.94 GB in fp16): the trace's service is Stable-Diffusion serving whose base models span
1-20 GB (its authors' description) and SDXL is the base model the same Alibaba group's serving
paper (SwiftDiffusion, arXiv 2407.02031) runs in production. Scaling each sample keeps the
shape, its fast mode and its tail. Stated, not measured: what part of a load is fixed (engine
start, CUDA graphs), which would not scale, so larger models are over-stated by that part and
smaller ones under-stated. A check: the 8B bf16 profile's 16 GB scale to a median of 52 s, where
docs/router.md's estimate for an 8B from network storage was ~53 s.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from seedance.traces.genai import read_load_latencies

__all__ = ["SDXL_BASE_BYTES", "StartupModel"]

# sd_xl_base_1.0.safetensors (fp16): the reference weight size of the measured loads.
SDXL_BASE_BYTES = 6_938_078_334


@dataclass(frozen=True, slots=True)
class StartupModel:
    """Start-up times (seconds) to draw from, each equally likely."""

    samples_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.samples_s or min(self.samples_s) < 0:
            raise ValueError("StartupModel.samples_s: need at least one time, all >= 0")

    @classmethod
    def measured(
        cls, path: Path, *, weight_bytes: int, reference_bytes: int = SDXL_BASE_BYTES
    ) -> StartupModel:
        """The loads of `path` (a GenTD26 latency CSV) scaled by `weight_bytes` / reference."""
        if weight_bytes <= 0 or reference_bytes <= 0:
            raise ValueError(
                f"weight_bytes and reference_bytes must be > 0, got {weight_bytes} and "
                f"{reference_bytes}"
            )
        scale = weight_bytes / reference_bytes
        return cls(tuple(r.latency_ms / 1000.0 * scale for r in read_load_latencies(path)))

    def quantile(self, q: float) -> float:
        ordered = sorted(self.samples_s)
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    def draws(self, n: int, seed: int) -> tuple[float, ...]:
        """`n` start-up times drawn with replacement by a generator seeded with `seed`: the same
        sequence for every policy a bench compares (the k-th replica any of them starts takes
        the k-th time)."""
        rng = random.Random(seed)
        return tuple(rng.choice(self.samples_s) for _ in range(n))


def describe(times: Sequence[float]) -> str:
    ordered = sorted(times)
    at = {
        q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
        for q in (0.5, 0.9, 0.95, 0.99)
    }
    return " ".join(f"p{round(q * 100)}={v:.0f}s" for q, v in at.items())
