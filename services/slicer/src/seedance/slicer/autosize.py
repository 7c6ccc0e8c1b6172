"""The slicer's automatic right-sizing on the bus: one active loop per pool, beside the slicer.

Reads `slicer-autosize` (the ledger's merged input `SEEDANCE_LEDGER_IN`: the slicer's own
placements, preemptions, releases and share changes, and the node agents' per-pod measured
shares, in the one order the ledger bills them in), steps
`seedance.slicer.core.autosize.Autosizer`, and publishes what it decides on the tenant's own
subjects: `ShareChanged` on `seedance.slicing.<t>.share` and, for a rollback, `ShareAlert` on
`seedance.slicing.<t>.alert`, naming the signal that tripped (`cost`, `slo` or `memory`).

Exactly once, as the slicer: one leader per pool holds `slicer-autosize.<pool>` (a lease in
`seedance-leases`); per batch the loop's state, the stream sequences applied and the batch's
events (an outbox) are written compare-and-set to `autosize.<pool>` in `seedance-slicer-state`
before anything is published or acknowledged; ids derive from the reading that caused them, so
a re-publish after a crash is a duplicate. A message the loop cannot take is dead-lettered
(`seedance.dlq.slicer`): a reading on another node's subject (`subject_mismatch`), dated more
than `max_ahead_s` past the server's receive time (`future_time`), or out of range
(`invalid_input`); anything it raises on is dead-lettered too (`apply_error`), after the batch
is decided again without it.

Runs in the slicer's process (`python -m seedance.slicer`) when a tenant opted in
(`SEEDANCE_SLICER_AUTOSIZE_TENANTS`); it shares the slicer's connection and NATS user. It must
not decide anything (the core does) nor touch the scheduler's state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from seedance.core import (
    Clock,
    Delivery,
    InvalidMessage,
    Lifecycle,
    RetryableError,
    ServiceRuntime,
)
from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.consumer import PullConsumer
from seedance.core.id_key import derived_id_key
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.logs import get_logger
from seedance.core.tasks import guarded
from seedance.events import Event, decode, encode
from seedance.events.base import derived_event_id
from seedance.events.slicing import (
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
    ShareAlert,
    ShareChanged,
    ShareChangeReason,
)
from seedance.events.subjects import consumer, slicing, telemetry
from seedance.events.telemetry import PodShares
from seedance.slicer.core.autosize import (
    MAX_AHEAD_S,
    AutosizeConfig,
    AutosizeEffect,
    Autosizer,
    GuardTripped,
    ShareReading,
)
from seedance.slicer.metrics import AutosizeMetrics
from seedance.slicer.settings import SlicerSettings

__all__ = [
    "AutosizeDurable",
    "AutosizeService",
    "autosize_config",
    "autosize_service",
    "with_autosize",
]

log = get_logger(__name__)

DURABLE = "slicer-autosize"
#: The scheduler's reader of the share changes this loop publishes (`seedance.slicer.service`).
SHARES_DURABLE = "slicer-shares"
#: Applied stream sequences remembered (a redelivery comes long before this many later ones).
APPLIED_KEPT = 4096


class AutosizeDurable(msgspec.Struct, kw_only=True):
    """The KV value `autosize.<pool>`: the loop's state, what it applied, its outbox."""

    core: bytes = b""
    applied: list[int] = msgspec.field(default_factory=list)
    floor: int = 0
    outbox: list[tuple[str, bytes]] = msgspec.field(default_factory=list)


def events_of(effect: AutosizeEffect, cause_id: str, *, key: bytes | None) -> tuple[str, Event]:
    """The wire event of one effect, its id derived from the reading that caused it, keyed
    with the slicer's secret (`key`, `seedance.core.id_key`): the reading's id is the node's,
    and a change reaches `SEEDANCE_LEDGER_IN`, where nodes' telemetry shares one duplicate
    window with it. No default: only a caller that says so (a test, ``key=None``) derives
    them unkeyed."""
    at = datetime.fromtimestamp(effect.at_s, UTC)
    if isinstance(effect, GuardTripped):
        role = f"share-alert/{effect.tenant}/{effect.job_id}"
        return slicing.subject(effect.tenant, "alert"), ShareAlert(
            id=derived_event_id(cause_id, role, key=key),
            at=at,
            job_id=effect.job_id,
            tenant=effect.tenant,
            node=effect.node,
            applied_milli=effect.applied_milli,
            restored_milli=effect.restored_milli,
            deviation_ppm=effect.deviation_ppm,
            bound_ppm=effect.bound_ppm,
            signal=effect.signal.value,
            detail=effect.detail[:1024],
            cause_id=cause_id,
        )
    role = f"share/{effect.tenant}/{effect.job_id}/{effect.reason}"
    return slicing.subject(effect.tenant, "share"), ShareChanged(
        id=derived_event_id(cause_id, role, key=key),
        at=at,
        job_id=effect.job_id,
        tenant=effect.tenant,
        node=effect.node,
        gpu_index=effect.gpu,
        from_milli=effect.from_milli,
        to_milli=effect.to_milli,
        reason=ShareChangeReason(effect.reason),
        detail=effect.detail[:1024],
        cause_id=cause_id,
        mem_limit_mib=effect.mem_limit_mib,
    )


