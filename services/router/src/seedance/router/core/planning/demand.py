"""Observed demand: what a window of real arrivals would have needed, replayed.

Owns `replay_window`: the requests that reached the router in a window, replayed on one shared
first-come-first-served queue of n replicas (prefill time = overhead + prompt / throughput, as
the planner's queue model), for every n from 1 up to the first that serves all of them in time:
`DemandWindow.met_at(n)` is how many of its attainable requests (those an idle replica serves
within the SLO) n replicas would have served within the SLO. No arrival process is assumed: a
burst is replayed as it came, which a Poisson queue model over the window's mean rate does not
see. The planner judges its forecast by it (the forecast's record: would the count it asked for a
lead time before a window have served that window's requests?) and sizes panic on it.

Must not do: I/O, clocks, or look past the arrivals it is given.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DemandWindow", "replay_window"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DemandWindow:
    """One window of observed arrivals, replayed: `met[n - 1]` of its `requests` (attainable
    ones) are served within the SLO by n replicas; beyond the last entry, all of them."""

    end_s: float
    requests: int
    met: tuple[int, ...] = ()

    def met_at(self, replicas: int) -> int:
        if self.requests == 0:
            return 0
        if replicas <= 0:
            return 0
        return self.met[min(replicas, len(self.met)) - 1]

    def need(self, target: float) -> int:
        """Fewest replicas that serve `target` of the window's requests in time (0: none came)."""
        if self.requests == 0:
            return 0
        want = target * self.requests
        for n, m in enumerate(self.met, start=1):
            if m >= want - 1e-9:
                return n
        return len(self.met)


def replay_window(
    arrivals: Sequence[tuple[float, float]],
    *,
    count_from_s: float,
    end_s: float,
    slo_s: float,
    prefill_tokens_per_s: float,
    prefill_overhead_s: float,
    decode_step_s: float,
    max_replicas: int,
) -> DemandWindow:
    """Replay `arrivals` ((arrival_s, prompt tokens), in time order, up to `end_s`) on shared
    queues of 1, 2, ... replicas; count the attainable requests arriving at or after
    `count_from_s` (earlier ones only warm the queue up, so a burst that began before the
    window still holds the replicas it held). Stops at the first n that serves every counted
    request in time, or at `max_replicas`."""
    service = [prefill_overhead_s + p / prefill_tokens_per_s for _, p in arrivals]
    counted = [
        t >= count_from_s and s + decode_step_s <= slo_s
        for (t, _), s in zip(arrivals, service, strict=True)
    ]
    total = sum(counted)
    met: list[int] = []
    if total == 0:
        return DemandWindow(end_s=end_s, requests=0)
    for n in range(1, max_replicas + 1):
        got = _served_in_time(arrivals, service, counted, n, slo_s - decode_step_s)
        met.append(got)
        if got == total:
            break
    return DemandWindow(end_s=end_s, requests=total, met=tuple(met))


def _served_in_time(
    arrivals: Sequence[tuple[float, float]],
    service: Sequence[float],
    counted: Sequence[bool],
    n: int,
    budget_s: float,
) -> int:
    free = [-math.inf] * n  # when each replica is next free (a heap)
    got = 0
    for (t, _), s, c in zip(arrivals, service, counted, strict=True):
        start = max(t, heapq.heappop(free))
        heapq.heappush(free, start + s)
        got += c and start + s - t <= budget_s
    return got
