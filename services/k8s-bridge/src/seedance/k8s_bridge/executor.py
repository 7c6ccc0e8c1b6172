"""Carrying the leader's actions out: the queue the watches fill, and one round of writes and
publishes for a batch of actions (the executor task's, or a decision batch's).

Owns the queue of actions (`enqueue`, drained by `run`), the job events not yet made durable,
and the order of one round: the writes (concurrently across pods, in order within one:
`per_pod`), then the events committed with their records and published (the durable runtime's
`transact`: commit before publish, the outbox re-published under the same ids), then what the
writes' outcomes call for, until nothing is left. Events are committed only while this replica
leads (``leading()``): the records are then the ones restored under the Lease. Events not made
durable are committed again at the next tick, new actions or not (a quiet cluster's pod end
waits no longer). What is left when it steps down is dropped (`step_down`, with the actions not
yet carried out: a standby writes nothing): the next leader derives a pod's events again from
the cluster (its informers' tombstones keep the pods deleted meanwhile, `ClusterView`), and a
decision's follow-up events (an eviction's refusal, derivable from nothing) come again from the
decision, which is naked until they are durable (`carry_out`'s retries).

Must not decide anything (the tracker does) nor make a write itself (`ApiWrites` does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from seedance.core.durable import DurableRuntime, Outbox
from seedance.core.logs import get_logger
from seedance.events.jobs import JobMoveRefused
from seedance.k8s_bridge.core.actions import EvictPod, Write, per_pod
from seedance.k8s_bridge.core.tracker import Action, Publish
from seedance.k8s_bridge.evictions import PodRefRetry
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.records import BridgeRecords
from seedance.k8s_bridge.writes import ApiWrites

__all__ = ["Executor"]

log = get_logger(__name__)

#: How often the queue is looked at without a wake-up (events not made durable are retried).
_TICK_S = 1.0
#: Evictions' refusals remembered in a term (a redelivered decision is not evicted again).
_REFUSALS_KEPT = 10_000


class Executor:
    def __init__(
        self,
        writes: ApiWrites,
        durable: DurableRuntime,
        metrics: BridgeMetrics,
        *,
        leading: Callable[[], bool],
        on_settled: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_settled()``: while leading, every action enqueued so far was carried out and
        its events are durable (the informers' tombstones are then no longer needed)."""
        self._writes = writes
        self._durable = durable
        self._metrics = metrics
        self._leading = leading
        self._pending: list[Action] = []
        self._unsaved: Outbox = []
        #: Rounds and commits under way (their events not yet, or no longer, in `_unsaved`).
        self._busy = 0
        #: The refusals reported this term (decision id -> the refusal's id, insertion-ordered):
        #: a decision redelivered because its refusal was not yet durable is not evicted again.
        self._refusals: dict[str, str] = {}
        self._on_settled = on_settled
        self._wake = asyncio.Event()

    @property
    def records(self) -> BridgeRecords:
        state = self._durable.state
        assert isinstance(state, BridgeRecords)
        return state

    def enqueue(self, actions: list[Action]) -> None:
        if actions:
            self._pending.extend(actions)
            self._wake.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_TICK_S):
                    await self._wake.wait()
            self._wake.clear()
            actions, self._pending = self._pending, []
            if not self._leading():
                continue  # a term that ended (`step_down`): the next leader's to derive
            if actions:
                await self.carry_out(actions)
            elif self._unsaved:
                await self.publish()  # no new action: the events owed are tried again anyway
            if self._leading() and not (self._pending or self._unsaved or self._busy):
                self._on_settled()

    async def carry_out(self, actions: Sequence[Action]) -> list[PodRefRetry]:
        """Make the writes, publish the events, then carry out what the writes' outcomes call
        for. Returns the writes to retry later: those that failed for now, and those whose
        follow-up events were not made durable (their decision is redelivered: the events'
        ids derive from it, and an eviction whose refusal this term reported is not made
        again)."""
        self._busy += 1
        try:
            return await self._carry_out(actions)
        finally:
            self._busy -= 1

    async def _carry_out(self, actions: Sequence[Action]) -> list[PodRefRetry]:
        retry: list[PodRefRetry] = []
        owed: dict[str, set[str]] = {}  # pod uid -> its writes' follow-up events
        while actions and self._leading():
            self._unsaved += [(a.subject, a.event) for a in actions if isinstance(a, Publish)]
            self._remember_refusals(actions)
            writes: list[Write] = []
            for a in actions:
                if isinstance(a, EvictPod) and (rid := self._refusals.get(a.decision_id)):
                    owed.setdefault(a.ref.uid, set()).add(rid)  # reported: not evicted again
                elif not isinstance(a, Publish):
                    writes.append(a)
            groups = per_pod(writes)
            done = await asyncio.gather(*(self._writes.all(g) for g in groups))
            await self.publish()
            actions = []
            for group, outcomes in zip(groups, done, strict=True):
                for follow, again in outcomes:
                    actions.extend(follow)
                    retry.extend(again)
                    ids = {a.event.id for a in follow if isinstance(a, Publish)}
                    owed.setdefault(group[0].ref.uid, set()).update(ids)
        unsaved = {ev.id for _, ev in self._unsaved}
        retry += [
            PodRefRetry(uid, "its follow-up events were not made durable")
            for uid, ids in owed.items()
            if ids & unsaved or (ids and not self._leading())
        ]
        return retry

    def _remember_refusals(self, actions: Sequence[Action]) -> None:
        for a in actions:
            if isinstance(a, Publish) and isinstance(a.event, JobMoveRefused):
                self._refusals[a.event.decision_id] = a.event.id
        if len(self._refusals) > _REFUSALS_KEPT:
            for old in list(self._refusals)[: len(self._refusals) - _REFUSALS_KEPT]:
                del self._refusals[old]

    async def publish(self) -> None:
        """The events not yet durable, with their records, as one commit, then published (and
        the events owed from before). Not made durable: kept for the next round."""
        if not self._leading():
            return
        items, self._unsaved = self._unsaved, []
        if items or self.records.outbox:
            self._busy += 1
            try:
                saved = await self._durable.transact(
                    lambda: self.records.publish(items), what="events"
                )
            finally:
                self._busy -= 1
            if not saved:
                self._unsaved = items + self._unsaved  # tried again within a tick
        self._metrics.outbox.set(len(self._unsaved) + len(self.records.outbox))

    def step_down(self) -> None:
        """The term is over: its actions not carried out and its events never made durable are
        dropped, so a standby never writes the cluster nor the records. The next leader derives
        a pod's events again from the cluster (the same ids); a decision's come again from the
        decision, naked until they were durable (`carry_out`)."""
        if self._unsaved or self._pending:
            log.warning(
                "bridge_events_left_to_next_leader", events=len(self._unsaved),
                actions=len(self._pending),
            )  # fmt: skip
        self._unsaved, self._pending = [], []
        self._refusals = {}