class AutosizeService(Lifecycle):
    """The loop's shell (module docstring). `runtime` is the slicer's: this service binds its
    consumer on it but leaves the runtime's start, run and close to the slicer."""

    def __init__(
        self,
        runtime: ServiceRuntime,
        clock: Clock,
        config: AutosizeConfig,
        *,
        pool: str,
        replica: str,
        lease_ttl_s: float = 10.0,
        max_ahead_s: float = MAX_AHEAD_S,
        batch: int = 100,
    ) -> None:
        self._rt, self._clock, self._config = runtime, clock, config
        self._pool, self._replica, self._ttl = pool, replica, lease_ttl_s
        self._max_ahead_s = max_ahead_s
        self.autosizer = Autosizer(config)
        self.metrics = AutosizeMetrics(runtime.registry)
        self._durable = AutosizeDurable()
        self._state_rev: int | None = None
        self._unpublished: list[tuple[str, Event]] = []
        self._lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._kv: KeyValue | None = None
        self._id_key: bytes | None = None
        self._lease: Lease | None = None
        self._consumer: PullConsumer = runtime.consume(
            DURABLE,
            Placement | Preempted | JobReleased | ShareChanged | PodShares,
            batch_handler=self._handle,
            batch=batch,
            managed=False,
        )

    @property
    def _key(self) -> str:
        return f"autosize.{self._pool}"

    async def start(self) -> None:
        await self._rt.start()  # idempotent: the slicer's runtime, started once
        # The scheduler's reader of share changes starts at its creation (`deliver_new`): it
        # must exist before this loop publishes one, or the first change after the upgrade
        # could precede the slicer's first lead and be skipped there alone.
        await self._rt.bus.ensure_consumer(consumer(SHARES_DURABLE))
        self._kv = await ensure_bucket(self._rt.bus, "seedance-slicer-state")
        self._id_key = await derived_id_key(self._kv)  # the scheduler's, the same bucket
        leases = await ensure_bucket(self._rt.bus, "seedance-leases")
        self._lease = Lease(
            leases, f"slicer-autosize.{self._pool}", self._replica, self._clock, self._ttl
        )

    async def run(self) -> None:
        assert self._lease is not None
        # A keeper that fails ends the leading with its error: never a silent standby for good.
        await guarded(self._lead(), self._lease.keep())

    async def _lead(self) -> None:
        assert self._lease is not None
        poll_s = self._ttl / 6
        while not self._stopping.is_set():
            if not self._lease.held:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._lease.acquired.wait()
                continue
            await self._restore()
            self.metrics.leader.set(1)
            await self._consumer.start(self._rt.bus)
            task = asyncio.create_task(self._consumer.run())
            while self._lease.held and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._stopping.wait()
            self._consumer.stop()
            await task
            await self._consumer.close()  # unacked messages go to the next leader
            if self._stopping.is_set():
                await self._retire()
            self.metrics.leader.set(0)
            if not self._stopping.is_set():
                log.warning("slicer_autosize_leadership_lost", pool=self._pool)

    async def stop(self) -> None:
        self._stopping.set()
        self._consumer.stop()

    async def close(self) -> None:
        await self._consumer.close()
        if self._lease is not None:
            await self._lease.release()

    # --- state ------------------------------------------------------------------------------

    async def _restore(self) -> None:
        assert self._kv is not None
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            self._durable, self._state_rev = AutosizeDurable(), None
        else:
            self._durable = msgspec.msgpack.decode(entry.value or b"", type=AutosizeDurable)
            self._state_rev = entry.revision
        self.autosizer = Autosizer.from_bytes(self._config, self._durable.core)
        self._unpublished = [(s, decode(b)) for s, b in self._durable.outbox]
        with contextlib.suppress(RetryableError):
            await self._flush()  # else the first batch does
        log.info(
            "slicer_autosize_restored", pool=self._pool, tracked=len(self.autosizer.state.tracks)
        )

    async def _retire(self) -> None:
        """A graceful stop, still leading: the last batch's events are published, so the
        durable outbox is emptied and a successor re-sends nothing. Without this the successor
        re-sends that batch, and only the stream's duplicate window (2 minutes) keeps it from
        being stored twice: a handover later than that would publish it again. A crash keeps
        the outbox (re-sent with the same ids); so does a write that fails here (logged)."""
        if self._unpublished or not self._durable.outbox or self._lease is None:
            return
        if not self._lease.held:
            return
        try:
            await self._save(msgspec.structs.replace(self._durable, outbox=[]))
        except TRANSIENT_BUS_ERRORS as exc:  # a CAS refusal (deposed) among them
            log.warning("slicer_autosize_outbox_kept", pool=self._pool, error=repr(exc))

    async def _save(self, durable: AutosizeDurable) -> None:
        assert self._kv is not None
        data = msgspec.msgpack.encode(durable)
        if self._state_rev is None:
            self._state_rev = await self._kv.create(self._key, data)
        else:  # compare-and-set: a deposed leader's write fails
            self._state_rev = await self._kv.update(self._key, data, last=self._state_rev)
        self._durable = durable

    async def _flush(self) -> None:
        if not self._unpublished:
            return
        try:
            await self._rt.bus.publish_many(self._unpublished)
        except Exception as exc:
            raise RetryableError(f"autosize decisions not published: {exc!r}") from exc
        self._unpublished = []

    # --- handling ---------------------------------------------------------------------------

    async def _handle(self, ds: Sequence[Delivery[Any]]) -> list[BaseException | None]:
        async with self._lock:
            await self._flush()
            outcomes: list[BaseException | None] = [None] * len(ds)
            applied = set(self._durable.applied)
            fresh = [
                i
                for i, d in enumerate(ds)
                if d.stream_seq > self._durable.floor and d.stream_seq not in applied
            ]
            out = self._decide(ds, fresh, outcomes)
            if fresh:
                seqs = sorted({*self._durable.applied, *(ds[i].stream_seq for i in fresh)})
                floor = max(
                    self._durable.floor, seqs[-APPLIED_KEPT - 1] if len(seqs) > APPLIED_KEPT else 0
                )
                durable = AutosizeDurable(
                    core=self.autosizer.to_bytes(),
                    applied=[s for s in seqs if s > floor],
                    floor=floor,
                    outbox=[(s, encode(e)) for s, e in out],
                )
                try:
                    await self._save(durable)
                except Exception as exc:  # nothing published: back to the durable state
                    self.autosizer = Autosizer.from_bytes(self._config, self._durable.core)
                    raise RetryableError(f"autosize batch not made durable: {exc!r}") from exc
            self._count(out)
            self._unpublished = out
            await self._flush()
            return outcomes

    def _count(self, out: list[tuple[str, Event]]) -> None:
        """Metrics and logs of a batch's decisions, once they are durable."""
        self.metrics.tracked_jobs.set(len(self.autosizer.state.tracks))
        for _, ev in out:
            if isinstance(ev, ShareChanged):
                self.metrics.changes_total.labels(ev.reason.value).inc()
                log.info(
                    "slicer_share_changed",
                    tenant=ev.tenant,
                    job_id=ev.job_id,
                    node=ev.node,
                    from_milli=ev.from_milli,
                    to_milli=ev.to_milli,
                    reason=ev.reason.value,
                )
            elif isinstance(ev, ShareAlert):
                self.metrics.guard_trips_total.labels(ev.signal).inc()
                log.warning(
                    "slicer_share_rolled_back",
                    tenant=ev.tenant,
                    job_id=ev.job_id,
                    signal=ev.signal,
                    deviation_ppm=ev.deviation_ppm,
                    bound_ppm=ev.bound_ppm,
                )

    def _decide(
        self, ds: Sequence[Delivery[Any]], fresh: list[int], outcomes: list[BaseException | None]
    ) -> list[tuple[str, Event]]:
        """Step the fresh deliveries; one that raises is dead-lettered and the batch is decided
        again from the durable state without it (the core is deterministic)."""
        while True:
            out: list[tuple[str, Event]] = []
            failed = None
            for i in fresh:
                if outcomes[i] is not None:
                    continue
                try:
                    out.extend(self._step(ds[i]))
                except InvalidMessage as exc:  # refused before anything changed
                    outcomes[i] = exc
                except Exception as exc:  # a bug: the core may be half-changed
                    outcomes[i] = InvalidMessage(
                        f"applying {type(ds[i].event).__name__} {ds[i].event.id} raised {exc!r}"[
                            :1000
                        ],
                        kind="apply_error",
                    )
                    log.error(
                        "slicer_autosize_event_failed", error=repr(exc), stream_seq=ds[i].stream_seq
                    )
                    failed = i
                    break
            if failed is None:
                return out
            self.autosizer = Autosizer.from_bytes(self._config, self._durable.core)

    def _step(self, d: Delivery[Any]) -> list[tuple[str, Event]]:
        ev = d.event
        sizer = self.autosizer
        if isinstance(ev, Placement):
            gpus = [(g.index, g.milli) for g in ev.gpus] if ev.kind is PlacementKind.SHARED else []
            sizer.placed(ev.tenant, ev.job_id, ev.node, gpus)
            return []
        if isinstance(ev, Preempted | JobReleased):
            sizer.ended(ev.tenant, ev.job_id)
            return []
        if isinstance(ev, ShareChanged):
            # The scheduler's own (a rollback kept in part, given back later): the share it
            # holds. The loop's changes come back too; the tracker knows them by their
            # from_milli (core.autosize.Autosizer.share_set).
            sizer.share_set(ev.tenant, ev.job_id, ev.node, ev.gpu_index, ev.from_milli, ev.to_milli)
            return []
        if (key := self._id_key) is None:  # read at start, before the consumer runs
            raise RuntimeError("the slicer's derived-id key is read at start, before any change")
        readings = self._readings(d)
        out: list[tuple[str, Event]] = []
        for r in readings:
            out.extend(events_of(e, ev.id, key=key) for e in sizer.observe(r))
        return out

    def _readings(self, d: Delivery[PodShares]) -> list[ShareReading]:
        """The readings of one node's shares, checked whole before any is used."""
        ev = d.event
        if d.subject != telemetry.pod_share(ev.node):
            raise InvalidMessage(
                f"pod shares of node {ev.node!r} on {d.subject!r}: a node agent speaks for its "
                "own node only",
                kind="subject_mismatch",
            )
        if d.received_at is not None and (
            (ev.at - d.received_at).total_seconds() > self._max_ahead_s
        ):
            raise InvalidMessage(
                f"at={ev.at.isoformat()} is more than {self._max_ahead_s:g} s after the "
                f"server received it ({d.received_at.isoformat()})",
                kind="future_time",
            )
        start_s, at_s = ev.window_start.timestamp(), ev.at.timestamp()
        if at_s < start_s:
            raise InvalidMessage(
                f"window_start={ev.window_start.isoformat()} is after at={ev.at.isoformat()}",
                kind="invalid_input",
            )
        out = []
        for s in ev.shares:
            if not 0.0 <= s.sm_share <= 1.0:
                raise InvalidMessage(
                    f"shares[].sm_share={s.sm_share} not in [0, 1] (pod {s.pod_uid})",
                    kind="invalid_input",
                )
            if s.tenant and s.job_id:
                out.append(
                    ShareReading(
                        tenant=s.tenant,
                        job_id=s.job_id,
                        node=ev.node,
                        gpu=s.gpu_index,
                        sm_share=s.sm_share,
                        window_start_s=start_s,
                        at_s=at_s,
                        mem_used_mib=s.mem_used_mib,
                    )
                )
        return out


