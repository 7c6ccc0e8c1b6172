"""The slicer's durable state: the scheduler, what it applied and its outbox, written per batch.

Owns what a pool's leader keeps in JetStream KV and how (`SlicerState`): the scheduler's state
as entries (`seedance.slicer.core.entries`), the stream sequences applied per durable
(`seedance.core.applied`), the batch's decisions not yet published (the outbox), the replay
clock and the quota policy in force, all in one `seedance.core.state_store.StateStore` under
``pool.<pool>``: a batch commits what it changed, never the whole pool. Entries the shell adds
start with ``~`` (``~outbox``, ``~clock``, ``~quota``, and the applied sequences'); the others
are the scheduler's. It also owns reading the format older slicers wrote (`DurableState`: the
whole state deflated in the one key ``pool.<pool>``), which the first restore moves into the
store and deletes.

It must not decide anything or publish: the service (`seedance.slicer.service`) applies a
batch, calls `commit`, then publishes the outbox.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import msgspec

from seedance.core.applied import APPLIED_KEPT, AppliedSequences
from seedance.core.state_store import StateStore
from seedance.events import Event, decode, encode
from seedance.slicer.core import QuotaPolicy, Scheduler, SchedulerConfig

__all__ = [
    "APPLIED_KEPT",
    "ZLIB_MAGIC",
    "DurableState",
    "SlicerState",
    "pack_state",
    "unpack_state",
]


class DurableState(msgspec.Struct, kw_only=True):
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


#: A compressed one-key state starts with this (a msgpack map, as the oldest wrote, never does).
ZLIB_MAGIC = b"SDZ1"


def pack_state(snap: DurableState) -> bytes:
    """The one-key format as older slicers wrote it (kept to test the migration from it)."""
    return ZLIB_MAGIC + zlib.compress(msgspec.msgpack.encode(snap), 1)


def unpack_state(value: bytes) -> DurableState:
    if value.startswith(ZLIB_MAGIC):
        value = zlib.decompress(value[len(ZLIB_MAGIC) :])
    return msgspec.msgpack.decode(value, type=DurableState)


_enc = msgspec.msgpack.Encoder()
_outbox_dec = msgspec.msgpack.Decoder(list[tuple[str, bytes]])
_clock_dec = msgspec.msgpack.Decoder(float | None)
_quota_dec = msgspec.msgpack.Decoder(tuple[bytes | None, int])


class SlicerState:
    """The pool's state as the leader holds it, and its one durable copy.

    `load` restores it (migrating the one-key format), `commit` writes what a batch changed
    with the batch's `outbox`, `rollback` returns to what was last committed."""

    def __init__(
        self,
        store: StateStore,
        *,
        legacy_key: str,
        config: SchedulerConfig,
        parse_quota: Callable[[bytes | None], QuotaPolicy | None],
    ) -> None:
        self.store = store
        self._legacy_key = legacy_key
        self._config = config
        self._parse_quota = parse_quota
        self.quota_doc: bytes | None = None
        self.quota_revision = 0
        self.quota = parse_quota(None)
        self.scheduler = Scheduler(config, self.quota)
        self.applied = AppliedSequences()
        self.replay_now_s: float | None = None
        #: The latest trusted time any event was applied at (the decisions' latest time): a
        #: tenant's request never happens before it (`seedance.slicer.trusted_time`).
        self.decided_s: float | None = None
        #: Decisions made durable but not yet acknowledged by the stream.
        self.outbox: list[tuple[str, Event]] = []
        self._written: dict[str, object] = {
            "~outbox": [],
            "~clock": None,
            "~decided": None,
            "~quota": (None, 0),
        }

    async def load(self) -> None:
        """The pool's state from the store (empty when nothing was ever written)."""
        if await self.store.load():
            self._from_entries()
            if await self.store.take_legacy(self._legacy_key) is not None:
                await self.store.drop_legacy(self._legacy_key)  # a migration that stopped short
            return
        legacy = await self.store.take_legacy(self._legacy_key)
        if legacy is None:
            self._from_entries()
            return
        old = unpack_state(legacy)
        self.quota_doc, self.quota_revision = old.quota_doc, old.quota_revision
        self.quota = self._parse_quota(old.quota_doc)
        self.scheduler = Scheduler.from_bytes(old.engine, self._config, self.quota)
        self.applied = AppliedSequences.of(old.applied, old.floor)
        self.replay_now_s = old.replay_now_s
        self.decided_s = old.replay_now_s  # the one-key format kept no other time
        self.outbox = [(subj, decode(data)) for subj, data in old.outbox]
        entries = self.scheduler.state_entries()
        entries.update(self.applied.entries())
        entries.update({k: v for k, v in self._runtime_changes(force=True).items() if v})
        await self.store.install(entries)
        await self.store.drop_legacy(self._legacy_key)

    def rollback(self) -> None:
        """Back to the committed state (a batch that failed, or a policy not saved)."""
        self._from_entries()

    async def commit(self) -> None:
        """Write what changed since the last commit, with `outbox` (this batch's decisions).
        Raises `StateConflict` (another leader wrote first) or the bus's error; then nothing
        counts and `rollback` (or `load`, after a conflict) gives the state back."""
        changes = self.scheduler.state_changes()
        self.applied.trim()
        changes.update(self.applied.changes())
        changes.update(self._runtime_changes())
        await self.store.commit(changes)

    def _runtime_changes(self, *, force: bool = False) -> dict[str, bytes | None]:
        values: dict[str, object] = {
            "~outbox": [(subj, encode(ev)) for subj, ev in self.outbox],
            "~clock": self.replay_now_s,
            "~decided": self.decided_s,
            "~quota": (self.quota_doc, self.quota_revision),
        }
        out = {k: _enc.encode(v) for k, v in values.items() if force or v != self._written[k]}
        self._written = values
        return out  # type: ignore[return-value]

    def _from_entries(self) -> None:
        entries = self.store.entries
        quota = entries.get("~quota")
        self.quota_doc, self.quota_revision = _quota_dec.decode(quota) if quota else (None, 0)
        self.quota = self._parse_quota(self.quota_doc)
        own = {k: v for k, v in entries.items() if not k.startswith("~")}
        if own:
            self.scheduler = Scheduler.from_entries(own, self._config, self.quota)
        else:
            self.scheduler = Scheduler(self._config, self.quota)
        self.applied = AppliedSequences.from_entries(entries)
        clock = entries.get("~clock")
        self.replay_now_s = _clock_dec.decode(clock) if clock else None
        decided = entries.get("~decided")
        # A state written before "~decided" existed: its trusted clock is the best floor known.
        self.decided_s = _clock_dec.decode(decided) if decided else self.replay_now_s
        outbox = entries.get("~outbox")
        self.outbox = [(s, decode(d)) for s, d in _outbox_dec.decode(outbox)] if outbox else []
        self._written = {
            "~outbox": [(subj, encode(ev)) for subj, ev in self.outbox],
            "~clock": self.replay_now_s,
            "~decided": self.decided_s,
            "~quota": (self.quota_doc, self.quota_revision),
        }
