"""The slicer's core as the durable runtime drives it: one delivery in, the events to publish out.

Owns the step from a wire delivery to the scheduler and back (`SlicerDecider`, a
`seedance.core.durable.DurableCore`): which node facts are refused (`seedance.slicer.intake`),
which time an event happens at (`seedance.slicer.trusted_time`, moving the pool's replay clock
and its decided floor), which scheduler call an event is, the consolidation round after a batch,
and the decisions' events (`seedance.slicer.mapping`); counting decisions only once the batch
that made them is durable. It must not touch the bus, the store or a clock: the runtime commits
the state and publishes what this returns; the decisions are `seedance.slicer.core.Scheduler`'s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from seedance.core import Delivery, InvalidMessage
from seedance.core.durable import DurableRuntime, Outbox
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.cost import PauseRequest
from seedance.events.jobs import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobMoveRefused,
    JobStarted,
    JobSubmitted,
)
from seedance.events.slicing import ShareChanged
from seedance.events.telemetry import GpuHealth, NodeInventory
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.core import Effect, Scheduler, SchedulerConfig
from seedance.slicer.durable import SlicerState, slicer_state
from seedance.slicer.intake import refusal
from seedance.slicer.mapping import OUTCOMES, job_spec, node_spec, published, share_change
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.publishers import Publishers
from seedance.slicer.settings import SlicerSettings
from seedance.slicer.trusted_time import is_observed, is_tenant_request, trusted_time

__all__ = ["DURABLES", "SlicerDecider"]

log = get_logger(__name__)

#: The slicer's durables and the events each takes (`Decider.apply` handles each of them).
DURABLES: tuple[tuple[str, Any], ...] = (
    ("slicer-inventory", NodeInventory | GpuHealth),
    ("slicer-pauses", PauseRequest),
    ("slicer-shares", ShareChanged),  # right-sizing's share changes (core.resize)
    (
        "slicer-jobs",
        JobSubmitted | JobStarted | JobFinished | JobFailed | JobCancelled | JobMoveRefused,
    ),  # fmt: skip  (a refused consolidation move: core.refused_moves)
)


class SlicerDecider:
    def __init__(
        self,
        *,
        settings: SlicerSettings,
        config: SchedulerConfig,
        cluster_policy: ClusterPolicy,
        metrics: SlicerMetrics,
    ) -> None:
        self._durable: DurableRuntime | None = None
        self._settings = settings
        self._config = config
        self._cluster_policy = cluster_policy
        self._metrics = metrics
        #: (outcome, reason) of the decisions not yet durable.
        self._counts: list[tuple[str, str]] = []
        #: Who described each node last (`seedance.slicer.publishers`: two publishers said).
        self._publishers = Publishers()
        #: The key of the decisions' ids (`seedance.core.id_key`), read at the service's start,
        #: before any decision (None until then: `publishable` refuses to publish unkeyed).
        self.id_key: bytes | None = None

    def bind(self, durable: DurableRuntime) -> None:
        """The runtime that holds the state this decides on."""
        self._durable = durable

    def _state(self) -> SlicerState:
        return slicer_state(self._durable)

    @property
    def _scheduler(self) -> Scheduler:
        return self._state().scheduler

    def check(self, d: Delivery[Any]) -> InvalidMessage | None:
        """A node speaking for another, or from the future; a share change dated past the
        right-sizing loop's bound (`seedance.slicer.intake`)."""
        refused = refusal(d.event, d.subject, d.received_at, self._settings.telemetry_ahead_s)
        if refused is not None:
            self._metrics.refused_total.labels(refused.kind).inc()
            log.warning(
                "slicer_node_fact_refused", kind=refused.kind, subject=d.subject,
                stream_seq=d.stream_seq, reason=str(refused),
            )  # fmt: skip
        return refused

    def trusted_time(self, d: Delivery[Any]) -> datetime:
        """The time one delivery's decisions are made at: its trusted time (``trusted_time``;
        ``request_clock`` for requests), never before the latest time decided at
        (`SlicerState.decide_at`: a node fact dated before a waiting job's submit places it no
        earlier than that submit) but for a trusted observer's report, which keeps its time
        (the past it reports is billed there; what it decides about a job is dated no earlier
        than that job's floor: `publishable`); noted as decided. The replay clock moves
        by the event's own time."""
        st = self._state()
        floor = None if st.decided_s is None else datetime.fromtimestamp(st.decided_s, UTC)
        at = trusted_time(d.event.at, d.subject, d.received_at, floor)
        if not is_tenant_request(d.subject):
            now = at.timestamp()
            if st.replay_now_s is None or now > st.replay_now_s:
                st.replay_now_s = now
        elif self._settings.request_clock == "replay" and st.replay_now_s is not None:
            at = datetime.fromtimestamp(st.replay_now_s, UTC)
        if is_observed(d.subject):
            if st.decided_s is None or at.timestamp() > st.decided_s:
                st.decided_s = at.timestamp()
            return at
        return st.decide_at(at)

    def apply(self, event: Any, at: datetime) -> Outbox:
        return self.publishable(self._effects(event, at.timestamp()), event, at)

    def after_batch(self, last: Event) -> Outbox:
        """A consolidation round when due (`seedance.slicer.core.draining`)."""
        at = datetime.fromtimestamp(self._state().decided_s or 0.0, UTC)
        return self.publishable(self._scheduler.consolidate(at.timestamp()), last, at)

    def settled(self, committed: bool) -> None:
        if committed:
            for outcome, reason in self._counts:
                self._metrics.decisions_total.labels(outcome, reason).inc()
        self._counts.clear()

    def _effects(self, ev: Any, now_s: float) -> list[Effect]:
        sched = self._scheduler
        if isinstance(ev, NodeInventory):
            self._note_publisher(ev)
            return sched.upsert_node(node_spec(ev), now_s)
        if isinstance(ev, GpuHealth):
            return sched.set_health(ev.node, ev.gpu_index, ev.healthy, now_s)
        if isinstance(ev, PauseRequest):
            return sched.set_paused(ev.tenant, ev.paused, now_s)
        if isinstance(ev, JobSubmitted):
            return sched.submit(self._cluster_policy.resolve(job_spec(ev)), now_s)
        if isinstance(ev, JobFinished | JobFailed | JobCancelled):
            return sched.finish(ev.tenant, ev.job_id, now_s, OUTCOMES[type(ev)].value)
        if isinstance(ev, JobStarted):
            return sched.start(ev.tenant, ev.job_id)
        if isinstance(ev, ShareChanged):
            return sched.resize_share(share_change(ev), now_s)
        if isinstance(ev, JobMoveRefused):
            return self._undo_move(ev, now_s)
        raise TypeError(f"the slicer has no use for {type(ev).__name__}")

    def _note_publisher(self, ev: NodeInventory) -> None:
        """Says where a node's inventory came from another kind of publisher than its last:
        the scheduler takes the last one whole, so two publishers flip the node's shape.
        Counts every change; logs a node's first one per leader term."""
        if (change := self._publishers.note(ev)) is None:
            return
        self._metrics.inventory_publisher_changes_total.inc()
        if not self._publishers.first_word(change.node):
            return
        log.warning(
            "slicer_inventory_publishers_disagree", node=change.node, before=change.before,
            before_shape=change.before_shape, after=change.after, after_shape=change.after_shape,
            hint="said once per node per leader term (the counter counts each change); the "
            "base's collector and k8s-bridge both publish a GPU-operator node's inventory "
            "(docs/k8s-bridge.md, who publishes a node's inventory)",
        )  # fmt: skip

    def _undo_move(self, ev: JobMoveRefused, now_s: float) -> list[Effect]:
        """The cluster refused a consolidation move (`seedance.slicer.core.refused_moves`)."""
        effects, outcome = self._scheduler.move_refused(ev.tenant, ev.job_id, ev.node, now_s)
        self._metrics.refused_moves_total.labels(outcome).inc()
        log_at = log.info if outcome == "undone" else log.warning
        log_at("slicer_move_refused", tenant=ev.tenant, job_id=ev.job_id, node=ev.node,
               outcome=outcome, decision_id=ev.decision_id, reason=ev.reason)  # fmt: skip
        return effects

    def publishable(self, effects: list[Effect], cause: Event, at: datetime) -> Outbox:
        """The events of `cause`'s decisions, each at `at` (the cause's trusted time) or, for
        a decision about a job whose floor is later (a trusted observer reports the past), at
        that floor: its submit or the latest decision published about it, its latest placement
        among them (`Scheduler.publish_at_s`, which notes each as published, in order)."""
        if self.id_key is None:
            raise RuntimeError("the slicer's derived-id key is read at start, before any decision")
        out: Outbox = []
        now_s = at.timestamp()
        for e in effects:
            at_s = self._scheduler.publish_at_s(e, now_s)
            when = at if at_s == now_s else datetime.fromtimestamp(at_s, UTC)
            subject, ev, count = published(
                e,
                cause,
                when,
                pool=self._settings.pool,
                policy=self._config.policy,
                key=self.id_key,
            )
            out.append((subject, ev))
            self._counts.append(count)
        return out

    def restored(self, seconds: float) -> None:
        """A leader's restore took `seconds` (read by ``make bench-scale``: keep the name)."""
        st = self._state()
        self._publishers.new_term()  # each node's publisher change is said once per term
        self.update_gauges()
        self._metrics.quota_revision.set(st.quota_revision)
        log.info(
            "slicer_state_restored", pool=self._settings.pool, nodes=len(st.scheduler.node_names),
            running=len(st.scheduler.running_jobs), seconds=round(seconds, 3),
            journal_records=st.store.stats.journal_records,
        )  # fmt: skip

    def update_gauges(self) -> None:
        sched = self._scheduler
        rechecked, sched.held_rechecked = sched.held_rechecked, 0  # counted once each
        self._metrics.held_rechecked_total.inc(rechecked)
        self._metrics.queued_jobs.set(sched.waiting_count)
        self._metrics.allocated_gpus.set(sched.allocated_gpus())
        self._metrics.set_capacity(sched.capacity_plans)
