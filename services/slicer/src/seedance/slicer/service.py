"""The slicer service: job events and inventory in; placements and reasons out.

One leader per node pool (a lease in JetStream KV) consumes; standbys wait for the lease to
lapse. After every batch the scheduler's state is written to KV *before* the batch is acked,
together with the last stream sequence applied per consumer, so a restarted leader resumes
exactly where the durable state ends: a redelivered message that the snapshot already includes
is acked without being applied again. Decisions get ids derived from their cause, so one that
was published just before a crash and is published again after it is dropped as a duplicate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from prometheus_client import Counter, Gauge

from seedance.core import Clock, Delivery, Lifecycle, RetryableError, ServiceRuntime
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.logs import get_logger
from seedance.events import Event, derived_event_id
from seedance.events.cost import PauseRequest
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobStarted, JobSubmitted
from seedance.events.slicing import (
    GpuAssignment,
    Placement,
    PlacementKind,
    Unschedulable,
    UnschedulableReason,
)
from seedance.events.subjects import slicing
from seedance.events.telemetry import GpuHealth, NodeInventory
from seedance.slicer.firstfit import Decision, FirstFitScheduler, JobRequest, SchedulerState
from seedance.slicer.settings import SlicerSettings

__all__ = ["SlicerMetrics", "SlicerService"]

log = get_logger(__name__)


class SlicerMetrics:
    def __init__(self, registry: Any) -> None:
        self.decisions_total = Counter(
            "seedance_slicer_decisions_total",
            "Scheduling decisions by outcome and reason.",
            ["outcome", "reason"],
            registry=registry,
        )
        self.queued_jobs = Gauge("seedance_slicer_queued_jobs", "Jobs waiting.", registry=registry)
        self.allocated_gpus = Gauge(
            "seedance_slicer_allocated_gpus", "GPUs allocated (shares summed).", registry=registry
        )
        self.leader = Gauge(
            "seedance_slicer_leader", "1 while this replica leads its pool.", registry=registry
        )


class _Snapshot(msgspec.Struct, kw_only=True):
    state: SchedulerState
    last_seq: dict[str, int] = msgspec.field(default_factory=dict)


class SlicerService(Lifecycle):
    def __init__(self, runtime: ServiceRuntime, clock: Clock, settings: SlicerSettings) -> None:
        self._rt = runtime
        self._clock = clock
        self._settings = settings
        self.metrics = SlicerMetrics(runtime.registry)
        self.scheduler = FirstFitScheduler()
        self._last_seq: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._state_kv: KeyValue | None = None
        self._state_rev: int | None = None
        self._lease: Lease | None = None
        self._consumers = [
            runtime.consume(
                "slicer-inventory",
                NodeInventory | GpuHealth,
                batch_handler=self._batch("slicer-inventory"),
                batch=settings.batch,
                managed=False,
            ),
            runtime.consume(
                "slicer-pauses",
                PauseRequest,
                batch_handler=self._batch("slicer-pauses"),
                batch=settings.batch,
                managed=False,
            ),
            runtime.consume(
                "slicer-jobs",
                JobSubmitted | JobStarted | JobFinished | JobFailed | JobCancelled,
                batch_handler=self._batch("slicer-jobs"),
                batch=settings.batch,
                managed=False,
            ),
        ]

    @property
    def _key(self) -> str:
        return f"pool.{self._settings.pool}"

    async def start(self) -> None:
        await self._rt.start()
        self._state_kv = await ensure_bucket(self._rt.bus, "seedance-slicer-state")
        leases = await ensure_bucket(self._rt.bus, "seedance-leases")
        holder = self._settings.replica or _hostname()
        self._lease = Lease(
            leases, f"slicer.{self._settings.pool}", holder, self._clock, self._settings.lease_ttl_s
        )

    async def run(self) -> None:
        assert self._lease is not None
        async with asyncio.TaskGroup() as tg:
            keeper = tg.create_task(self._lease.keep())
            runtime_task = tg.create_task(self._rt.run())
            await self._lease.acquired.wait()
            self.metrics.leader.set(1)
            await self._restore()
            for c in self._consumers:
                await c.start(self._rt.bus)
            consumer_tasks = [tg.create_task(c.run()) for c in self._consumers]
            await runtime_task
            for c in self._consumers:
                c.stop()
            await asyncio.gather(*consumer_tasks)
            keeper.cancel()

    async def stop(self) -> None:
        for c in self._consumers:
            c.stop()
        await self._rt.stop()

    async def close(self) -> None:
        for c in self._consumers:
            await c.close()
        if self._lease is not None:
            await self._lease.release()
        await self._rt.close()

    # --- state ------------------------------------------------------------------------------

    async def _restore(self) -> None:
        assert self._state_kv is not None
        try:
            entry = await self._state_kv.get(self._key)
        except KeyNotFoundError:
            return
        snap = msgspec.msgpack.decode(entry.value or b"", type=_Snapshot)
        self.scheduler = FirstFitScheduler(snap.state)
        self._last_seq = snap.last_seq
        self._state_rev = entry.revision
        log.info(
            "slicer_state_restored",
            jobs=len(snap.state.allocations),
            queued=len(snap.state.queue),
            nodes=len(snap.state.nodes),
        )

    async def _save(self) -> None:
        assert self._state_kv is not None
        data = msgspec.msgpack.encode(
            _Snapshot(state=self.scheduler.state, last_seq=self._last_seq)
        )
        if self._state_rev is None:
            self._state_rev = await self._state_kv.put(self._key, data)
        else:
            # Compare-and-set: a second leader (a split brain) cannot overwrite silently.
            self._state_rev = await self._state_kv.update(self._key, data, last=self._state_rev)

    # --- handling ---------------------------------------------------------------------------

    def _batch(self, durable: str) -> Any:
        async def handle(ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
            async with self._lock:
                before = msgspec.msgpack.encode(self.scheduler.state)
                last_before = dict(self._last_seq)
                try:
                    effects: list[tuple[str, Event]] = []
                    for d in ds:
                        if d.stream_seq <= self._last_seq.get(durable, 0):
                            continue  # already in the snapshot: a redelivery after a crash
                        effects.extend(self._apply(d.event))
                        self._last_seq[durable] = d.stream_seq
                    await self._rt.bus.publish_many(effects)
                    await self._save()
                except Exception as exc:
                    # Roll back to the durable state; the batch is redelivered.
                    self.scheduler = FirstFitScheduler(
                        msgspec.msgpack.decode(before, type=SchedulerState)
                    )
                    self._last_seq = last_before
                    raise RetryableError(f"slicer batch not made durable: {exc!r}") from exc
            self._update_gauges()
            return [None] * len(ds)

        return handle

    def _apply(self, ev: Any) -> list[tuple[str, Event]]:
        if isinstance(ev, NodeInventory):
            gpus = ev.gpus
            placed = self.scheduler.upsert_node(
                ev.node, gpus[0].model if gpus else "", ev.cpu_milli, ev.memory_mib, len(gpus)
            )
            return self._effects(placed, ev)
        if isinstance(ev, GpuHealth):
            node = self.scheduler.state.nodes.get(ev.node)
            if node is not None and ev.gpu_index < len(node.healthy):
                node.healthy[ev.gpu_index] = ev.healthy
            return []
        if isinstance(ev, PauseRequest):
            return self._effects(self.scheduler.set_paused(ev.tenant, ev.paused), ev)
        if isinstance(ev, JobSubmitted):
            r = ev.request
            req = JobRequest(
                job_id=ev.job_id,
                tenant=ev.tenant,
                priority=ev.priority,
                gpus=r.gpus * r.gang_size,
                gpu_milli=r.gpu_milli,
                gpu_models=r.gpu_models,
                cpu_milli=r.cpu_milli,
                memory_mib=r.memory_mib,
                cause_id=ev.id,
            )
            return self._effects(self.scheduler.submit(req), ev)
        if isinstance(ev, JobFinished | JobFailed | JobCancelled):
            return self._effects(self.scheduler.release(ev.job_id), ev)
        return []  # JobStarted: nothing to decide

    def _effects(self, decisions: list[Decision], cause: Event) -> list[tuple[str, Event]]:
        out: list[tuple[str, Event]] = []
        for d in decisions:
            req = d.request
            if d.placed:
                kind = (
                    PlacementKind.CPU
                    if req.gpus == 0
                    else PlacementKind.SHARED
                    if req.gpu_milli < 1000
                    else PlacementKind.WHOLE
                )
                ev: Event = Placement(
                    id=derived_event_id(req.cause_id, "placement"),
                    at=cause.at,
                    job_id=req.job_id,
                    tenant=req.tenant,
                    node=d.node,
                    pool=self._settings.pool,
                    gpu_model=d.gpu_model,
                    kind=kind,
                    gpus=[GpuAssignment(index=i, milli=m) for i, m in d.shares],
                    cpu_milli=req.cpu_milli,
                    memory_mib=req.memory_mib,
                    policy="first-fit",
                    cause_id=req.cause_id,
                )
                out.append((slicing.subject(req.tenant, "placement"), ev))
                self.metrics.decisions_total.labels("placed", "fits").inc()
            else:
                ev = Unschedulable(
                    id=derived_event_id(cause.id, f"unschedulable/{req.job_id}"),
                    at=cause.at,
                    job_id=req.job_id,
                    tenant=req.tenant,
                    reason=UnschedulableReason(d.reason),
                    detail=d.detail,
                    cause_id=req.cause_id,
                )
                out.append((slicing.subject(req.tenant, "unschedulable"), ev))
                self.metrics.decisions_total.labels("waiting", d.reason).inc()
        return out

    def _update_gauges(self) -> None:
        st = self.scheduler.state
        self.metrics.queued_jobs.set(len(st.queue))
        used = sum(m for a in st.allocations.values() for _, m in a.shares)
        self.metrics.allocated_gpus.set(used / 1000)


def _hostname() -> str:
    import socket

    return socket.gethostname()
