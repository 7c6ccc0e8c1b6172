"""The bridge's durable state: the pod jobs it submitted and has not ended (its job records), as a
`seedance.core.durable.DurableState`, and what the bridge publishes through it.

Owns the records (`BridgeRecords.records`: (tenant, job) -> the pod's creation time in ms, the
time bits of the job's event ids), how they follow the job events going out (`publish`: a submit
records its job, an end forgets it) and finding the recorded jobs whose pods are gone
(`orphans`, in the very records a new leader adopted its bound pods under, as restored).

The durable runtime commits the records with the events they came with (its outbox) *before*
publishing them, so a job is never submitted without its record (a new leader would not end it
when its pod went while no bridge ran) and a record is never forgotten without its end going
out; the events' ids are derived, so a re-sent outbox is a duplicate the bus drops.

Entries: ``r/<tenant>/<job>`` (tenants are tokens, so the first ``/`` after the tenant ends it).
Stored under ``_state.<lease name>`` in ``seedance-k8s-bridge-jobs`` (a Lease name never starts
with ``_``). Records older bridges wrote, one key each (``<lease>.<tenant>.<job>``, the job id's
``:`` written ``=``), are moved into the state on the first load and their keys deleted
(`load`); only keys of exactly two tokens after the scope: a Lease name may hold dots, and Lease
``a``'s listing ``a.>`` also holds Lease ``a.b``'s records (``a.b.<tenant>.<job>``). A bridge of
before this state must not run beside one of after it (it would not see the other's records):
upgrade all of a cluster's replicas together.

Must not decide what to publish or how an orphan ends (the tracker does), nor publish.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from seedance.core.durable import DurableState, Outbox
from seedance.core.logs import get_logger
from seedance.core.state_store import CorruptState, StateStore
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted
from seedance.k8s_bridge.core.tracked import JobKey
from seedance.k8s_bridge.core.tracker import Action, Tracker

__all__ = ["JOBS_BUCKET", "BridgeRecords", "state_key"]

log = get_logger(__name__)

JOBS_BUCKET = "seedance-k8s-bridge-jobs"
_ENDS = (JobFinished, JobFailed, JobCancelled)


def state_key(scope: str) -> str:
    """The state's key prefix in `JOBS_BUCKET` for the bridges of Lease ``scope``."""
    return f"_state.{scope}"


def _entry(key: JobKey) -> str:
    return f"r/{key[0]}/{key[1]}"


class BridgeRecords(DurableState):
    """The job records of the bridges of Lease ``scope`` (`load`, `commit`: the runtime's)."""

    def __init__(self, store: StateStore, *, scope: str) -> None:
        super().__init__(store)
        self._scope = scope
        self.records: dict[JobKey, int] = {}
        self._written: dict[JobKey, int] = {}

    def publish(self, items: Outbox) -> Outbox:
        """``items`` as the runtime's outbox, the records following them."""
        for _, ev in items:
            if isinstance(ev, JobSubmitted):
                self.records[(ev.tenant, ev.job_id)] = uuid.UUID(ev.id).int >> 80
            elif isinstance(ev, _ENDS):
                self.records.pop((ev.tenant, ev.job_id), None)
        return items

    def orphans(self, tracker: Tracker, now: datetime) -> list[Action]:
        """The ends of recorded jobs whose pods are gone (deleted while no bridge ran)."""
        live = tracker.live_jobs()
        out: list[Action] = [
            tracker.orphan_ended(job_id, tenant, created_ms, now)
            for (tenant, job_id), created_ms in self.records.items()
            if (tenant, job_id) not in live
        ]
        if out:
            log.warning("bridge_orphans_ended", jobs=len(out))
        return out

    # --- DurableState ---------------------------------------------------------------------

    def core_changes(self) -> dict[str, bytes | None]:
        changes: dict[str, bytes | None] = {
            _entry(k): str(v).encode() for k, v in self.records.items() if self._written.get(k) != v
        }
        changes.update({_entry(k): None for k in self._written if k not in self.records})
        self._written = dict(self.records)
        return changes

    def core_entries(self) -> dict[str, bytes]:
        self._written = dict(self.records)
        return {_entry(k): str(v).encode() for k, v in self.records.items()}

    def restore_core(self, entries: Mapping[str, bytes]) -> None:
        self.records = {}
        for key, value in entries.items():
            if key.startswith("r/"):
                tenant, _, job_id = key[2:].partition("/")
                self.records[(tenant, job_id)] = int(value or b"0")
        self._written = dict(self.records)

    async def load(self) -> None:
        """The state; on the first load (nothing stored yet) the one-key records of older
        bridges moved into it, their keys then deleted (also those a migration that stopped
        short left)."""
        await super().load()
        prefix = f"{self._scope}."
        old = {
            key: value
            for key, value in (await self.store.take_legacy_keys(self._scope)).items()
            if key.startswith(prefix) and key.removeprefix(prefix).count(".") == 1
        }  # another Lease's (dotted name) records are its own
        if not old:
            return
        if self.store.empty:
            for key, value in old.items():
                tenant, _, token = key.removeprefix(prefix).partition(".")
                self.records[(tenant, token.replace("=", ":"))] = _legacy_record(key, value)
            await self.store.install(self.core_entries())
        for key in old:
            await self.store.drop_legacy(key)


def _legacy_record(key: str, value: bytes) -> int:
    """An older bridge's record (its pod's creation time in ms, as digits), or `CorruptState`
    naming the key: not a bridge's write (the server once wrote its JSON answers on any key a
    tenant named as a reply, review-reply p10), refused rather than skipped."""
    try:
        return int(value or b"0")
    except ValueError:
        raise CorruptState(
            f"record key {key!r} is not a bridge's ({len(value)} bytes, starting "
            f"{value[:24]!r}): restore or remove it"
        ) from None
