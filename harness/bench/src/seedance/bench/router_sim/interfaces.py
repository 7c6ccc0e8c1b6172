"""What the replay shows to what plugs into it, and what it returns.

Owns the interfaces of a forecast source (`ForecastSource`, which sees `ReplicaSnapshot`s at
its ticks) and of an autoscaler (`Scaler`, which sees a `FleetObservation` at its ticks), and
`SimResult`, a replay's per-request latencies and fleet figures. Must not simulate: `engine`
fills these in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from seedance.router.core.policy.state import Forecast, ReplicaState

__all__ = [
    "FleetObservation",
    "ForecastSource",
    "ReplicaSnapshot",
    "Scaler",
    "SimResult",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSnapshot:
    """What a forecast source may observe of a replica at a tick."""

    replica_id: str
    kv_used_tokens: int
    arrivals_since_last_tick: int


class ForecastSource:
    """Interface for forecast providers inside the replay (see `sim.forecast_source`)."""

    def observe(self, now_s: float, replicas: Sequence[ReplicaSnapshot]) -> Forecast | None:
        raise NotImplementedError

    @property
    def tick_s(self) -> float:
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetObservation:
    """What an autoscaler may observe at one of its ticks: engine gauges and router counters.

    Never a request's output length before it has finished, nor any future arrival.
    """

    now_s: float
    # States of the replicas taking traffic, and how many are starting or draining.
    ready: tuple[ReplicaState, ...]
    starting: int
    draining: int
    # Requests that reached the router since the previous tick: (arrival_s, prompt tokens).
    arrivals: tuple[tuple[float, int], ...]
    # Requests that finished since the previous tick, and their output tokens in all.
    finished: int
    finished_output_tokens: int
    # KV tokens held by every billed replica (draining ones included).
    kv_used_tokens: int
    # First tokens since the previous tick: (TTFT s, prompt tokens, arrival s) of each request.
    first_tokens: tuple[tuple[float, int, float], ...] = ()
    # Tokens decoded since the start by every replica, one per running sequence per decode step
    # (steps of a run in progress included): a server's decode-token counter.
    decoded_tokens_total: int = 0


class Scaler:
    """Interface for autoscaling policies inside the replay (see `sim.autoscale`)."""

    @property
    def tick_s(self) -> float:
        raise NotImplementedError

    def desired(self, obs: FleetObservation) -> int:
        """Replicas wanted (ready + starting), given what is observable now."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    """Per-request latencies (seconds; NaN for requests that could never fit a replica)."""

    ttft_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    replica_of: tuple[int, ...]
    reasons: Counter[str]
    max_kv_used_frac: float
    rejected: int
    # Prompt tokens not prefilled thanks to prefix-cache hits, and all prompt tokens admitted.
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    # Time each request spent held in the router before binding (all zero unless the policy
    # is a `HoldingPolicy`); it is part of its TTFT.
    hold_s: tuple[float, ...] = ()
    # When each request was admitted into its replica's batch (KV reserved), NaN if never.
    admit_s: tuple[float, ...] = ()
    # Billed replica time (start-up and draining included) up to the end of the replay, and the
    # fleet size (ready + starting) after each scaler decision: (time_s, replicas).
    replica_seconds: float = 0.0
    fleet_timeline: tuple[tuple[float, int], ...] = ()
