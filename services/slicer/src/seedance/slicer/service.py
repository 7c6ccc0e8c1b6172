"""The slicer service: job events, inventory and pauses in; placements and reasons out.

One leader per node pool (a lease in JetStream KV) consumes; standbys wait for the lease and
take over when it lapses or is released, restoring the scheduler from the pool's snapshot. A
leader that loses its lease stops consuming and becomes a standby again.

After every batch what the batch changed in the scheduler's state is committed to KV *before*
anything is published or acked, together with the stream sequences it applied and its
decisions (an outbox): one journal record whose size follows the batch, not the pool
(`seedance.slicer.durable`, `seedance.core.state_store`). Then the decisions are published, then
the batch is acked. So:
- a crash before the write publishes nothing: the batch is redelivered and decided afresh (in
  whatever order the redeliveries come, which is why nothing may be published before the write);
- a crash after it: the next leader restores the state, skips the redelivered messages that the
  snapshot includes (by stream sequence) and publishes the outbox again; the decisions' ids are
  derived from their causes, so those already published are dropped as duplicates.
The commit is compare-and-set: a deposed leader's commit fails (`StateConflict`), it reloads
the state the new leader wrote and its batch is redelivered instead of overwriting anything.

One bad event never stops the slicer: an exception while applying one event (the scheduler or the
wiring raising on an input it cannot take) rolls the batch back to the durable state, replays
the batch without that event, and dead-letters it (`apply_error`, with the exception) while the
rest of the batch is decided and acknowledged as usual. The scheduler is deterministic, so the
replay decides exactly what the first pass did.

Clocks: which time an event happens at is `seedance.slicer.trusted_time`'s.

This module owns the wiring (leadership, batches, when the durable state is committed, rolled
back or reloaded: its format is `seedance.slicer.durable`'s; metrics, declared in
`seedance.slicer.metrics`); which wire field becomes which input and which effect becomes
which event is `seedance.slicer.mapping`'s, and the decisions themselves are
`seedance.slicer.core.Scheduler`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.js.kv import KeyValue
from opentelemetry.context import Context

from seedance.core import (
    TRANSIENT_BUS_ERRORS,
    Clock,
    Delivery,
    InvalidMessage,
    Lifecycle,
    RetryableError,
    ServiceRuntime,
    cancel_until_done,
)
from seedance.core.consumer import PullConsumer
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.state_store import StateConflict, StateStore
from seedance.events import Event
from seedance.events.base import derived_event_id
from seedance.events.cost import PauseRequest
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobStarted, JobSubmitted
from seedance.events.subjects import (
    POLICY_BUCKET,
    quota_usage_key,
)
from seedance.events.telemetry import GpuHealth, NodeInventory
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.config import load_quota, scheduler_config
from seedance.slicer.core import Effect, QuotaError, QuotaPolicy, Scheduler
from seedance.slicer.durable import SlicerState
from seedance.slicer.intake import refusal
from seedance.slicer.mapping import OUTCOMES, job_spec, node_spec, published
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.quiet_rounds import quiet_round
from seedance.slicer.settings import SlicerSettings
from seedance.slicer.trusted_time import is_tenant_request, trusted_time

__all__ = ["SlicerMetrics", "SlicerService", "trusted_time"]

log = get_logger(__name__)


class _EventFailed(Exception):
    """Applying the batch's event at `index` raised `cause`."""

    def __init__(self, index: int, cause: Exception) -> None:
        super().__init__(index, cause)
        self.index = index
        self.cause = cause


