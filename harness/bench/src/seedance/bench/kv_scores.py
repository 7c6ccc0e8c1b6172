"""bench-kv-forecast's scores and tables: WAPE, the baselines, the per-phase, per-sub-span and
per-split tables (`seedance.bench.kv_forecast` runs the forecasts and calls these).

Owns how a score is printed where it has no meaning: WAPE divides by the KV in use over the
rows, so rows where the server held no KV (the drain after the last request, an idle gap) have
none, and neither does a ratio to a baseline whose error there is 0; such cells read
"n/a (no KV)" / "n/a (baseline exact)" instead of an overflow or a ZeroDivisionError. Must not
do: forecast, or read files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "HORIZONS_S",
    "SplitResult",
    "best_baseline",
    "print_by_phase",
    "print_by_subspan",
    "print_splits",
    "score_cells",
    "trailing_mean",
    "value_at",
    "wape",
]

HORIZONS_S = (5, 30)
# Less KV than this summed over a table cell's rows is "no KV": nothing to scale an error by
# (NVML reports whole MiB, so below one MiB in all the rows is an empty pool).
NO_KV_MIB = 1.0


def value_at(t: np.ndarray, v: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """The latest sample at or before each time."""
    i = np.searchsorted(t, at_s, side="right") - 1
    return v[np.clip(i, 0, len(v) - 1)]


def trailing_mean(t: np.ndarray, v: np.ndarray, at_s: np.ndarray, window_s: float) -> np.ndarray:
    cum = np.concatenate([[0.0], np.cumsum(v)])
    hi = np.searchsorted(t, at_s, side="right")
    lo = np.searchsorted(t, at_s - window_s, side="right")
    return (cum[hi] - cum[lo]) / np.maximum(hi - lo, 1)


def wape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(pred - actual).sum() / max(float(np.abs(actual).sum()), 1e-9))


def best_baseline(
    t: np.ndarray, kv: np.ndarray, at: np.ndarray, actual: np.ndarray
) -> dict[str, float]:
    return {
        "last": wape(value_at(t, kv, at), actual),
        "ma10s": wape(trailing_mean(t, kv, at, 10.0), actual),
        "ma30s": wape(trailing_mean(t, kv, at, 30.0), actual),
    }


def score_cells(pred: np.ndarray, actual: np.ndarray, base: float) -> tuple[str, str, str]:
    """A table row's model WAPE, best baseline WAPE and their ratio, as printed cells: "n/a (no
    KV)" where the rows held no KV (WAPE has no denominator), the ratio "n/a (baseline exact)"
    where the best baseline's error is 0."""
    if float(np.abs(actual).sum()) < NO_KV_MIB:
        return "n/a (no KV)", "n/a (no KV)", "n/a (no KV)"
    m = wape(pred, actual)
    ratio = f"{m / base:.3f}" if base > 0.0 else "n/a (baseline exact)"
    return f"{m:.4f}", f"{base:.4f}", ratio


def print_by_phase(
    t: np.ndarray,
    kv: np.ndarray,
    row_t: np.ndarray,
    preds: dict[int, np.ndarray],
    queued: np.ndarray,
    spans: dict[str, dict[int, np.ndarray]],
) -> None:
    """Model / best baseline on rows where the server had a queue at t (a saturated plateau) and
    where it had none (ramp, drain), per span."""
    print(
        f"{'span':>6}{'phase':>10}{'horizon':>8}{'n':>6}{'model':>12}{'best_base':>12}{'ratio':>9}"
    )
    for span, in_span in spans.items():
        for h in HORIZONS_S:
            for phase, mask in (("plateau", queued > 0), ("other", queued <= 0)):
                keep = in_span[h] & mask
                if not bool(keep.any()):
                    print(f"{span:>6}{phase:>10}{h:>7}s{0:>6}{'-':>12}{'-':>12}{'-':>9}")
                    continue
                at = row_t[keep]
                actual = value_at(t, kv, at + h)
                b = min(best_baseline(t, kv, at, actual).values())
                m, bb, r = score_cells(preds[h][keep], actual, b)
                n = int(keep.sum())
                print(f"{span:>6}{phase:>10}{h:>7}s{n:>6}{m:>12}{bb:>12} {r:>8}")


@dataclass(frozen=True, slots=True)
class SplitResult:
    """One train/test split's scores: WAPE per horizon, ratios to the best baseline and to
    the last value (the worse horizon's)."""

    train_frac: float
    wape: dict[int, float]
    best_baseline: dict[int, float]
    last_value: dict[int, float]

    @property
    def ratio(self) -> float:
        return max(self.wape[h] / self.best_baseline[h] for h in HORIZONS_S)

    @property
    def ratio_last(self) -> float:
        return max(self.wape[h] / self.last_value[h] for h in HORIZONS_S)


def print_splits(results: list[SplitResult]) -> None:
    """The split sweep: one row per split, then its last line (key=value): the worst and best
    ratio over the splits, the worst ratio to the last value, and the split of the worst."""
    print(
        f"{'train_frac':>10}{'wape_5s':>9}{'wape_30s':>9}{'ratio_5s':>9}{'ratio_30s':>10}"
        f"{'ratio':>8}{'ratio_last':>11}"
    )
    for r in results:
        r5, r30 = (r.wape[h] / r.best_baseline[h] for h in HORIZONS_S)
        print(
            f"{r.train_frac:>10.2f}{r.wape[5]:>9.4f}{r.wape[30]:>9.4f}{r5:>9.3f}{r30:>10.3f}"
            f"{r.ratio:>8.3f}{r.ratio_last:>11.3f}"
        )
    worst = max(results, key=lambda r: r.ratio)
    print(
        "kv_forecast_splits: splits="
        + ",".join(f"{r.train_frac:g}" for r in results)
        + f" ratio_max={worst.ratio:.3f} ratio_min={min(r.ratio for r in results):.3f}"
        f" ratio_last_max={max(r.ratio_last for r in results):.3f}"
        f" worst_split={worst.train_frac:g}"
    )


def print_by_subspan(
    t: np.ndarray,
    kv: np.ndarray,
    row_t: np.ndarray,
    preds: dict[int, np.ndarray],
    test_rows: dict[int, np.ndarray],
    span_s: float,
) -> None:
    """Model / best baseline on consecutive sub-spans of ``span_s`` of the test span (by the
    row's time): how much the ratio of one test span owes to which stretch of it."""
    print(f"{'from_s':>7}{'horizon':>8}{'n':>5}{'model':>12}{'best_base':>12}{'ratio':>9}")
    for h in HORIZONS_S:
        rows = np.flatnonzero(test_rows[h])
        if rows.size == 0:
            continue
        start = row_t[rows[0]]
        for k in range(math.ceil((row_t[rows[-1]] - start + 1.0) / span_s)):
            lo = start + k * span_s
            keep = rows[(row_t[rows] >= lo) & (row_t[rows] < lo + span_s)]
            if keep.size == 0:
                continue
            at = row_t[keep]
            actual = value_at(t, kv, at + h)
            b = min(best_baseline(t, kv, at, actual).values())
            m, bb, r = score_cells(preds[h][keep], actual, b)
            print(f"{lo:>7.0f}{h:>7}s{keep.size:>5}{m:>12}{bb:>12} {r:>8}")
