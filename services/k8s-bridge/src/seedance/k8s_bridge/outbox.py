"""The bridge's job events on their way to the bus, and its KV record of live jobs.

Owns: the outbox of job events not yet published (kept across failed publishes, retried at the
next flush: their ids are derived, so a repeat is a duplicate the bus drops), the job records in
KV (``seedance-k8s-bridge-jobs``: each submitted job is recorded before its submit goes out and
forgotten once its end went out), and finding the recorded jobs whose pods are gone.

A record is (tenant, job): key ``<lease name>.<tenant>.<job>``, the job id's ``:`` written
``=`` (a KV key may hold neither ``:`` nor, in a job id, a ``.``; ``=`` is in no job id, so the
key reads back to the very id). A recorded job is live only when a live pod's job has both its
tenant and its id. Records the bridge wrote before pods' jobs had a space of their own
(``<lease>.<tenant>.<pod uid>``) read back as that bare uid: a pod still bound under it keeps
it live; a pod that was waiting was submitted anew under ``k8s:<uid>``, so its old job is an
orphan and is ended (cancelled), which is the migration.

A bridge taking the lead reads the records (``records``) before it looks at any pod: a bound
pod is taken over only under the job recorded for it (`seedance.k8s_bridge.core.adoption`),
and the orphans are found in that same listing (``orphans``).

Must not: decide what to publish or how an orphan ends (the tracker does), or publish anything
but what it was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from seedance.core import ServiceRuntime
from seedance.core.bus import TRANSIENT_BUS_ERRORS
from seedance.core.errors import NoStream
from seedance.core.kv import ensure_bucket, live_keys
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted
from seedance.k8s_bridge.core.tracked import JobKey
from seedance.k8s_bridge.core.tracker import Action, Tracker
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
        self._items: list[tuple[str, Event]] = []
        self._kv: KeyValue | None = None

    async def start(self) -> None:
        """Open (or create) the records' bucket; the runtime's bus must be connected."""
        self._kv = await ensure_bucket(self._rt.bus, JOBS_BUCKET)

    def add(self, items: list[tuple[str, Event]]) -> None:
        self._items.extend(items)

    async def flush(self) -> None:
        """Record, publish, forget; on a transient bus failure keep the events for next time."""
        if not self._items:
            self._metrics.outbox.set(0)
            return
        items, self._items = self._items, []
        try:
            await self._record(items)
            await self._rt.bus.publish_many(items)
            await self._forget(items)
        except _PUBLISH_ERRORS as exc:
            self._items = items + self._items  # the executor tries again within a second
            log.warning("bridge_publish_failed", events=len(items), error=repr(exc))
        self._metrics.outbox.set(len(self._items))

    async def records(self) -> list[JobKey]:
        """The (tenant, job) of every recorded job of this cluster's bridges: all of them
        (`seedance.core.kv.live_keys`, not nats-py's keys(), which can return part of them:
        a restarted bridge would then refuse a live bound pod and end its job)."""
        assert self._kv is not None
        scope = f"{self._scope}."
        out = []
        for key in await live_keys(self._kv, self._scope):
            tenant, _, token = key.removeprefix(scope).partition(".")
            out.append((tenant, token.replace("=", ":")))
        return out

    async def orphans(
        self, tracker: Tracker, records: Iterable[JobKey], now: datetime
    ) -> list[Action]:
        """The ends of the ``records`` (the listing the take-over adopted pods under, not a
        second one) whose pods are gone (deleted while no bridge ran)."""
        assert self._kv is not None
        live = tracker.live_jobs()
        out: list[Action] = []
        for tenant, job_id in records:
            if (tenant, job_id) in live:
                continue
            with contextlib.suppress(KeyNotFoundError):  # its end went out since
                entry = await self._kv.get(self._job_key_of(tenant, job_id))
                created_ms = int(entry.value or b"0")
                out.append(tracker.orphan_ended(job_id, tenant, created_ms, now))
        if out:
            log.warning("bridge_orphans_ended", jobs=len(out))
        return out

    async def _record(self, items: list[tuple[str, Event]]) -> None:
        """Record each job before its submit goes out (a record without a job costs an end the
        slicer answers; a job without a record could outlive its pod unseen). The value is the
        pod's creation time in ms, the time bits of the job's event ids."""
        assert self._kv is not None
        kv = self._kv
        await asyncio.gather(
            *(
                kv.put(self._job_key(ev), str(uuid.UUID(ev.id).int >> 80).encode())
                for _, ev in items
                if isinstance(ev, JobSubmitted)
            )
        )

    def _job_key(self, ev: Any) -> str:
        return self._job_key_of(ev.tenant, ev.job_id)

    def _job_key_of(self, tenant: str, job_id: str) -> str:
        """``<lease name>.<tenant>.<job>`` (the job id's ``:`` as ``=``: a KV key's alphabet)."""
        return f"{self._scope}.{tenant}.{job_id.replace(':', '=')}"

    async def _forget(self, items: list[tuple[str, Event]]) -> None:
        """Drop the records of jobs whose end went out."""
        assert self._kv is not None
        kv = self._kv
        ends = [ev for _, ev in items if isinstance(ev, _ENDS)]
        await asyncio.gather(*(kv.delete(self._job_key(ev)) for ev in ends))