class _WithAutosize(Lifecycle):
    """The slicer and its right-sizing loop as one service (one process, one runtime)."""

    def __init__(self, slicer: Any, autosize: AutosizeService) -> None:
        self._slicer, self._autosize = slicer, autosize

    async def start(self) -> None:
        await self._slicer.start()
        await self._autosize.start()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._autosize.run())
            await self._slicer.run()
            await self._autosize.stop()

    async def stop(self) -> None:
        await self._autosize.stop()
        await self._slicer.stop()

    async def close(self) -> None:
        await self._autosize.close()
        await self._slicer.close()


def with_autosize(slicer: Any, autosize: AutosizeService | None) -> Any:
    """What `python -m seedance.slicer` serves: the slicer alone, or with the loop."""
    return slicer if autosize is None else _WithAutosize(slicer, autosize)


def autosize_config(settings: SlicerSettings) -> AutosizeConfig | None:
    """The loop's configuration from the slicer's settings; None when no tenant opted in."""
    tenants = frozenset(t.strip() for t in settings.autosize_tenants.split(",") if t.strip())
    if not tenants:
        return None
    return AutosizeConfig(
        tenants=tenants,
        bound=settings.autosize_bound,
        slo_bound=settings.autosize_slo_bound,
        min_history_s=settings.autosize_min_history_s,
        min_samples=settings.autosize_min_samples,
        guard_s=settings.autosize_guard_s,
        window_s=settings.autosize_window_s,
    )


def autosize_service(
    runtime: ServiceRuntime, clock: Clock, settings: SlicerSettings, replica: str
) -> AutosizeService | None:
    """The loop for `settings`' pool, or None when no tenant opted in."""
    config = autosize_config(settings)
    if config is None:
        return None
    return AutosizeService(
        runtime,
        clock,
        config,
        pool=settings.pool,
        replica=replica,
        lease_ttl_s=settings.lease_ttl_s,
    )
