"""Carrying the leader's actions out: the queue the watches fill, and one round of writes and
publishes for a batch of actions (the executor task's, or a decision batch's).

Owns the queue of actions (`enqueue`, drained by `run`), the job events not yet made durable,
and the order of one round: the writes (concurrently across pods, in order within one:
`per_pod`), then the events committed with their records and published (the durable runtime's
`transact`: commit before publish, the outbox re-published under the same ids), then what the
writes' outcomes call for, until nothing is left. Events are committed only while this replica
leads (``leading()``): the records are then the ones restored under the Lease; events left when
it steps down are the next leader's to derive again (`forget_unsaved`).

Must not decide anything (the tracker does) nor make a write itself (`ApiWrites` does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from seedance.core.durable import DurableRuntime, Outbox
from seedance.core.logs import get_logger
from seedance.k8s_bridge.core.actions import per_pod
from seedance.k8s_bridge.core.tracker import Action, Publish
from seedance.k8s_bridge.evictions import PodRefRetry
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.records import BridgeRecords
from seedance.k8s_bridge.writes import ApiWrites

__all__ = ["Executor"]

log = get_logger(__name__)

#: How often the queue is looked at without a wake-up (events not made durable are retried).
_TICK_S = 1.0


class Executor:
    def __init__(
        self,
        writes: ApiWrites,
        durable: DurableRuntime,
        metrics: BridgeMetrics,
        *,
        leading: Callable[[], bool],
    ) -> None:
        self._writes = writes
        self._durable = durable
        self._metrics = metrics
        self._leading = leading
        self._pending: list[Action] = []
        self._unsaved: Outbox = []
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
            await self.carry_out(actions)

    async def carry_out(self, actions: Sequence[Action]) -> list[PodRefRetry]:
        """Make the writes, publish the events, then carry out what the writes' outcomes call
        for. Returns the Bindings to retry later."""
        retry: list[PodRefRetry] = []
        while actions:
            self._unsaved += [(a.subject, a.event) for a in actions if isinstance(a, Publish)]
            writes = [a for a in actions if not isinstance(a, Publish)]
            groups = await asyncio.gather(*(self._writes.all(g) for g in per_pod(writes)))
            await self.publish()
            actions = []
            for follow, again in (r for g in groups for r in g):
                actions.extend(follow)
                retry.extend(again)
        return retry

    async def publish(self) -> None:
        """The events not yet durable, with their records, as one commit, then published (and
        the events owed from before). Not made durable: kept for the next round."""
        if not self._leading():
            return
        items, self._unsaved = self._unsaved, []
        if items or self.records.outbox:
            saved = await self._durable.transact(lambda: self.records.publish(items), what="events")
            if not saved:
                self._unsaved = items + self._unsaved  # tried again within a tick
        self._metrics.outbox.set(len(self._unsaved) + len(self.records.outbox))

    def forget_unsaved(self) -> None:
        """Events never made durable are a term's own: the next leader derives them again
        from the cluster (the same ids), so a standby never writes the records."""
        if self._unsaved:
            log.warning("bridge_events_left_to_next_leader", events=len(self._unsaved))
        self._unsaved = []
