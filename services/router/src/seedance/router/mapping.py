"""The one place the router translates between its wire types and its core and gateway types.

Owns every field-by-field copy the router makes: the gateway's `Candidate` into the policy's
`ReplicaState`, the KV `WeightTable` into the policy's `Forecast`, and the router's facts into the
frozen wire events of `seedance.events.routing` (`RoutingDecision`, `RoutingWeights`,
`ReplicaStats`, `ReplicaRecommendation`). Each function names, for every field of its output,
where it comes from, and for every input field it drops, why; a field added to either side is
therefore a change here, not a silent loss somewhere in the service.

Must not: decide anything, read a clock or do I/O. Times come in as arguments (`at`: the UTC
time of the fact, from the service's injected clock); the event ids are minted here because an
event is born here.

What the router does not read from the wire: telemetry (`seedance.events.telemetry`): no KV or
device telemetry reaches the router yet, so the forecaster's `TelemetrySample` is built from the
gateway's own count of requests in flight (`core.forecast.live`), and the KV fields of the
policy's view are zero (below).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import numpy as np

from seedance.events import Event, new_event_id
from seedance.events.routing import (
    ReplicaRecommendation,
    ReplicaStats,
    RoutingDecision,
    RoutingWeights,
)
from seedance.router.core.planning.planner import LoadForecast, PlannerConfig, Recommendation
from seedance.router.core.policy import Forecast, ReplicaForecast, ReplicaState
from seedance.router.core.weight_table import WeightTable
from seedance.router.gateway import Candidate, RoutedRequest

__all__ = [
    "LEFT_UNSET",
    "UNBOUNDED_KV_TOKENS",
    "decision_event",
    "recommendation_event",
    "replica_state",
    "stats_event",
    "table_forecast",
    "weights_event",
]

# Large enough that no KV projection ever reaches it: no KV telemetry reaches the router yet.
UNBOUNDED_KV_TOKENS = 2**62

#: The wire fields each event builder below leaves at their default, and why. Every other field
#: is set from the router's facts; a unit test holds both, so a field added to an event is a
#: decision taken here rather than a default nobody chose.
LEFT_UNSET: Mapping[type[Event], Mapping[str, str]] = {
    RoutingDecision: {
        "predicted_ttft_ms": "without token counts the policy's TTFT estimate is the same for "
        "every replica, so it says nothing about this request",
    },
    RoutingWeights: {},
    ReplicaStats: {
        "kv_occupancy": "no KV telemetry reaches the router",
        "mem_used_mib": "no device telemetry reaches the router",
    },
    ReplicaRecommendation: {},
}


# -- gateway / KV table -> core ------------------------------------------------------------------


def replica_state(candidate: Candidate) -> ReplicaState:
    """The policy's view of one gateway candidate.

    Carried: ``name`` -> ``replica_id``; ``outstanding`` -> ``running`` (an OIP request is
    admitted the moment Triton takes it, so every request in flight counts as running).
    Zero: ``waiting``, ``prefill_tokens_waiting``, ``prefill_tokens_in_progress``,
    ``kv_used_tokens`` (a Triton request carries no token counts), and ``kv_capacity_tokens`` is
    unbounded (no KV telemetry): every replica then has the same predicted TTFT, and the policy's
    tie-break (requests in flight plus forecast arrivals) decides.
    Refused: ``address`` (routing identity is the name), ``outstanding_for_model`` (the policy
    weighs all models together: replicas share their CPU/GPU across models), ``latency_ewma_s``
    (the policy predicts latency from load, it does not extrapolate measured latency).
    """
    return ReplicaState(
        replica_id=candidate.name,
        waiting=0,
        running=candidate.outstanding,
        prefill_tokens_waiting=0,
        prefill_tokens_in_progress=0,
        kv_used_tokens=0,
        kv_capacity_tokens=UNBOUNDED_KV_TOKENS,
    )


def table_forecast(table: WeightTable) -> Forecast:
    """The policy's view of a weight table.

    Carried: ``made_at_s``; per replica of ``weights``, ``qps_5s`` and ``qps_30s`` (0 where the
    table has none for it). Zero: the KV forecasts (no KV telemetry reaches the router yet; the
    policy then ranks on requests in flight and forecast arrivals only).
    Refused: ``model`` (the selector keeps one forecast per model already), ``model_id`` (which
    forecaster made it does not change the decision), ``weights`` (the policy weighs forecast
    load against requests in flight itself; the shares are for dashboards).
    """
    return Forecast(
        made_at_s=table.made_at_s,
        replicas={
            name: ReplicaForecast(
                qps_5s=table.qps_5s.get(name, 0.0),
                qps_30s=table.qps_30s.get(name, 0.0),
                kv_used_tokens_5s=0.0,
                kv_used_tokens_30s=0.0,
            )
            for name in table.weights
        },
    )


# -- router facts -> wire events -----------------------------------------------------------------


def decision_event(request: RoutedRequest, *, at: datetime) -> RoutingDecision:
    """One routed attempt as published.

    Carried: ``model``, ``request_id``, ``replica``, ``reason``, ``alternatives``.
    None: ``predicted_ttft_ms`` (without token counts the policy's TTFT estimate is the same for
    every replica, so it says nothing about this request).
    Refused: ``attempt`` (a failover is its own decision, with reason ``failover``), ``at_s``
    (the gateway's monotonic clock; the event's ``at`` is UTC).
    """
    return RoutingDecision(
        id=new_event_id(),
        at=at,
        model=request.model,
        request_id=request.request_id,
        replica=request.replica,
        reason=request.reason,
        alternatives=list(request.alternatives),
    )


def weights_event(table: WeightTable, *, at: datetime) -> RoutingWeights:
    """A weight table as published for dashboards and other consumers.

    Carried: ``model``, ``weights``, ``made_at_s`` -> ``forecast_at``, ``model_id`` -> ``reason``
    (``forecast:<model_id>``: the weights' cause is that forecaster version).
    Refused: ``qps_5s``, ``qps_30s`` (the gateways read them from the KV table, which is where
    the predictive policy needs them; the event carries only the shares).
    """
    return RoutingWeights(
        id=new_event_id(),
        at=at,
        model=table.model,
        weights=table.weights,
        reason=f"forecast:{table.model_id}",
        forecast_at=table.made_at_s,
    )


def stats_event(
    *,
    model: str,
    replica: str,
    window_s: float,
    requests: int,
    outstanding: int,
    durations_s: Sequence[float],
    at: datetime,
) -> ReplicaStats:
    """One (model, replica)'s stats window as published.

    Carried: every argument; ``durations_s`` as its 95th percentile in ms (None for a window
    without an answered request; the inverted-CDF percentile is an observed duration).
    None: ``kv_occupancy``, ``mem_used_mib`` (no KV or device telemetry reaches the router).
    """
    return ReplicaStats(
        id=new_event_id(),
        at=at,
        model=model,
        replica=replica,
        window_s=window_s,
        requests=requests,
        outstanding=outstanding,
        p95_latency_ms=_p95_ms(durations_s),
    )


def _p95_ms(durations_s: Sequence[float]) -> float | None:
    if not durations_s:
        return None
    return float(np.percentile(durations_s, 95, method="inverted_cdf")) * 1000.0


def recommendation_event(
    rec: Recommendation,
    *,
    model: str,
    replica_set: str,
    current: int,
    cfg: PlannerConfig,
    loads: Sequence[LoadForecast],
    at: datetime,
) -> ReplicaRecommendation:
    """One planner decision as published (what an autoscaler scales to).

    Carried: ``replicas``, ``needed``, ``reason`` and ``binding`` (their closed-set values),
    ``horizon_s``; ``replica_set`` (the gateway's, ``seedance.events.replicas.replica_set``);
    ``current`` (the count before this decision); from the planner's settings
    ``ttft_slo_s`` and ``startup_s``; the largest forecast arrival rate of ``loads`` (the load
    the decision covers) as ``forecast_arrivals_per_s``.
    Refused: the rest of each `LoadForecast` (prompt-size moments and quantiles, KV tokens: the
    planner's inputs, not its decision), of `PlannerConfig` (tuning, fixed per deployment) and
    of the `Recommendation` (``mode``, ``held``, ``record``, ``forecast_error``,
    ``observed_need``: the planner's account of itself, exported as the service's
    ``seedance_router_planner_*`` metrics, not what an autoscaler scales on).
    """
    return ReplicaRecommendation(
        id=new_event_id(),
        at=at,
        model=model,
        replicas=rec.replicas,
        needed=rec.needed,
        current=current,
        reason=rec.reason.value,
        binding=rec.binding.value,
        horizon_s=rec.horizon_s,
        ttft_slo_s=cfg.ttft_slo_s,
        startup_s=cfg.startup_s,
        forecast_arrivals_per_s=max((load.arrivals_per_s for load in loads), default=None),
        replica_set=replica_set,
    )
