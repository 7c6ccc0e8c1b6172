"""Router events: per-replica request stats, routing weights and per-request decisions."""

from __future__ import annotations

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name

__all__ = ["ReplicaStats", "RoutingDecision", "RoutingEvent", "RoutingWeights"]


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


RoutingEvent = ReplicaStats | RoutingWeights | RoutingDecision
