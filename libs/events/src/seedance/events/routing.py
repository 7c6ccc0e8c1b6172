"""Router events: per-replica request stats, routing weights, per-request decisions, and the
replica planner's recommended replica count per model."""

from __future__ import annotations

from typing import Annotated

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name

__all__ = [
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

    What a Kubernetes adapter or KEDA scales the model's Deployment to; the gateway routes to the
    first `replicas` members of its replica set and drains the rest. `reason` and `binding` are
    small closed sets (the planner's `PlanReason` and `Binding`); `horizon_s` is the forecast
    horizon that set `needed`, the count before scale-down hysteresis.
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


RoutingEvent = ReplicaStats | RoutingWeights | RoutingDecision | ReplicaRecommendation


class ReplicaRegistration(msgspec.Struct, frozen=True, kw_only=True):
    """One inference replica serving one model, as a registrar writes it into the
    ``seedance-router-replicas`` bucket under ``routing.replica_key(fleet, model, replica)``.

    Not an event (no id, no time): a KV value, the current truth about one key. `ready` false
    keeps the replica registered but out of traffic (an EndpointSlice endpoint not ready, a
    replica draining); deleting the key removes it.
    """

    model: Name
    replica: Name
    #: ``host:port`` of the replica's OIP gRPC endpoint (Triton's 8001).
    address: str
    ready: bool = True
