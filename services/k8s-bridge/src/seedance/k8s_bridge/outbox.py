"""The bridge's job events on their way to the bus, and its KV records of live jobs.

Owns: the outbox of job events not yet published (kept across failed publishes, retried at the
next flush: their ids are derived, so a repeat is a duplicate the bus drops), the job records in
KV (``seedance-k8s-bridge-jobs``: each submitted job is recorded before its submit goes out and
forgotten once its end went out), reading them back when the bridge takes the lead, and finding
the recorded jobs whose pods are gone.

A record is (tenant, job) and names the pods it covers (`seedance.k8s_bridge.core.records`
owns its key and value): a restarted bridge adopts a bound pod by it, never by the pod's
annotation. A recorded job is live only when a live pod's job has both its tenant and its id.
Records the bridge wrote before pods' jobs had a space of their own (``<lease>.<tenant>.<pod
uid>``) read back as that bare uid: a pod still bound under it keeps it live; a pod that was
waiting was submitted anew under ``k8s:<uid>``, so its old job is an orphan and is ended
(cancelled), which is the migration.

Must not: decide what to publish or how an orphan ends (the tracker does), or publish anything
but what it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from nats.js.kv import KeyValue

from seedance.core import ServiceRuntime
from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.errors import NoStream
from seedance.core.kv import ensure_bucket
from seedance.core.logs import get_logger
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted
from seedance.k8s_bridge.core.records import (
    JobRecord,
    decode_record,
    encode_record,
    record_key,
    split_key,
)
from seedance.k8s_bridge.core.tracker import Action, Publish, Tracker
from seedance.k8s_bridge.metrics import BridgeMetrics

__all__ = ["JOBS_BUCKET", "JobOutbox"]

log = get_logger(__name__)

JOBS_BUCKET = "seedance-k8s-bridge-jobs"
_ENDS = (JobFinished, JobFailed, JobCancelled)
#: What a publish raises when the bus is down or refusing for now (the outbox keeps the events).
_PUBLISH_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_BUS_ERRORS, NoStream)


class JobOutbox:
    """Job events waiting to be published, and the job records. ``scope`` is the lease name:
    it names the cluster's bridges, so bridges of two clusters on one bus keep apart records."""

    def __init__(self, runtime: ServiceRuntime, metrics: BridgeMetrics, *, scope: str) -> None:
        self._rt = runtime
        self._metrics = metrics
        self._scope = scope
        self._items: list[Publish] = []
        self._kv: KeyValue | None = None

    async def start(self) -> None:
        """Open (or create) the records' bucket; the runtime's bus must be connected."""
        self._kv = await ensure_bucket(self._rt.bus, JOBS_BUCKET)

    def add(self, items: list[Publish]) -> None:
        self._items.extend(items)

    async def flush(self) -> None:
        """Record, publish, forget; on a transient bus failure keep the events for next time."""
        if not self._items:
            self._metrics.outbox.set(0)
            return
        items, self._items = self._items, []
        try:
            await self._record(items)
            await self._rt.bus.publish_many([(a.subject, a.event) for a in items])
            await self._forget(items)
        except _PUBLISH_ERRORS as exc:
            self._items = items + self._items  # the executor tries again within a second
            log.warning("bridge_publish_failed", events=len(items), error=repr(exc))
        self._metrics.outbox.set(len(self._items))

    async def records(self) -> list[JobRecord]:
        """Every job record of this scope (read when taking the lead, before the tracker is
        built from the cache: adoption needs them)."""
        assert self._kv is not None
        out: list[JobRecord] = []
        watcher = await self._kv.watch(f"{self._scope}.>", ignore_deletes=True)
        try:
            # The current values, then None (nats-py's end of the initial values).
            async for entry in watcher:
                if entry is None:
                    break
                if entry.operation is not None:  # a delete or purge marker
                    continue
                key = split_key(self._scope, entry.key)
                if key is not None:
                    out.append(decode_record(*key, entry.value))
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py's own
        return out

    def orphans(self, tracker: Tracker, records: list[JobRecord], now: datetime) -> list[Action]:
        """The ends of recorded jobs whose pods are gone (deleted while no bridge ran)."""
        live = tracker.live_jobs()
        out: list[Action] = [
            tracker.orphan_ended(r.job_id, r.tenant, r.created_ms, now)
            for r in records
            if (r.tenant, r.job_id) not in live
        ]
        if out:
            log.warning("bridge_orphans_ended", jobs=len(out))
        return out

    async def _record(self, items: list[Publish]) -> None:
        """Record each job before its submit goes out (a record without a job costs an end the
        slicer answers; a job without a record could outlive its pod unseen)."""
        assert self._kv is not None
        kv = self._kv
        await asyncio.gather(
            *(
                kv.put(self._key(a.record.tenant, a.record.job_id), encode_record(a.record))
                for a in items
                if isinstance(a.event, JobSubmitted) and a.record is not None
            )
        )

    def _key(self, tenant: str, job_id: str) -> str:
        return record_key(self._scope, tenant, job_id)

    async def _forget(self, items: list[Publish]) -> None:
        """Drop the records of jobs whose end went out."""
        assert self._kv is not None
        kv = self._kv
        ends = [a.event for a in items if isinstance(a.event, _ENDS)]
        await asyncio.gather(*(kv.delete(self._key(ev.tenant, ev.job_id)) for ev in ends))
