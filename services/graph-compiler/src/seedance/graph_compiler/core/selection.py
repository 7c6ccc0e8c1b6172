"""Choosing among checked candidates by their time on the target: the rule and the interface.

Owns the ``Measurer`` protocol (the one way the core learns how fast a candidate runs, and what
it outputs, on the target execution provider) and ``select``, the pure rule that picks the
artifact from the timings: the fastest (candidate, session profile) pair that passed its
accuracy check and beats the FP32 baseline (the unchanged model under ORT_ENABLE_ALL with a
plain session on the same provider, timed in the same call). A candidate slower than that
baseline is never returned; when none beats it, the baseline graph itself is. Must not time or
run anything itself: the measurer is injected (``seedance.graph_compiler.measuring`` has the
ONNX Runtime one; tests hand in fakes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from seedance.graph_compiler.core.profile import SessionProfile, TargetInfo

__all__ = ["BASELINE", "Measurer", "Timing", "TimingResult", "select"]

BASELINE = "baseline"


class Timing(Protocol):
    """What a measurer reports per variant (``LatencyStats`` in ``measuring``)."""

    median_ms: float
    error: str | None


class Measurer(Protocol):
    @property
    def target(self) -> TargetInfo: ...

    def time(
        self,
        variants: Sequence[tuple[str, bytes, SessionProfile]],
        feeds: Mapping[str, np.ndarray],
    ) -> Mapping[str, Timing]:
        """Each variant's timing, all timed in one interleaved run on the target."""
        ...

    def outputs(
        self, model: bytes, profile: SessionProfile, feeds: Sequence[Mapping[str, np.ndarray]]
    ) -> list[list[np.ndarray]]:
        """The model's outputs on the target for each feed."""
        ...


@dataclass(frozen=True, kw_only=True)
class TimingResult:
    """One (candidate, profile) pair's time and verdict, as the report lists it."""

    candidate: str  # "int8" | "fp16" | "fp32" | "baseline"
    profile: SessionProfile
    median_ms: float | None
    chosen: bool = False
    reason: str = ""


def _ok(t: Timing | None) -> bool:
    return t is not None and t.error is None and math.isfinite(t.median_ms)


def select(
    timings: Mapping[tuple[str, str], Timing],
    profiles: Mapping[str, SessionProfile],
    accepted: Sequence[str],
    priority: Sequence[str],
    baseline_label: str,
) -> tuple[tuple[str, str], list[TimingResult]]:
    """Pick ``(candidate, profile label)`` from ``timings`` keyed the same way.

    ``(BASELINE, baseline_label)`` (the plain session) must be among the timings; the baseline
    under other profiles (IO binding, CUDA graph) competes like any candidate. ``accepted`` are
    the candidates that passed their accuracy check; ``priority`` breaks exact ties (the
    policy's order). Returns the pick and every pair's verdict. The baseline itself is a valid
    pick: it is the FP32 model run as anyone would run it, so returning it is never slower
    than not compiling.
    """
    base_key = (BASELINE, baseline_label)
    if not _ok(timings.get(base_key)):
        raise ValueError(f"the FP32 baseline was not timed: {timings.get(base_key)}")
    base_ms = timings[base_key].median_ms
    rank = {c: i for i, c in enumerate(priority)}
    pool = [
        k
        for k, t in timings.items()
        if _ok(t) and (k[0] in accepted or k[0] == BASELINE) and k != base_key
    ]
    faster = [k for k in pool if timings[k].median_ms < base_ms]
    pick = min(
        faster, key=lambda k: (timings[k].median_ms, rank.get(k[0], len(rank))), default=base_key
    )
    best_ms = timings[pick].median_ms
    verdicts: list[TimingResult] = []
    for key, t in timings.items():
        cand, label = key
        ms = t.median_ms if _ok(t) else None
        if key == pick:
            why = (
                f"chosen: {ms:.3f} ms vs FP32 baseline {base_ms:.3f} ms"
                if key != base_key
                else "chosen: no candidate beat the FP32 baseline"
            )
        elif not _ok(t):
            why = f"could not run under profile {label}: {t.error}"
        elif cand not in accepted and cand != BASELINE:
            why = f"failed its accuracy check ({ms:.3f} ms)"
        elif ms is not None and ms >= base_ms and key != base_key:
            why = f"refused: {ms:.3f} ms is not faster than the FP32 baseline {base_ms:.3f} ms"
        else:
            why = f"lost: {ms:.3f} ms vs {best_ms:.3f} ms for {pick[0]} ({pick[1]})"
        verdicts.append(
            TimingResult(
                candidate=cand,
                profile=profiles[label],
                median_ms=ms,
                chosen=key == pick,
                reason=why,
            )
        )
    return pick, verdicts