class SlicerService(Lifecycle):
    def __init__(self, runtime: ServiceRuntime, clock: Clock, settings: SlicerSettings) -> None:
        self._rt = runtime
        self._clock = clock
        self._settings = settings
        self.metrics = SlicerMetrics(runtime.registry)
        self._config = scheduler_config(settings)
        self._file_quota = load_quota(settings.quota_file)
        #: The SlicingPolicy in force (KV key ``slicing``, or a file): `cluster_policy`.
        self.cluster_policy = ClusterPolicy(
            settings.policy, key=settings.slicing_key, file=settings.slicing_file
        )
        #: The quota key's latest value seen by the watch (None: deleted) and its revision;
        #: None before the watch reported. A refused document is remembered so that it is
        #: logged once, not at every poll.
        self._latest_quota: tuple[bytes | None, int] | None = None
        self._refused_doc: bytes | None = None
        #: Why the latest quota document was refused (the parser's words); None once one is
        #: applied. Logged as `slicer_quota_refused` too.
        self.quota_refusal: str | None = None
        self._policy_kv: KeyValue | None = None
        #: The pool's quota usage as last written to KV (`usage.<pool>`).
        self._usage_written: bytes | None = None
        #: Wakes the leader loop: a new quota policy arrived, or stop.
        self._wake = asyncio.Event()
        #: The pool's state and its durable copy (the quota policy in force is part of it);
        #: bound to the KV at start.
        self._state: SlicerState | None = None
        self._idle = Scheduler(self._config, self._file_quota)
        #: The trace context of the delivery that caused each decision (by the decision's id),
        #: so a placement continues its job's trace; operational only, never in the snapshot.
        self._causes: dict[str, Context] = {}
        self._lock = asyncio.Lock()
        self._lease: Lease | None = None
        self._stopping = asyncio.Event()
        self._restored = False  # this term's state restored (see ``leading``)
        self._consumers = [
            self._consume("slicer-inventory", NodeInventory | GpuHealth),
            self._consume("slicer-pauses", PauseRequest),
            self._consume(
                "slicer-jobs",
                JobSubmitted | JobStarted | JobFinished | JobFailed | JobCancelled,
            ),
        ]

    def _consume(self, durable: str, types: Any) -> PullConsumer:
        name = f"{durable}-{self._settings.instance}" if self._settings.instance else durable
        c = self._rt.consume(
            durable, types, batch_handler=self._batch(name), batch=self._settings.batch,
            managed=False,
        )  # fmt: skip
        if self._settings.instance:
            c.spec = dataclasses.replace(c.spec, durable=name)
        return c

    @property
    def _key(self) -> str:
        return f"pool.{self._settings.pool}"

    @property
    def scheduler(self) -> Scheduler:
        """The pool's scheduler as this replica holds it (an empty one before the start)."""
        return self._state.scheduler if self._state is not None else self._idle

    @property
    def state(self) -> SlicerState:
        assert self._state is not None, "start() binds the state"
        return self._state

    @property
    def leading(self) -> bool:
        """The lease is ours and the state is restored under it: the scheduler, its policy and
        the usage it reports are the pool's. (Between the lease and the restore they are not:
        a usage write or a policy applied then would be the previous term's.)"""
        return self._restored and self._lease is not None and self._lease.held

    async def start(self) -> None:
        await self._rt.start()
        store = await StateStore.open(self._rt.bus, "seedance-slicer-state", self._key)
        self._state = SlicerState(
            store, legacy_key=self._key, config=self._config, parse_quota=self._saved_quota
        )
        if self._settings.quota_key or self._settings.slicing_key:
            self._policy_kv = await ensure_bucket(self._rt.bus, POLICY_BUCKET)
        leases = await ensure_bucket(self._rt.bus, "seedance-leases")
        holder = self._settings.replica or _hostname()
        self._lease = Lease(
            leases, f"slicer.{self._settings.pool}", holder, self._clock, self._settings.lease_ttl_s
        )

    async def run(self) -> None:
        assert self._lease is not None
        async with asyncio.TaskGroup() as tg:
            keeper = tg.create_task(self._lease.keep())
            kv = self._policy_kv
            watch = tg.create_task(self._watch_quota()) if kv and self._settings.quota_key else None
            slicing = (
                tg.create_task(self.cluster_policy.watch(kv))
                if kv and self._settings.slicing_key
                else None
            )
            usage = tg.create_task(self._usage_loop()) if self._policy_kv is not None else None
            runtime_task = tg.create_task(self._rt.run())
            leading = tg.create_task(self._lead())
            await runtime_task
            self._stopping.set()
            self._wake.set()
            await leading
            # The lease refresh and the usage write publish: one cancel can be lost (nats-py).
            await cancel_until_done((keeper, watch, usage, slicing))

    async def _lead(self) -> None:
        """Standby until the lease is ours; lead until it is lost or we stop; repeat."""
        assert self._lease is not None
        poll_s = self._settings.lease_ttl_s / 6
        while not self._stopping.is_set():
            if not self._lease.held:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that lands as the event fires (see seedance.core.reader), leaving this loop
                # running after a stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._lease.acquired.wait()
                continue
            await self._restore()
            # Decide nothing before the SlicingPolicy in force is known (bounded: a watch that
            # cannot start leaves the file's policy, or none, in force).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.lease_ttl_s):
                    await self.cluster_policy.synced.wait()
            self._restored = True
            self.metrics.leader.set(1)
            await self._sync_quota()
            for c in self._consumers:
                await c.start(self._rt.bus)
            tasks = [asyncio.create_task(c.run()) for c in self._consumers]
            while self._lease.held and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._wake.wait()
                self._wake.clear()
                await self._sync_quota()  # also retries a policy whose save failed
                await quiet_round(self)  # a consolidation round due on the slicer's own clock
            for c in self._consumers:
                c.stop()
            await asyncio.gather(*tasks)
            self._restored = False
            self.metrics.leader.set(0)
            await self.state.store.close()  # a base being written is the next leader's to write
            if not self._stopping.is_set():
                log.warning("slicer_leadership_lost", pool=self._settings.pool)
                for c in self._consumers:
                    await c.close()  # unacked messages go to the new leader

    async def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        for c in self._consumers:
            c.stop()
        await self._rt.stop()

    async def close(self) -> None:
        for c in self._consumers:
            await c.close()
        if self._state is not None:
            await self._state.store.close()
        if self._lease is not None:
            await self._lease.release()
        await self._rt.close()

    # --- state ------------------------------------------------------------------------------

    async def _restore(self) -> None:
        started = asyncio.get_running_loop().time()
        for attempt in range(5):
            try:
                await self.state.load()
                break
            except StateConflict as exc:
                # Another writer moved the head while this one read its base: read again.
                log.warning("slicer_state_reread", pool=self._settings.pool, error=str(exc))
                if attempt == 4:
                    raise
        self._update_gauges()
        self.metrics.quota_revision.set(self.state.quota_revision)
        with contextlib.suppress(RetryableError):
            await self._flush()  # the previous leader may have died between commit and publish
        log.info(
            "slicer_state_restored",
            pool=self._settings.pool,
            nodes=len(self.scheduler.node_names),
            running=len(self.scheduler.running_jobs),
            seconds=round(asyncio.get_running_loop().time() - started, 3),
        )

    async def _commit(self) -> None:
        """Commit what changed (with the outbox); on failure back to the committed state (a
        conflict: the state another leader committed) and the caller's batch is retried."""
        started = asyncio.get_running_loop().time()
        try:
            await self.state.commit()
        except StateConflict:
            log.warning("slicer_state_conflict", pool=self._settings.pool)
            await self._reload()
            raise
        except Exception:
            self.state.rollback()
            raise
        self.metrics.state_write_seconds.observe(asyncio.get_running_loop().time() - started)

    async def _reload(self) -> None:
        try:
            await self.state.load()
        except Exception:
            self.state.rollback()  # the next commit conflicts again and reloads
            raise

    # --- the quota policy from KV ------------------------------------------------------------

    async def _watch_quota(self) -> None:
        """Follow the quota key (every replica: a standby that takes over knows the latest);
        the leader applies it between batches (`_sync_quota`)."""
        assert self._policy_kv is not None
        watcher = await self._policy_kv.watch(self._settings.quota_key)
        try:
            async for entry in watcher:
                if entry is None:
                    continue  # the end-of-history marker
                deleted = entry.operation is not None  # DEL or PURGE
                self._latest_quota = (
                    None if deleted else bytes(entry.value or b""),
                    entry.revision,
                )
                self._wake.set()
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def _usage_loop(self) -> None:
        """Every leader poll period, `_publish_usage`: beside the batches and the leader loop,
        so a slow or refused write delays neither."""
        while not self._stopping.is_set():
            await self._clock.sleep(self._settings.lease_ttl_s / 6)
            await self._publish_usage()

    async def _publish_usage(self) -> None:
        """Write what each tenant holds in this pool (`usage.<pool>`, read by the k8s-bridge
        into the TenantQuota statuses) when it changed; off the batch path, so the figure lags
        by up to a poll period."""
        if self._policy_kv is None or not self.leading:
            return
        doc: dict[str, Any] = {
            "revision": self.state.quota_revision,
            "tenants": self.scheduler.quota_usage(),
        }
        applied = self.cluster_policy.applied()
        if applied is not None:  # what it follows of the SlicingPolicy (the CR's status)
            doc["slicing"] = msgspec.to_builtins(applied)
        data = json.dumps(doc, sort_keys=True).encode()
        if data == self._usage_written:
            return
        try:
            await self._policy_kv.put(quota_usage_key(self._settings.pool), data)
        except TRANSIENT_BUS_ERRORS as exc:
            log.warning("slicer_usage_not_written", error=repr(exc))
            return
        self._usage_written = data

    def _saved_quota(self, doc: bytes | None) -> QuotaPolicy | None:
        """The policy a snapshot was decided under (None document: the file's)."""
        if doc is None:
            return self._file_quota
        try:
            return QuotaPolicy.from_yaml(doc.decode())
        except (QuotaError, UnicodeDecodeError) as exc:  # it parsed when it was saved
            log.error("slicer_saved_quota_unreadable", error=str(exc))
            return self._file_quota

    async def _sync_quota(self) -> None:
        """Put the latest KV quota policy in force when it is new (leader only, between
        batches). An invalid document is refused with its reason, once; the old policy stays."""
        latest = self._latest_quota
        if latest is None or not self.leading:
            return
        doc, revision = latest
        if doc == self.state.quota_doc or (doc is not None and doc == self._refused_doc):
            return
        try:
            policy = self._file_quota if doc is None else QuotaPolicy.from_yaml(doc.decode())
        except (QuotaError, UnicodeDecodeError) as exc:
            self._refused_doc = doc
            self.quota_refusal = str(exc)[:1000]
            self.metrics.quota_updates_total.labels("refused").inc()
            log.warning("slicer_quota_refused", revision=revision, reason=self.quota_refusal)
            return
        async with self._lock:
            await self._apply_quota(policy, doc, revision)

    def _policy_time(self) -> datetime:
        """When a new policy takes effect: the slicer's own clock (a trusted service's
        decision), or "now" in a replayed fleet."""
        now_s = self.state.replay_now_s
        if self._settings.request_clock == "replay" and now_s is not None:
            return datetime.fromtimestamp(now_s, UTC)
        return self._clock.now()

    async def _apply_quota(self, policy: QuotaPolicy | None, doc: bytes | None, rev: int) -> None:
        """As a batch: decide (held jobs a raised quota admits), save with the policy, publish.
        A failed save rolls back; the next poll tries again."""
        try:
            await self._flush()  # a previous batch's durable decisions go out first
        except RetryableError:
            return
        at = self._policy_time()
        cause = Event(
            id=derived_event_id(
                f"quota/{self._settings.pool}/{rev}", "quota", unix_ms=int(at.timestamp() * 1000)
            ),
            at=at,
        )
        counts: list[tuple[str, str]] = []
        st = self.state
        out = self._publishable(self.scheduler.set_quota(policy, at.timestamp()), cause, at, counts)
        st.quota, st.quota_doc, st.quota_revision = policy, doc, rev
        st.outbox = out
        try:
            await self._commit()
        except Exception as exc:  # nothing published: back to the committed state, retried
            log.warning("slicer_quota_not_saved", revision=rev, error=repr(exc))
            return
        for outcome, reason in counts:
            self.metrics.decisions_total.labels(outcome, reason).inc()
        self.metrics.quota_updates_total.labels("applied").inc()
        self.quota_refusal = None
        self.metrics.quota_revision.set(rev if doc is not None else 0)
        with contextlib.suppress(RetryableError):
            await self._flush()  # else the next batch publishes them first
        self._update_gauges()
        log.info(
            "slicer_quota_applied",
            revision=rev,
            source="kv" if doc is not None else "file",
            tenants=len(policy.tenants) if policy is not None else 0,
            decisions=len(out),
        )

    # --- handling ---------------------------------------------------------------------------

    def _batch(self, durable: str) -> Any:
        async def handle(ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
            async with self._lock:
                await self._flush()  # a previous batch's durable decisions go out first
                failed: dict[int, BaseException] = {}
                while True:
                    try:
                        out, counts, fresh = self._decide(durable, ds, failed)
                        break
                    except _EventFailed as f:
                        # Back to the committed state; decide the batch again without the event
                        # that raised; it is dead-lettered with the reason.
                        failed[f.index] = InvalidMessage(
                            f"applying {type(ds[f.index].event).__name__} "
                            f"{ds[f.index].event.id} raised {f.cause!r}"[:1000],
                            kind="apply_error",
                        )
                        log.error(
                            "slicer_event_failed",
                            error=repr(f.cause),
                            subject=ds[f.index].subject,
                            stream_seq=ds[f.index].stream_seq,
                        )
                        self.state.rollback()
                if fresh:
                    self.state.outbox = out
                    try:
                        await self._commit()
                    except Exception as exc:
                        # Nothing was published: the batch is redelivered and decided afresh.
                        raise RetryableError(f"slicer batch not made durable: {exc!r}") from exc
                for outcome, reason in counts:
                    self.metrics.decisions_total.labels(outcome, reason).inc()
                await self._flush()

            self._update_gauges()
            return [failed.get(i) for i in range(len(ds))]

        return handle

    def _event_time(self, d: Delivery[Any]) -> datetime:
        """The trusted time of one delivery (``trusted_time``; ``request_clock`` for requests),
        never before the latest time decided at for a tenant's request; noted as decided."""
        st = self.state
        floor = None if st.decided_s is None else datetime.fromtimestamp(st.decided_s, UTC)
        at = trusted_time(d.event.at, d.subject, d.received_at, floor)
        if not is_tenant_request(d.subject):
            now = at.timestamp()
            if st.replay_now_s is None or now > st.replay_now_s:
                st.replay_now_s = now
        elif self._settings.request_clock == "replay" and st.replay_now_s is not None:
            at = datetime.fromtimestamp(st.replay_now_s, UTC)
        if st.decided_s is None or at.timestamp() > st.decided_s:
            st.decided_s = at.timestamp()
        return at

    def _decide(
        self, durable: str, ds: Sequence[Delivery[Any]], skip: dict[int, BaseException]
    ) -> tuple[list[tuple[str, Event]], list[tuple[str, str]], int]:
        """Apply the batch's fresh deliveries (those not in `skip`) to the scheduler: their
        decisions, metric counts, and how many were applied. Raises `_EventFailed` naming the
        first delivery whose application raised (the scheduler may be half-changed then)."""
        out: list[tuple[str, Event]] = []
        counts: list[tuple[str, str]] = []
        applied = self.state.applied
        fresh = 0
        last: Event | None = None
        for i, d in enumerate(ds):
            seq = d.stream_seq
            if i in skip or applied.is_applied(durable, seq):
                continue  # dead-lettered, or already in the durable state (a redelivery)
            refused = refusal(d.event, d.subject, d.received_at, self._settings.telemetry_ahead_s)
            if refused is not None:  # a node speaking for another, or from the future
                skip[i] = refused
                self.metrics.refused_total.labels(refused.kind).inc()
                log.warning(
                    "slicer_node_fact_refused", kind=refused.kind, subject=d.subject,
                    stream_seq=seq,
                )  # fmt: skip
                continue
            try:
                at = self._event_time(d)
                effects = self._apply(d.event, at)
                decisions = self._publishable(effects, d.event, at, counts)
                if d.trace_context is not None:
                    self._causes.update((ev.id, d.trace_context) for _, ev in decisions)
                out.extend(decisions)
            except Exception as exc:  # the per-event dead-letter wrapper (module docstring)
                raise _EventFailed(i, exc) from exc
            applied.add(durable, seq)
            fresh += 1
            last = d.event
        if last is not None:  # after the batch, a consolidation round when due (core.draining)
            at = datetime.fromtimestamp(self.state.decided_s or 0.0, UTC)
            moves = self.scheduler.consolidate(at.timestamp())
            out.extend(self._publishable(moves, last, at, counts))
        return out, counts, fresh

    async def _flush(self) -> None:
        """Publish the durable decisions not yet published; on failure the batch is naked,
        its redelivery skipped (the snapshot has it) and the decisions tried again first."""
        outbox = self.state.outbox
        if not outbox:
            return
        try:
            # Each decision carries its cause's trace (a restored outbox's: the flush's own).
            await self._rt.bus.publish_many(
                outbox, causes=[self._causes.get(ev.id) for _, ev in outbox]
            )
        except Exception as exc:
            raise RetryableError(f"slicer decisions not published: {exc!r}") from exc
        self.state.outbox = []
        self._causes.clear()

    def _apply(self, ev: Any, at: datetime) -> list[Effect]:
        now_s = at.timestamp()
        sched = self.scheduler
        if isinstance(ev, NodeInventory):
            return sched.upsert_node(node_spec(ev), now_s)
        if isinstance(ev, GpuHealth):
            return sched.set_health(ev.node, ev.gpu_index, ev.healthy, now_s)
        if isinstance(ev, PauseRequest):
            return sched.set_paused(ev.tenant, ev.paused, now_s)
        if isinstance(ev, JobSubmitted):
            return sched.submit(self.cluster_policy.resolve(job_spec(ev)), now_s)
        if isinstance(ev, JobFinished | JobFailed | JobCancelled):
            return sched.finish(ev.tenant, ev.job_id, now_s, OUTCOMES[type(ev)].value)
        if isinstance(ev, JobStarted):
            return sched.start(ev.tenant, ev.job_id)
        raise TypeError(f"the slicer has no use for {type(ev).__name__}")

    def _publishable(
        self, effects: list[Effect], cause: Event, at: datetime, counts: list[tuple[str, str]]
    ) -> list[tuple[str, Event]]:
        """The events of `cause`'s decisions, each at `at` (the cause's trusted time)."""
        out: list[tuple[str, Event]] = []
        for e in effects:
            subject, ev, count = published(
                e, cause, at, pool=self._settings.pool, policy=self._config.policy
            )
            out.append((subject, ev))
            counts.append(count)
        return out

    def _update_gauges(self) -> None:
        self.metrics.queued_jobs.set(self.scheduler.waiting_count)
        self.metrics.allocated_gpus.set(self.scheduler.allocated_gpus())
        self.metrics.set_capacity(self.scheduler.capacity_plans)


def _hostname() -> str:
    import socket

    return socket.gethostname()
