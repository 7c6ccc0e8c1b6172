"""A KV forecast that degrades gracefully: each forecast is made by the head whose recent error
is the lowest, and says which one that was.

Owns `select_heads`: given, at every row time t, the forecast each head made for t + H (the
flow model of `kv_flow`, the last value, the trailing means), and the KV later observed at
t + H, it picks per row the head with the smallest absolute error over the rows of the last
`window_s` whose target had been observed by t (t_j + H <= t: nothing after t is read), and
until `min_scored` such rows exist the `default` head (the one the training span chose).

Why: the flow model is a model of one kind of server under one kind of load (a FIFO queue in
front of a capped batch whose survivors are the long answers); where its assumptions fail it is
worse than the last value (a held-back code-completion recording: 1.179x, issue 32), and where
the KV pool sits at its cap the series is noise around the cap, which a trailing mean forecasts
better than the last value (1.3-1.4x on the simulated saturated recordings of
`seedance.bench.kv_proxies`). The error is measured on the recent past, so the choice follows a
change of regime (a ramp, a plateau, idle gaps) within a window.

Also owns `recent_change_weights`: how much of the flow model's change to add to the last value
at each row, the least-squares weight of the realised change on the model's over the recent
observed targets (a blend of the flow model and the last value by recent error, between the
training span's choice and the fallback's all-or-nothing). Must not do: read clocks, I/O, or
any target not yet observed at the row's time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

__all__ = [
    "ChangeWeightConfig",
    "HeadChoiceConfig",
    "KvHead",
    "recent_change_weights",
    "select_heads",
]


class KvHead(StrEnum):
    """Which forecast a row used: a closed set, printed by the bench and fit for a label."""

    FLOW = "flow"
    LAST_VALUE = "last_value"
    MEAN_10S = "mean_10s"
    MEAN_30S = "mean_30s"


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadChoiceConfig:
    horizon_s: float
    # The recent past each choice is judged on: long enough for a few targets to come due at
    # the longer horizon (four at 30 s), short enough to follow a change of regime. On the
    # H200 recording 60 s flipped on noise at 30 s (1.2x the flow model alone); 120-180 s kept
    # the flow model there, and 120 s followed the simulated recordings' plateaus sooner.
    window_s: float = 120.0
    # Scored rows needed before the recent error decides (before: the default head).
    min_scored: int = 10
    # The head in use is kept unless another's recent error is lower by this share: one
    # window's errors are noisy (at 30 s a minute holds two independent targets), and a choice
    # that flips on noise is worse than either head (it was, on the H200 recording: 1.2x).
    switch_margin: float = 0.1

    def __post_init__(self) -> None:
        _check_window(self)
        if not 0.0 <= self.switch_margin < 1.0:
            raise ValueError(
                f"HeadChoiceConfig.switch_margin: {self.switch_margin} (must be in [0, 1))"
            )


def select_heads(
    times_s: np.ndarray,
    forecasts: Mapping[KvHead, np.ndarray],
    actual: np.ndarray,
    cfg: HeadChoiceConfig,
    *,
    default: KvHead,
    order: Sequence[KvHead] | None = None,
    anchor: KvHead | None = None,
) -> tuple[np.ndarray, list[KvHead]]:
    """The forecast used at each row and the head that made it.

    `times_s` are the rows' times (increasing); `forecasts[h][i]` is head h's forecast made at
    `times_s[i]` for `times_s[i] + cfg.horizon_s`; `actual[i]` is the value observed at that
    target time (read only by rows at or after it). Ties go to the head first in `order`
    (default: the order of `forecasts`). With an `anchor` (the last value), a head in use whose
    recent error exceeds the anchor's gives way to it at once, without the switch margin: the
    forecast falls back to the anchor wherever the anchor has recently been better.
    """
    if anchor is not None and anchor not in forecasts:
        raise ValueError(f"select_heads: anchor head {anchor.value!r} has no forecasts")
    if default not in forecasts:
        raise ValueError(f"select_heads: default head {default.value!r} has no forecasts")
    heads = list(order or forecasts)
    n = len(times_s)
    for h in heads:
        if len(forecasts[h]) != n:
            raise ValueError(
                f"select_heads: forecasts[{h.value!r}] has {len(forecasts[h])} rows, not {n}"
            )
    if len(actual) != n:
        raise ValueError(f"select_heads: actual has {len(actual)} rows, not {n}")
    errors = np.vstack([np.abs(forecasts[h] - actual) for h in heads])  # (head, row)
    due = times_s + cfg.horizon_s
    out = np.empty(n)
    used: list[KvHead] = []
    head = default
    for i, t in enumerate(times_s):
        # Rows whose target had been observed by t, made within the window before that.
        scored = (due <= t + 1e-9) & (times_s >= t - cfg.horizon_s - cfg.window_s)
        if int(scored.sum()) >= cfg.min_scored:
            recent = errors[:, scored].sum(axis=1)
            best = int(np.argmin(recent))
            if recent[best] < (1.0 - cfg.switch_margin) * recent[heads.index(head)]:
                head = heads[best]
            elif anchor is not None and recent[heads.index(head)] > recent[heads.index(anchor)]:
                head = anchor
        used.append(head)
        out[i] = forecasts[head][i]
    return out, used


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeWeightConfig:
    horizon_s: float
    # The recent past the weight is fitted on. A least-squares weight is one number from every
    # target in the window: at 30 s, 240 s hold eight independent ones. On the H200 recording's
    # train/test splits 120 s was worse at the 0.4 split (0.820 against 0.805) and 240 s the same
    # as the whole history (docs/router.md).
    window_s: float = 240.0
    # Scored rows needed before the recent weight replaces the training span's.
    min_scored: int = 10

    def __post_init__(self) -> None:
        _check_window(self)


def recent_change_weights(
    times_s: np.ndarray,
    kv_now: np.ndarray,
    change: np.ndarray,
    actual: np.ndarray,
    cfg: ChangeWeightConfig,
    *,
    default: float,
) -> np.ndarray:
    """The weight w_i in [0, 1] of the model's change at each row: forecast = kv_now + w_i * change.

    w_i = sum(c_j * y_j) / sum(c_j ** 2), clipped to [0, 1], over the rows j whose target had been
    observed by times_s[i] (t_j + H <= t_i) and made within the window before that, where c_j is
    the model's change and y_j = actual_j - kv_now_j the realised one: the least-squares blend of
    the model and the last value on the recent past. Until ``min_scored`` such rows exist, and
    wherever ``default`` is 0 (the training span found the model no better than the last value:
    the weight is not reopened on a few recent rows), ``default``. NaN targets (not in the
    record) are skipped; so, in effect, are rows where the model forecast no change.
    """
    n = len(times_s)
    for name, arr in (("kv_now", kv_now), ("change", change), ("actual", actual)):
        if len(arr) != n:
            raise ValueError(f"recent_change_weights: {name} has {len(arr)} rows, not {n}")
    if not 0.0 <= default <= 1.0:
        raise ValueError(f"recent_change_weights: default {default} (must be in [0, 1])")
    out = np.full(n, float(default))
    if default == 0.0:
        return out
    realised = actual - kv_now
    known = ~np.isnan(realised) & ~np.isnan(change)
    due = times_s + cfg.horizon_s
    for i, t in enumerate(times_s):
        scored = known & (due <= t + 1e-9) & (times_s >= t - cfg.horizon_s - cfg.window_s)
        if int(scored.sum()) < cfg.min_scored:
            continue
        c, y = change[scored], realised[scored]
        den = float(c @ c)
        if den > 0.0:  # rows where the model was silent (a change of 0) say nothing of w
            out[i] = float(np.clip(float(c @ y) / den, 0.0, 1.0))
    return out


def _check_window(cfg: HeadChoiceConfig | ChangeWeightConfig) -> None:
    """A recent-window setting's horizon, window and scored rows, each error naming the field."""
    name = type(cfg).__name__
    if not cfg.horizon_s > 0 or not cfg.window_s > 0:
        raise ValueError(
            f"{name}: horizon_s {cfg.horizon_s} and window_s {cfg.window_s} must be > 0"
        )
    if cfg.min_scored < 1:
        raise ValueError(f"{name}.min_scored: {cfg.min_scored} (must be >= 1)")
