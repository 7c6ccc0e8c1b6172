"""The precision policy a compile request carries, in the product brief's shape.

Owns the typed, validated policy and its defaults. Must not run models or read the environment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Precision", "PrecisionPolicy", "Target"]


class Precision(enum.StrEnum):
    INT8 = "int8"
    FP16 = "fp16"
    FP32 = "fp32"


class Target(enum.StrEnum):
    """Where the artifact will run. FP16 only pays on a GPU: on the CPU provider ORT casts FP16
    weights back to FP32 and runs slower (research note, finding 3), so a CPU target skips it."""

    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, kw_only=True)
class PrecisionPolicy:
    """How far a compile may lower precision, and how the result is checked.

    ``int8_failure_threshold`` (the product brief's knob, kept explicit): the INT8 candidate is
    accepted only if the minimum cosine similarity between its outputs and FP32's, over every
    output and calibration sample, is at least this value. The default is 0.999, the same bar
    as every other candidate's ``min_cosine``: the brief's 0.95 let a CNN through at 0.954 and
    an FP16-overflow model at 0.9985 (issue 16), and at 0.95 a classifier's top-1 answers
    change. Lower it only for a model whose users accept that drift. Every candidate must also
    keep the FP32 top-1 answer on classifier-shaped outputs (``require_top1``; an output of
    shape [batch, classes] produced by Gemm/MatMul/Add/Softmax), stay within ``max_abs_err``
    (None: unchecked, since logits and hidden states have no common scale) and produce no
    NaN/Inf that FP32 does not. Which accepted candidate is returned is decided by its time on
    the target (``core/selection.py``); ``priority_order`` lists the candidates and breaks ties.
    """

    priority_order: tuple[Precision, ...] = (Precision.INT8, Precision.FP16, Precision.FP32)
    int8_failure_threshold: float = 0.999
    min_cosine: float = 0.999
    require_top1: bool = True
    max_abs_err: float | None = None
    target: Target = Target.CPU
    calibration_samples: int = 8
    seed: int = 0
    # Largest number of fallback attempts (quantise/convert + check) per precision.
    max_fallback_attempts: int = 4
    # Symbolic input dimensions are pinned to these values (name -> shape); unnamed dims -> 1.
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Fused contrib ops (attention, SkipLayerNorm, BiasGelu) only run on ONNX Runtime.
    allow_ort_contrib_ops: bool = True
    # > 0: the report also gets before/after peak RSS from the measurer (latency always comes
    # from the candidates' timing); 0 skips it.
    measure_runs: int = 0
    measure_threads: int = 2

    def __post_init__(self) -> None:
        order = tuple(Precision(p) for p in self.priority_order)
        if not order or len(set(order)) != len(order):
            raise ValueError(f"priority_order must be non-empty and unique, got {order!r}")
        object.__setattr__(self, "priority_order", order)
        object.__setattr__(self, "target", Target(self.target))
        if not 0.0 < self.int8_failure_threshold <= 1.0:
            raise ValueError(
                f"int8_failure_threshold must be in (0, 1], got {self.int8_failure_threshold!r}"
            )
        if not 0.0 < self.min_cosine <= 1.0:
            raise ValueError(f"min_cosine must be in (0, 1], got {self.min_cosine!r}")
        if self.calibration_samples < 1:
            raise ValueError(f"calibration_samples must be >= 1, got {self.calibration_samples!r}")
        if self.max_fallback_attempts < 1:
            raise ValueError(
                f"max_fallback_attempts must be >= 1, got {self.max_fallback_attempts!r}"
            )
