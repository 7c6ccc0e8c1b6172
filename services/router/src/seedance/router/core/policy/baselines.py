"""The baseline routing policies every production router ships: round-robin,
least-outstanding-requests and power-of-two-choices (Ray Serve's default).

Must not do: read clocks or global randomness; power-of-two draws from a seeded generator it is
given, so a replay is deterministic.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    Reason,
    ReplicaState,
    RouteRequest,
)

__all__ = ["LeastOutstanding", "PowerOfTwoChoices", "RoundRobin", "least_outstanding_index"]


def least_outstanding_index(replicas: Sequence[ReplicaState]) -> int:
    """Index of the replica with the fewest outstanding requests; the lowest index on ties."""
    best_i = 0
    best = replicas[0].waiting + replicas[0].running
    for i in range(1, len(replicas)):
        s = replicas[i]
        load = s.waiting + s.running
        if load < best:
            best, best_i = load, i
    return best_i


class RoundRobin:
    """Cycles through replicas in order, blind to load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        i = self._next % len(replicas)
        self._next = i + 1
        return Decision(replica_index=i, reason=Reason.ROUND_ROBIN)


class LeastOutstanding:
    """Sends to the replica with the fewest requests in flight (waiting + running)."""

    name = "least_outstanding"

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        return Decision(
            replica_index=least_outstanding_index(replicas), reason=Reason.LEAST_OUTSTANDING
        )


class PowerOfTwoChoices:
    """Samples two distinct replicas and sends to the one with fewer outstanding requests."""

    name = "power_of_two"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        n = len(replicas)
        if n == 1:
            return Decision(replica_index=0, reason=Reason.POWER_OF_TWO)
        a, b = self._rng.sample(range(n), 2)
        sa, sb = replicas[a], replicas[b]
        pick = a if sa.waiting + sa.running <= sb.waiting + sb.running else b
        return Decision(replica_index=pick, reason=Reason.POWER_OF_TWO)
