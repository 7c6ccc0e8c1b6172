"""The slicer's durable state: the scheduler, its clocks and its quota policy, as entries.

Owns how a pool's state maps onto the entries of the durable runtime's store (`SlicerState`, a
`seedance.core.durable.DurableState` under ``pool.<pool>``): the scheduler's state
(`seedance.slicer.core.entries`), the replay clock (``~clock``), the latest trusted time decided
at (``~decided``) and the quota policy in force (``~quota``); the runtime adds the applied
sequences and the outbox to the same commit. A batch commits what it changed, never the whole
pool. It also owns reading the format older slicers wrote (`LegacyState`: the whole state
deflated in the one key ``pool.<pool>``), which the first restore moves into the store.

It must not decide anything or publish: `seedance.core.durable.DurableRuntime` applies a batch
(through `seedance.slicer.decider`), commits, then publishes the outbox.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from seedance.core.applied import APPLIED_KEPT, AppliedSequences
from seedance.core.durable import DurableRuntime, DurableState
from seedance.core.state_store import StateStore
from seedance.events import decode
from seedance.slicer.core import QuotaPolicy, Scheduler, SchedulerConfig

__all__ = [
    "APPLIED_KEPT",
    "COMPACT_RECORDS",
    "ZLIB_MAGIC",
    "LegacyState",
    "SlicerState",
    "pack_state",
    "slicer_state",
    "unpack_state",
]


class LegacyState(msgspec.Struct, kw_only=True):
    """The one KV value slicers wrote before the store (read once, to migrate)."""

    #: The scheduler's snapshot (`Scheduler.to_bytes`).
    engine: bytes
    applied: dict[str, list[int]] = msgspec.field(default_factory=dict)
    floor: dict[str, int] = msgspec.field(default_factory=dict)
    #: The decisions of the batch this snapshot ends with: (subject, encoded event).
    outbox: list[tuple[str, bytes]] = msgspec.field(default_factory=list)
    replay_now_s: float | None = None
    quota_doc: bytes | None = None
    quota_revision: int = 0


#: Journal records between two bases of the pool's state (`StateStore`'s ``compact_records``,
#: its default 256). A base costs the whole map (2.9 MB deflated, ~0.2 s at the x4 fleet's
#: 44,634 jobs) and a batch's record ~1-2 KB: 768 records between bases is a third of that cost
#: per commit (and of the commits slowed while one is written), leaving 256 of the 1,024 slots
#: for the commits made while it is written; a restore reads up to 767 records after the base.
COMPACT_RECORDS = 768

#: A compressed one-key state starts with this (a msgpack map, as the oldest wrote, never does).
ZLIB_MAGIC = b"SDZ1"


def pack_state(snap: LegacyState) -> bytes:
    """The one-key format as older slicers wrote it (kept to test the migration from it)."""
    return ZLIB_MAGIC + zlib.compress(msgspec.msgpack.encode(snap), 1)


def unpack_state(value: bytes) -> LegacyState:
    if value.startswith(ZLIB_MAGIC):
        value = zlib.decompress(value[len(ZLIB_MAGIC) :])
    return msgspec.msgpack.decode(value, type=LegacyState)


class _Restored(NamedTuple):
    quota_doc: bytes | None
    quota_revision: int
    quota: QuotaPolicy | None
    scheduler: Scheduler
    replay_now_s: float | None
    decided_s: float | None


_enc = msgspec.msgpack.Encoder()
_clock_dec = msgspec.msgpack.Decoder(float | None)
_quota_dec = msgspec.msgpack.Decoder(tuple[bytes | None, int])


class SlicerState(DurableState):
    """The pool's state as the leader holds it (`load`, `commit`, `rollback`: the runtime's)."""

    def __init__(
        self,
        store: StateStore,
        *,
        legacy_key: str,
        config: SchedulerConfig,
        parse_quota: Callable[[bytes | None], QuotaPolicy | None],
    ) -> None:
        super().__init__(store, legacy_key=legacy_key)
        self._config = config
        self._parse_quota = parse_quota
        self.quota_doc: bytes | None = None
        self.quota_revision = 0
        self.quota = parse_quota(None)
        self.scheduler = Scheduler(config, self.quota)
        self.replay_now_s: float | None = None
        #: The latest trusted time any event was applied at (the decisions' latest time): no
        #: decision is made before it (`decide_at`; `seedance.slicer.trusted_time`).
        self.decided_s: float | None = None
        self._written: dict[str, object] = self._own_values()

    def decide_at(self, at: datetime) -> datetime:
        """When decisions caused at `at` are made: never before the latest time decided at,
        whatever caused them (a tenant's request, a node fact, a quota change, a round), which
        is then `at`. Every job's submit was decided at, so nothing it causes (its placement:
        billing's start and the move limit's) is stamped before the job was asked for; nor a
        release (billing's end) before the placement it ends."""
        if self.decided_s is not None and self.decided_s > at.timestamp():
            return datetime.fromtimestamp(self.decided_s, UTC)
        self.decided_s = at.timestamp()
        return at

    def _own_values(self) -> dict[str, object]:
        return {
            "~clock": self.replay_now_s,
            "~decided": self.decided_s,
            "~quota": (self.quota_doc, self.quota_revision),
        }

    def core_changes(self) -> dict[str, bytes | None]:
        changes = self.scheduler.state_changes()
        values = self._own_values()
        changes.update({k: _enc.encode(v) for k, v in values.items() if v != self._written[k]})
        self._written = values
        return changes

    def core_entries(self) -> dict[str, bytes]:
        entries = self.scheduler.state_entries()
        self._written = self._own_values()
        entries.update({k: _enc.encode(v) for k, v in self._written.items()})
        return entries

    def restore_core(self, entries: Mapping[str, bytes]) -> None:
        self._take(self._restored(entries))

    async def restore_core_async(self, entries: Mapping[str, bytes]) -> None:
        """The restore a new leader runs: the scheduler rebuilt in a worker thread (~0.14 ms
        a running job: 7 s at 50,000), so that the event loop keeps refreshing the lease
        meanwhile (it waits at most the interpreter's switch interval, 5 ms, for the GIL);
        the rebuilt state is taken on the loop, at once, so nothing reads half of it."""
        self._take(await asyncio.to_thread(self._restored, entries))

    def _restored(self, entries: Mapping[str, bytes]) -> _Restored:
        """The pool's state as `entries` hold it (touches nothing of this object's)."""
        quota_entry = entries.get("~quota")
        doc, revision = _quota_dec.decode(quota_entry) if quota_entry else (None, 0)
        quota = self._parse_quota(doc)
        own = {k: v for k, v in entries.items() if not k.startswith("~")}
        if own:
            scheduler = Scheduler.from_entries(own, self._config, quota)
        else:
            scheduler = Scheduler(self._config, quota)
        clock = entries.get("~clock")
        replay_now_s = _clock_dec.decode(clock) if clock else None
        decided = entries.get("~decided")
        # A state written before "~decided" existed: its trusted clock is the best floor known.
        decided_s = _clock_dec.decode(decided) if decided else replay_now_s
        return _Restored(doc, revision, quota, scheduler, replay_now_s, decided_s)

    def _take(self, r: _Restored) -> None:
        self.quota_doc, self.quota_revision, self.quota = r.quota_doc, r.quota_revision, r.quota
        self.scheduler, self.replay_now_s, self.decided_s = r.scheduler, r.replay_now_s, r.decided_s
        self._written = self._own_values()

    def migrate(self, legacy: bytes) -> None:
        old = unpack_state(legacy)
        self.quota_doc, self.quota_revision = old.quota_doc, old.quota_revision
        self.quota = self._parse_quota(old.quota_doc)
        self.scheduler = Scheduler.from_bytes(old.engine, self._config, self.quota)
        self.applied = AppliedSequences.of(old.applied, old.floor)
        self.replay_now_s = old.replay_now_s
        self.decided_s = old.replay_now_s  # the one-key format kept no other time
        self.outbox = [(subj, decode(data)) for subj, data in old.outbox]


def slicer_state(durable: DurableRuntime | None) -> SlicerState:
    """The pool's state as ``durable`` holds it (bound at its start)."""
    assert durable is not None, "bind() first"
    state = durable.state
    assert isinstance(state, SlicerState)
    return state
