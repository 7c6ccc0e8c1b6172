"""Typed inputs and outputs of a routing decision.

Owns the vocabulary every routing policy speaks: the request as the router sees it, one
replica's observable state, the forecast a policy may consume, and the decision with its reason.
Must not do: I/O, clocks, or anything policy-specific; these are plain frozen values that the
gateway (live state from Triton / engine metrics), the bus adapter (forecasts) and the replay
simulator all build the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

__all__ = [
    "Decision",
    "Forecast",
    "HoldingPolicy",
    "Reason",
    "ReplicaForecast",
    "ReplicaState",
    "RouteRequest",
    "RoutingPolicy",
]


class Reason(StrEnum):
    """Why a replica was chosen: a small closed set, exported as a metric label."""

    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"
    POWER_OF_TWO = "power_of_two"
    # The replica with the lowest predicted time to first token was taken.
    PREDICTED_SLO = "predicted_slo"
    # The lowest-TTFT replica was passed over because its KV cache (now or forecast) had no
    # headroom for this request.
    KV_HEADROOM = "kv_headroom"
    FALLBACK_NO_FORECAST = "fallback_no_forecast"
    FALLBACK_STALE_FORECAST = "fallback_stale_forecast"


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteRequest:
    """What the router knows about a request before it is served (never its output length)."""

    prompt_tokens: int
    # Prompt prefix block IDs (hashes of fixed-size token blocks, each standing for the whole
    # prefix up to it), as a gateway computes them from the token IDs; empty when unknown.
    prefix_hashes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaState:
    """One replica's current load, as an engine exposes it (vLLM / TRT-LLM / SGLang gauges).

    `waiting` requests have not been admitted (no KV reserved yet); `prefill_tokens_waiting` is
    the sum of their prompts. `prefill_tokens_in_progress` is the prompt work of the prefill
    iteration running now. `running` counts admitted requests (prefilling or decoding).
    """

    replica_id: str
    waiting: int
    running: int
    prefill_tokens_waiting: int
    prefill_tokens_in_progress: int
    kv_used_tokens: int
    kv_capacity_tokens: int

    @property
    def outstanding(self) -> int:
        """Requests sent to this replica and not yet finished."""
        return self.waiting + self.running


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaForecast:
    """Predicted load of one replica, `5s` and `30s` ahead of `Forecast.made_at_s`."""

    qps_5s: float
    qps_30s: float
    kv_used_tokens_5s: float
    kv_used_tokens_30s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Forecast:
    """A forecast for the fleet, stamped with the (virtual or UTC epoch) time it was made.

    Keyed by `ReplicaState.replica_id`; a replica missing from the map counts as no forecast.
    """

    made_at_s: float
    replicas: Mapping[str, ReplicaForecast]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """The chosen replica (an index into the `replicas` sequence the policy was given)."""

    replica_index: int
    reason: Reason
    # The policy's own TTFT estimate for the chosen replica, when it makes one (for metrics).
    predicted_ttft_s: float | None = None


class RoutingPolicy(Protocol):
    """Picks a replica for one request. Called once per request, on the hot path."""

    name: str

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision: ...


@runtime_checkable
class HoldingPolicy(Protocol):
    """A policy that may keep requests in the router (late binding) instead of binding each one
    to a replica on arrival.

    The router keeps held requests in one queue ordered by `hold_key` (smallest first, arrival
    order on ties; a constant key is FCFS). Whenever the fleet's state changes (an
    arrival, an iteration boundary on any replica) it offers the queue's head to `release`,
    which returns the decision to send it now or None to keep holding it (and everything behind
    it). Time to first token counts from arrival, so time held is charged to the request.
    `release` must return a decision when some replica is empty (nothing running or waiting),
    or the queue could stall.
    """

    name: str

    def hold_key(self, request: RouteRequest, now_s: float) -> float:
        """Where `request` goes in the router's queue, computed once on arrival."""
        ...

    def release(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision | None: ...
