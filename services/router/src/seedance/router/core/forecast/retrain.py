"""When to retrain a forecast model: a pure decision from the model's age and its live error.

Owns the retraining policy only. It must not train, read clocks or talk to the bus: the shell
passes the current time and the error sums it has scored (each forecast compared with what then
arrived), and acts on the decision (train on the window returned, store, swap).

Why these triggers: traffic drifts (time of day, new tenants), so a model is refreshed on a
schedule; a model that has started losing to the moving-average baseline on live traffic is
retrained at once rather than waiting for the schedule; and a model is never trained on less
history than makes its features defined (the 300-s windows) plus a useful number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["RetrainDecision", "RetrainInputs", "RetrainPolicy", "RetrainReason", "decide_retrain"]


class RetrainReason(StrEnum):
    NO_MODEL = "no_model"
    SCHEDULED = "scheduled"  # model older than max_model_age_s
    LOSING_TO_BASELINE = "losing_to_baseline"  # live WAPE worse than the moving average's
    TOO_LITTLE_HISTORY = "too_little_history"  # would retrain, but not enough history yet
    MODEL_OK = "model_ok"


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrainPolicy:
    min_history_s: float = 1_800.0  # 30 min: ~1,500 rows after the 300-s feature warm-up
    max_history_s: float = 7 * 86_400.0  # train on a sliding window: a week covers weekly cycles
    max_model_age_s: float = 3_600.0
    min_retrain_interval_s: float = 300.0  # never thrash: at most one retrain per 5 min
    min_scored_actual: float = 500.0  # requests scored before the live error is trusted
    losing_margin: float = 1.0  # retrain when model WAPE > margin × baseline WAPE


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrainInputs:
    now_s: float
    history_from_s: float  # oldest arrival kept in the history store
    model_trained_until_s: float | None  # None: no model yet
    last_retrain_s: float | None  # when the last training ran (None: never)
    scored_model_abs_error: float = 0.0  # Σ|forecast − actual| since the model went live
    scored_baseline_abs_error: float = 0.0  # Σ|moving average − actual| on the same windows
    scored_actual: float = 0.0  # Σ actual on the same windows


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrainDecision:
    retrain: bool
    reason: RetrainReason
    train_from_s: float | None = None  # the window to train on, when retrain is True
    train_until_s: float | None = None


def decide_retrain(
    inputs: RetrainInputs, policy: RetrainPolicy = RetrainPolicy()
) -> RetrainDecision:
    """Decide whether to retrain now, and on which window of history."""
    if inputs.model_trained_until_s is None:
        reason = RetrainReason.NO_MODEL
    elif (
        inputs.last_retrain_s is not None
        and inputs.now_s - inputs.last_retrain_s < policy.min_retrain_interval_s
    ):
        return RetrainDecision(retrain=False, reason=RetrainReason.MODEL_OK)
    elif (
        inputs.scored_actual >= policy.min_scored_actual
        and inputs.scored_model_abs_error > policy.losing_margin * inputs.scored_baseline_abs_error
    ):
        reason = RetrainReason.LOSING_TO_BASELINE
    elif inputs.now_s - inputs.model_trained_until_s > policy.max_model_age_s:
        reason = RetrainReason.SCHEDULED
    else:
        return RetrainDecision(retrain=False, reason=RetrainReason.MODEL_OK)
    span_s = inputs.now_s - inputs.history_from_s
    if span_s < policy.min_history_s:
        return RetrainDecision(retrain=False, reason=RetrainReason.TOO_LITTLE_HISTORY)
    return RetrainDecision(
        retrain=True,
        reason=reason,
        train_from_s=max(inputs.history_from_s, inputs.now_s - policy.max_history_s),
        train_until_s=inputs.now_s,
    )
