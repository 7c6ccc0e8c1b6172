"""A stateful service's durable state: its core's entries, what it applied, what it owes.

Owns what one commit holds (`DurableState`): the entries its core changed (a subclass says which:
`core_changes`, `core_entries`, `restore_core`), the stream sequences the commit applied
(`seedance.core.applied`: keys ``~applied/...`` and ``~floor/...``) and the effects decided
and not yet published (the outbox, key ``~outbox``), written as one
`seedance.core.state_store.StateStore` commit, so the state, the inputs it includes and the
effects it owes are durable together or not at all. Also reading a format written before the
store (``legacy_key``, a subclass's `migrate`), moved into the store on the first load.

Entries a core adds should not start with ``~applied/``, ``~floor/`` or ``~outbox``. It must not
decide or publish anything: `seedance.core.durable.runtime` applies batches, commits, then
publishes the outbox.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from seedance.core.applied import AppliedSequences
from seedance.core.state_store import StateStore
from seedance.events import Event, decode, encode

__all__ = ["OUTBOX_KEY", "DurableState", "Outbox"]

#: The entry holding the outbox: (subject, encoded event) pairs.
OUTBOX_KEY = "~outbox"

#: Effects as they are published: (subject, event), the event's id its ``Nats-Msg-Id``.
Outbox = list[tuple[str, Event]]

_enc = msgspec.msgpack.Encoder()
_outbox_dec = msgspec.msgpack.Decoder(list[tuple[str, bytes]])


def _encode_outbox(outbox: Outbox) -> bytes:
    return _enc.encode([(subject, encode(ev)) for subject, ev in outbox])


class DurableState:
    """The state a leader holds and its one durable copy.

    `load` restores it (migrating a legacy format), `commit` writes what changed since the last
    commit with the `outbox`, `rollback` returns to what was last committed. A subclass holds
    the core and maps it to entries."""

    def __init__(self, store: StateStore, *, legacy_key: str | None = None) -> None:
        self.store = store
        self._legacy_key = legacy_key
        self.applied = AppliedSequences()
        #: Effects made durable but not yet acknowledged by their stream.
        self.outbox: Outbox = []
        self._outbox_written = _encode_outbox([])

    # --- the core's part ----------------------------------------------------------------------

    def core_changes(self) -> dict[str, bytes | None]:
        """The core's entries changed since the last call (None: deleted)."""
        raise NotImplementedError

    def core_entries(self) -> dict[str, bytes]:
        """Every entry of the core (a first base)."""
        raise NotImplementedError

    def restore_core(self, entries: Mapping[str, bytes]) -> None:
        """The core as `entries` (the store's whole map; empty: nothing was ever written)."""
        raise NotImplementedError

    async def restore_core_async(self, entries: Mapping[str, bytes]) -> None:
        """`restore_core` as a leader's `load` runs it. A core whose rebuild is long CPU work
        overrides this to do that work off the event loop, so that the tasks beside it (the
        lease's refresh) keep running; by default, `restore_core` in place."""
        self.restore_core(entries)

    def migrate(self, legacy: bytes) -> None:
        """The state (core, `applied`, `outbox`) from the value under ``legacy_key``."""
        raise NotImplementedError(f"{type(self).__name__} reads no legacy format")

    # --- the runtime's part -------------------------------------------------------------------

    async def load(self) -> None:
        """The state from the store (empty when nothing was ever written)."""
        key = self._legacy_key
        if await self.store.load():
            entries = self.store.entries
            await self.restore_core_async(entries)
            self._restore_runtime(entries)
            if key is not None and await self.store.take_legacy(key) is not None:
                await self.store.drop_legacy(key)  # a migration that stopped short
            return
        legacy = await self.store.take_legacy(key) if key is not None else None
        if legacy is None:
            self._restore({})
            return
        self.migrate(legacy)
        entries = self.core_entries()
        entries.update(self.applied.entries())
        self._outbox_written = _encode_outbox(self.outbox)
        entries[OUTBOX_KEY] = self._outbox_written
        await self.store.install(entries)
        if key is not None:
            await self.store.drop_legacy(key)

    def rollback(self) -> None:
        """Back to the committed state (a batch that failed, or a change not saved)."""
        self._restore(self.store.entries)

    async def commit(self) -> None:
        """Write what changed since the last commit, with `outbox`. Raises `StateConflict`
        (another writer wrote first) or the bus's error; then nothing counts, and `rollback`
        (or `load`, after a conflict) gives the committed state back."""
        changes = self.core_changes()
        self.applied.trim()
        changes.update(self.applied.changes())
        outbox = _encode_outbox(self.outbox)
        if outbox != self._outbox_written:
            changes[OUTBOX_KEY] = outbox
            self._outbox_written = outbox
        await self.store.commit(changes)

    def _restore(self, entries: Mapping[str, bytes]) -> None:
        self.restore_core(entries)
        self._restore_runtime(entries)

    def _restore_runtime(self, entries: Mapping[str, bytes]) -> None:
        """The runtime's part of the state (applied sequences, outbox) from `entries`."""
        self.applied = AppliedSequences.from_entries(entries)
        data = entries.get(OUTBOX_KEY)
        self.outbox = [(s, decode(d)) for s, d in _outbox_dec.decode(data)] if data else []
        self._outbox_written = _encode_outbox(self.outbox)
