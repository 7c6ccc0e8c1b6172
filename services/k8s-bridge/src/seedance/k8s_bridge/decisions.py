"""The slicer's decisions, as the bridge's leader carries them out (the ``k8s-bridge-decisions``
consumer: its batch handler, and the consumer itself, bound only while leading).

Owns what each decision's delivery becomes: acknowledged once its writes were made and the
events they called for are durable; naked and redelivered when a write about its pod failed for
now (after the write's own delay or ``bind_retry_s``) or those events were not committed (an
eviction's refusal is derivable from nothing else: acknowledged before it is durable, a
step-down would lose it for good; its id derives from the decision, so the redelivery reports
it once); naked while a gang's placement part waits for the gang to be placed whole;
acknowledged untouched, counted and logged when it names one of the bridge's pods' jobs under
another tenant than the pod's (`Tracker.foreign`: a bus tenant submitted a job under a pod's
job id). A batch that arrives while this replica does not lead, or whose
writes were cut short by a step-down, is naked for the next leader.

Must not decide anything (the tracker does) nor make a write (`Executor.carry_out` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from seedance.core import Clock, Delivery, RetryableError, ServiceRuntime
from seedance.core.consumer import PullConsumer
from seedance.core.logs import get_logger
from seedance.events.slicing import JobRejected, JobReleased, Placement, Preempted, Unschedulable
from seedance.k8s_bridge.core.actions import EvictPod
from seedance.k8s_bridge.core.tracker import Action, Bind, Tracker
from seedance.k8s_bridge.evictions import PodRefRetry
from seedance.k8s_bridge.metrics import BridgeMetrics

__all__ = ["DURABLE", "Decisions"]

log = get_logger(__name__)

DURABLE = "k8s-bridge-decisions"
_DECISIONS = Placement | Unschedulable | Preempted | JobRejected | JobReleased


class Decisions:
    def __init__(
        self,
        clock: Clock,
        metrics: BridgeMetrics,
        *,
        tracker: Callable[[], Tracker | None],
        carry_out: Callable[[Sequence[Action]], Awaitable[list[PodRefRetry]]],
        bind_retry_s: float,
    ) -> None:
        self._clock = clock
        self._metrics = metrics
        self._tracker = tracker
        self._carry_out = carry_out
        self._bind_retry_s = bind_retry_s

    def consumer(self, runtime: ServiceRuntime, *, batch: int, instance: str = "") -> PullConsumer:
        """The consumer `handle` takes the batches of, for the durable runtime to bind while
        leading; a per-test ``instance`` suffixes its durable's name."""
        c = runtime.consume(
            DURABLE, _DECISIONS, batch_handler=self.handle, batch=batch, managed=False
        )
        if instance:
            c.spec = dataclasses.replace(c.spec, durable=f"{DURABLE}-{instance}")
        return c

    async def handle(self, ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
        tracker = self._tracker()
        if tracker is None:
            raise RetryableError("not leading: the next leader takes these decisions")
        now = self._clock.now()
        actions: list[Action] = []
        origin: dict[str, int] = {}
        held: set[int] = set()
        for i, d in enumerate(ds):
            self._metrics.decisions_total.labels(type(d.event).__name__).inc()
            if tracker.foreign(d.event):
                self._refuse_foreign(d.event)
                continue
            # An eviction carries its delivery count: past the bridge's tries it is given up
            # and reported as a refused move (`seedance.k8s_bridge.evictions`).
            out = [
                dataclasses.replace(a, delivered=d.num_delivered) if isinstance(a, EvictPod) else a
                for a in tracker.decision(d.event, now)
            ]
            origin.update((a.ref.uid, i) for a in out if isinstance(a, Bind | EvictPod))
            actions.extend(out)
            if tracker.holds(d.event):
                held.add(i)
        retry = await self._carry_out(actions)
        if self._tracker() is not tracker:
            raise RetryableError("stepped down while carrying these decisions out")
        outcomes: list[BaseException | None] = [None] * len(ds)
        for i in held:
            outcomes[i] = RetryableError("a part of a gang placed whole only later", delay_s=0.5)
        for r in retry:
            if (at := origin.get(r.uid)) is not None:
                delay_s = r.after(ds[at].num_delivered) or self._bind_retry_s
                outcomes[at] = RetryableError(f"write failed for now: {r.why}", delay_s=delay_s)
        return outcomes

    def _refuse_foreign(self, ev: Any) -> None:
        self._metrics.decisions_refused_total.labels("other_tenant").inc()
        log.warning(
            "bridge_decision_other_tenant", decision=type(ev).__name__, event_id=ev.id,
            job=ev.job_id, tenant=ev.tenant,
        )  # fmt: skip
