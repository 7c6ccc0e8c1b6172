"""Router events: per-replica request stats, routing weights, per-request decisions, and the
replica planner's recommended replica count per model.

`ReplicaRegistration` (a KV value, not an event) lives in `seedance.events.replicas`, the
replica-set model; it is re-exported here for its readers."""

from __future__ import annotations

from typing import Annotated

import msgspec

from seedance.events.base import Event
from seedance.events.replicas import ReplicaRegistration
from seedance.events.tokens import Name

__all__ = [
    "PlanObservations",
    "ReplicaRecommendation",
    "ReplicaRegistration",
    "ReplicaStats",
    "RoutingDecision",
    "RoutingEvent",
    "RoutingWeights",
]


class ReplicaStats(Event, frozen=True, kw_only=True, tag="route.replica_stats.v1"):
    """What one replica of a model served over the last window."""

    model: Name
    replica: Name
    window_s: float
    requests: int
    outstanding: int = 0
    p95_latency_ms: float | None = None
    kv_occupancy: float | None = None
    mem_used_mib: float | None = None


class RoutingWeights(Event, frozen=True, kw_only=True, tag="route.weights.v1"):
    """The share of new traffic each replica of a model should take, and why."""

    model: Name
    weights: dict[str, float]
    reason: str = ""
    forecast_at: float | None = None


class RoutingDecision(Event, frozen=True, kw_only=True, tag="route.decision.v1"):
    """One request's routing: the replica chosen and the reason (a small closed set)."""

    model: Name
    request_id: str
    replica: Name
    reason: str
    predicted_ttft_ms: float | None = None
    alternatives: list[str] = msgspec.field(default_factory=list)


class ReplicaRecommendation(
    Event, frozen=True, kw_only=True, tag="route.replica_recommendation.v1"
):
    """How many replicas of a model the planner wants, so its TTFT SLO holds once they are ready.

    What a Kubernetes adapter or KEDA scales the model's Deployment to. `replica_set` names the
    set it sizes (`seedance.events.replicas.replica_set`: ``<fleet>.<model>``, the key prefix of
    its members in ``seedance-router-replicas``, on Kubernetes the Service labelled
    ``seedance.io/model=<model>``), the one the fleet's gateways route to; the replicas the
    autoscaler adds appear there once ready. `reason` and `binding` are small closed sets (the
    planner's `PlanReason` and `Binding`); `horizon_s` is the forecast horizon that set
    `needed`, the count before scale-down hysteresis.
    """

    model: Name
    replicas: Annotated[int, msgspec.Meta(ge=0)]
    needed: Annotated[int, msgspec.Meta(ge=0)]
    current: Annotated[int, msgspec.Meta(ge=0)]
    reason: str
    binding: str
    horizon_s: float
    ttft_slo_s: float
    startup_s: float
    forecast_arrivals_per_s: float | None = None
    #: ``<fleet>.<model>``; empty from a planner that predates it.
    replica_set: str = ""


class PlanObservations(Event, frozen=True, kw_only=True, tag="route.plan_observations.v1"):
    """What one gateway saw of a model over one planning bin: the planner's inputs.

    Every gateway of a fleet publishes one per model and per bin ``[since_s, until_s)`` (epoch
    seconds on the gateway's clock, bins `plan_interval_s` wide and aligned to the epoch, so the
    gateways' bins coincide), empty ones included: the fleet's planner merges them and plans only
    up to the bin that every live gateway has reported. `arrivals`: (arrival_s, prompt tokens)
    of the requests routed in the bin (first attempts), in order. `outcomes`: (arrival bin's
    start, met, requests) of the requests that finished in it, filed by when they arrived. The id
    is derived from (fleet, gateway, model, bin), so a re-sent bin is a duplicate. `fleet` is
    the router fleet whose planner it is for, the subject's last token
    (``seedance.routing.<model>.observed.<fleet>``): the planner dead-letters a report whose
    fleet disagrees with its subject's (empty: one from before the field, which named none).
    `leaving`: the gateway's last report (its clean stop's partial bin, ``until_s`` then
    mid-bin): the planner stops waiting for it at once.
    """

    model: Name
    gateway: Name
    fleet: str = ""
    since_s: float
    until_s: float
    arrivals: list[tuple[float, int]] = msgspec.field(default_factory=list)
    outcomes: list[tuple[float, int, int]] = msgspec.field(default_factory=list)
    leaving: bool = False


RoutingEvent = (
    ReplicaStats | RoutingWeights | RoutingDecision | ReplicaRecommendation | PlanObservations
)
