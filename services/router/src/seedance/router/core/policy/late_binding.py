"""Late binding: the router holds a request in its own queue while every replica already has a
full prefill iteration queued, and binds it to a replica (picked by an inner policy among those
that can take it) once one can.

Why: a router that binds on arrival commits a request to one replica's queue; in a burst, when
every KV pool is full, it has to guess which replica will free up first, and a wrong guess
leaves the request behind that replica's blocked head while another replica admits work. A
router-side queue (join-the-idle-queue / a central queue; llm-d's flow control and Dynamo's
router queue both hold requests at the gateway while workers are saturated) binds each request
when a replica can use it.

What "can take it" means: nothing is waiting there, or the prompts waiting there plus this one
still fit in the replica's next prefill iteration (`prefill_tokens_per_iter`, the engine's
`max_num_batched_tokens`, a replica setting the router knows). A replica is therefore never
starved of a full prefill batch, and whether KV admits the request is left to the engine, which
knows more than the router (the router does not know output lengths). A stricter rule, holding
until the router's own KV estimate (prompt + 256 expected output tokens) fits, and a
one-request buffer (bind only to replicas with nothing waiting) were measured and made TTFT
worse: the first because the estimate is wrong for most requests, the second because prefills
stop batching (docs/router-sim.md).

Order of the router's queue: FCFS by default. `HoldOrder.SHORTEST_PROMPT` releases the shortest
prompt first (shortest prefill first, which is SRPT for TTFT); it can starve long prompts for as
long as shorter ones keep coming, so it is reported apart from FCFS.

Must not do: read clocks, learn, or look at anything an engine does not expose.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from enum import StrEnum

from seedance.router.core.policy.state import (
    Decision,
    Forecast,
    ReplicaState,
    RouteRequest,
    RoutingPolicy,
)

__all__ = ["HoldOrder", "LateBinding", "can_take_now"]


class HoldOrder(StrEnum):
    FCFS = "fcfs"
    SHORTEST_PROMPT = "shortest_prompt"


def can_take_now(request: RouteRequest, s: ReplicaState, prefill_tokens_per_iter: int) -> bool:
    """Whether binding `request` to replica `s` now queues it no deeper than the replica's next
    prefill iteration (or the replica has nothing waiting at all)."""
    return (
        s.waiting == 0
        or s.prefill_tokens_waiting + request.prompt_tokens <= prefill_tokens_per_iter
    )


class LateBinding:
    """Holds requests at the router until a replica can take one; `inner` picks which.

    Implements `HoldingPolicy` for the replay (and for a gateway that keeps a queue), and plain
    `RoutingPolicy.choose` for callers that must bind now: then it prefers replicas that can
    take the request and otherwise defers to `inner` over all of them.
    """

    def __init__(
        self,
        inner: RoutingPolicy,
        *,
        prefill_tokens_per_iter: int,
        order: HoldOrder = HoldOrder.FCFS,
        name: str = "",
    ) -> None:
        if prefill_tokens_per_iter < 1:
            raise ValueError(f"prefill_tokens_per_iter must be >= 1, got {prefill_tokens_per_iter}")
        self._inner = inner
        self._per_iter = prefill_tokens_per_iter
        self._order = order
        self.name = name or f"late_{inner.name}"

    def hold_key(self, request: RouteRequest, now_s: float) -> float:
        if self._order is HoldOrder.SHORTEST_PROMPT:
            return float(request.prompt_tokens)
        return now_s

    def release(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision | None:
        ready = [i for i, s in enumerate(replicas) if can_take_now(request, s, self._per_iter)]
        if not ready:
            return None
        if len(ready) == len(replicas):
            return self._inner.choose(request, replicas, forecast, now_s)
        d = self._inner.choose(request, [replicas[i] for i in ready], forecast, now_s)
        return dataclasses.replace(d, replica_index=ready[d.replica_index])  # back to all

    def choose(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision:
        decision = self.release(request, replicas, forecast, now_s)
        if decision is None:
            return self._inner.choose(request, replicas, forecast, now_s)
        return decision
