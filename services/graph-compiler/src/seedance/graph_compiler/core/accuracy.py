"""Comparing a candidate's outputs with the FP32 reference: max abs error, cosine, NaN/Inf.

Owns the definition of each figure (cosine is over the flattened output, per sample, and the
reported value is the minimum over outputs and samples; top-1 agreement is counted per row of
the outputs the caller names as classifier-shaped: a cosine of 0.999 can still flip the answer
of a classifier whose two best logits are close). Must not run models.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Accuracy", "compare_outputs"]


@dataclass(frozen=True, kw_only=True)
class Accuracy:
    max_abs_err: float
    min_cosine: float
    nonfinite_count: int  # NaN/Inf in the candidate where the reference was finite
    top1_mismatches: int = 0  # rows of classifier-shaped outputs whose argmax moved

    def passes(self, min_cosine: float, max_abs_err: float | None) -> bool:
        if self.nonfinite_count or not np.isfinite(self.max_abs_err):
            return False
        if self.top1_mismatches:
            return False
        if max_abs_err is not None and self.max_abs_err > max_abs_err:
            return False
        return self.min_cosine >= min_cosine


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64 = a.astype(np.float64).ravel()
    b64 = b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not (np.isfinite(na) and np.isfinite(nb)):
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def compare_outputs(
    reference: Sequence[Sequence[np.ndarray]],
    candidate: Sequence[Sequence[np.ndarray]],
    classifier_outputs: Collection[int] = (),
) -> Accuracy:
    """``reference[sample][output]`` against ``candidate[sample][output]``; outputs whose index
    is in ``classifier_outputs`` must also keep the reference's argmax over the last axis."""
    max_err, min_cos, bad, top1 = 0.0, 1.0, 0, 0
    for ref_outs, cand_outs in zip(reference, candidate, strict=True):
        for k, (ref, cand) in enumerate(zip(ref_outs, cand_outs, strict=True)):
            if k in classifier_outputs and np.asarray(ref).ndim >= 1:
                r, c = np.asarray(ref), np.asarray(cand)
                top1 += int(np.count_nonzero(r.argmax(axis=-1) != c.argmax(axis=-1)))
            if not np.issubdtype(np.asarray(ref).dtype, np.floating):
                if not np.array_equal(ref, cand):
                    min_cos = 0.0
                continue
            ref32 = np.asarray(ref, np.float64)
            cand32 = np.asarray(cand, np.float64)
            bad += int(np.count_nonzero(~np.isfinite(cand32) & np.isfinite(ref32)))
            finite = np.isfinite(cand32) & np.isfinite(ref32)
            diff = np.abs(np.where(finite, cand32 - ref32, 0.0))
            if diff.size:
                max_err = max(max_err, float(diff.max()))
            min_cos = min(min_cos, _cosine(np.where(finite, ref32, 0), np.where(finite, cand32, 0)))
    return Accuracy(
        max_abs_err=max_err, min_cosine=min_cos, nonfinite_count=bad, top1_mismatches=top1
    )
