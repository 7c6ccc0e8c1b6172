"""A service core's state in a JetStream KV bucket: a journal of commits and a compacted base.

Owns the durable form of a keyed state (entries: ``str -> bytes``, whatever the core makes of
them) and the protocol that keeps it exactly once: each commit (one batch's changed entries, set
or deleted) is appended to a journal, compare-and-set, so a commit costs what changed and a
deposed writer's commit fails instead of overwriting; when the journal grows past a bound the
whole map is written as a new base in the background and the journal restarts from it, so a
restore reads one base and a bounded journal. It must not know what the entries mean, decide
what goes in a commit, or publish anything but its own keys.

Keys, under ``<prefix>.`` in the bucket (``prefix`` is one or more key tokens):

* ``head``: which base is current (`Head`: its generation slot, chunk count, token, and the
  last journal record it includes; `_CLAIM`: none yet, a writer's claim before its first);
* ``b.<g>.<i>``: chunk ``i`` of the base in generation slot ``g`` (0 or 1: a new base goes to
  the slot the head does not name, so the current one is never overwritten);
* ``j.<s>``: journal record ``n`` with ``n % slots == s``. Slots are reused, never deleted: a
  record is written compare-and-set on the revision of the record it replaces (``slots``
  records earlier, already in the base), so a KV that only ever overwrites keeps no markers
  and needs no purge, and a writer whose idea of the journal is stale fails.

Exactly once: a commit is one record, or several consecutive records of which only the last is
marked complete when its changes do not fit one message, each stamped with the commit's token;
a journal ending in an incomplete group was a commit that never finished (its batch was not
acknowledged) and is ignored, its slots overwritten by the next commit. A group whose records
carry two tokens is ignored likewise: a commit that rewrote the first records of an earlier
one whose last record landed unacknowledged (a bus error: the writer did not reload) and then
failed, which read as one group would be a mixture of two commits (records written before the
token have none, and read as before). Every write is compare-and-set on a revision this writer
read or wrote, so two writers (a deposed leader that has not noticed yet) can never both
succeed at the same point of the history: the loser gets `StateConflict`, reloads and finds
the other's commit. A base is a cache of the journal up to its record, so whichever writer
compacts, the result is the same; its chunks carry the base's token, and a restore that finds
one that does not match fails loudly rather than reading a mixture. A writer claims the head
before it writes a chunk (the head rewritten as it read it, compare-and-set), so the next head
to name the slot can only be its own: a deposed writer whose base is under way when another
loads, and whose head lands after, can no longer have the other overwrite the chunks that head
names (the other's claim fails instead: it reloads; review2's finding). Keys stay bounded (two
base slots): a base keyed by its token would leave a delete marker per chunk behind for good.

Costs (why these bounds): a record is deflated msgpack of the changed entries; a base is
written when the journal holds `compact_records` records or as many bytes as the base (so a
restore never reads more journal than base), in chunks of at most `part_bytes`, yielding to
the event loop between chunks; at `slots` records the commit waits for the base instead,
since the next record would overwrite one the base does not hold yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.errors import SeedanceError, StartRefused
from seedance.core.kv import ensure_bucket, live_keys
from seedance.core.logs import get_logger

__all__ = [
    "CorruptState",
    "Head",
    "StateConflict",
    "StateStore",
    "StoreStats",
    "decode_record",
    "encode_records",
]

log = get_logger(__name__)
_T = TypeVar("_T")

#: A chunk or record is at most this many bytes (deflated), under NATS' default 1 MiB payload
#: with room for the headers.
PART_BYTES = 900 * 1024
#: Journal slots a restore reads at once: one round trip each, gathered (767 one by one took
#: 0.29-0.32 s on a local server), without holding many records in flight.
_WINDOW = 64


class StateConflict(SeedanceError):
    """Another writer changed the state since this one read it: reload before writing again."""


class CorruptState(StartRefused):
    """A stored key of the state does not decode (not one of this store's writes: a tenant
    once had the cost-ledger write an allocation answer over the slicer's journal). Not
    transient, and never skipped (the state would be silently short): the service refuses to
    run on it, naming the key, for an operator to restore or remove."""


def _decoded(key: str, data: bytes, decode: Callable[[bytes], _T]) -> _T:
    """``decode(data)``, or `CorruptState` naming ``key`` (a broken deflate or msgpack)."""
    try:
        return decode(data)
    except (zlib.error, msgspec.DecodeError) as exc:
        raise CorruptState(
            f"state key {key!r} does not decode ({exc}; {len(data)} bytes, starting "
            f"{data[:24]!r}): not this store's write; restore or remove it"
        ) from None


class Head(msgspec.Struct, frozen=True, kw_only=True):
    gen: int
    chunks: int
    token: str
    #: The last journal record the base includes (-1: none).
    upto: int


class _Record(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    n: int
    #: False on all records of a commit but its last.
    complete: bool
    set: dict[str, bytes]
    delete: list[str]
    #: The commit's token, the same on each of its records (random, 32 bits: it only tells a
    #: commit from the one whose records it overwrote; 0: written before tokens).
    token: int = 0


class _Chunk(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    token: str
    index: int
    entries: dict[str, bytes]


#: The head a writer claims when there is none yet (its first base goes to slot ``1 - gen`` =
#: 0). It names one chunk of slot 1 with a token no base has (tokens are 16 hex digits), so a
#: release before the claim (3abadc0d: any head is a found state) that reads it raises
#: `StateConflict` (a missing or foreign chunk) instead of restoring an empty state and
#: dropping the legacy key a cut-short migration left (review-3 finding 5). This module
#: reads it, or a claim naming no chunks (what store-fix wrote), as no head.
_CLAIM = Head(gen=1, chunks=1, token="claim", upto=-1)


def _claimed(head: Head) -> bool:
    return head.token == _CLAIM.token or head.chunks == 0


_enc = msgspec.msgpack.Encoder()
_record_dec = msgspec.msgpack.Decoder(_Record)
_chunk_dec = msgspec.msgpack.Decoder(_Chunk)
_head_dec = msgspec.msgpack.Decoder(Head)


def encode_records(
    first: int,
    changes: Mapping[str, bytes | None],
    part_bytes: int = PART_BYTES,
    *,
    token: int = 0,
) -> list[bytes]:
    """The deflated records of one commit, numbered from `first`, each stamped `token`: one
    when the changes fit `part_bytes`, else consecutive ones, only the last marked complete."""
    items = list(changes.items())
    groups = [items]
    while True:
        out: list[bytes] = []
        split: list[list[tuple[str, bytes | None]]] = []
        for i, group in enumerate(groups):
            rec = _Record(
                n=first + i,
                complete=i == len(groups) - 1,
                set={k: v for k, v in group if v is not None},
                delete=[k for k, v in group if v is None],
                token=token,
            )
            data = zlib.compress(_enc.encode(rec), 1)
            if len(data) > part_bytes and len(group) > 1:
                split.extend((group[: len(group) // 2], group[len(group) // 2 :]))
            else:
                if len(data) > part_bytes:
                    raise ValueError(f"entry {group[0][0]!r} alone is over {part_bytes} bytes")
                split.append(group)
                out.append(data)
        if len(split) == len(groups):
            return out
        groups = split


def decode_record(data: bytes) -> _Record:
    return _record_dec.decode(zlib.decompress(data))


@dataclass(slots=True)
class StoreStats:
    """What the last commit and the last base cost (for metrics and the benches)."""

    commit_bytes: int = 0
    commit_s: float = 0.0
    bases: int = 0
    base_bytes: int = 0
    base_s: float = 0.0
    journal_records: int = 0
    journal_bytes: int = 0


class StateStore:
    """The state under `prefix` in the KV bucket `bucket` (`kv`, its handle). `load` first (it
    says whether anything was there), then `commit` per batch; `entries` is the committed map.
    Every writer of a prefix must use the same `slots`."""

    def __init__(
        self,
        kv: KeyValue,
        prefix: str,
        *,
        slots: int = 1024,
        # A restore reads up to `compact_records` records after the base; a service whose
        # base is costly passes more (the slicer: `seedance.core.durable.DurableSpec`).
        compact_records: int = 256,
        part_bytes: int = PART_BYTES,
    ) -> None:
        if not 2 <= compact_records < slots:
            raise ValueError(f"compact_records={compact_records} must be in 2..slots-1")
        self._kv = kv
        self._prefix = prefix
        self._slots = slots
        self._compact_records = compact_records
        self._part_bytes = part_bytes
        self.entries: dict[str, bytes] = {}
        self.stats = StoreStats()
        self._revs: dict[str, int] = {}
        self._head: Head | None = None
        self._next = 0  # the next record's number
        self._sizes: dict[int, int] = {}  # bytes of each record after the base, by number
        self._base_bytes = 0
        self._compacting: asyncio.Task[None] | None = None
        self._conflict: StateConflict | None = None

    @classmethod
    async def open(cls, bus: Bus, bucket: str, prefix: str, **kw: int) -> StateStore:
        """The store under `prefix` in the catalogue's bucket `bucket` (created if needed)."""
        return cls(await ensure_bucket(bus, bucket), prefix, **kw)

    # -- keys -------------------------------------------------------------------------------
    def _key(self, *tokens: object) -> str:
        return ".".join((self._prefix, *(str(t) for t in tokens)))

    @property
    def journal_records(self) -> int:
        """Records written since the current base."""
        upto = self._head.upto if self._head is not None else -1
        return self._next - 1 - upto

    @property
    def _journal_bytes(self) -> int:
        return sum(self._sizes.values())

    # -- restore ----------------------------------------------------------------------------
    async def load(self) -> bool:
        """Read the base and the journal after it into `entries`; False when nothing is stored
        under the prefix (the map is then empty). Raises `StateConflict` when a base chunk
        does not belong to the head (two writers compacted at once; read again).

        The state is read by name (the head, its chunks, then journal slots in order until one
        is empty or holds an older record), never from a listing: a listing taken while another
        writer overwrites keys can miss one, and a missed head would read as no state at all.
        The listing gives only the revisions the next writes name (a key it missed or saw
        old makes a write fail, never succeed wrongly). A revision is never read just before
        the write that names it: that would make any writer's write succeed."""
        await self._stop_compacting()
        # Until this load is done, no commit: one after a load that failed (a key that does
        # not decode) wrote from record 0 over the committed journal, on revisions it had
        # noted (found with review-reply p12's case: a `transact` after the refused batch).
        self._conflict = StateConflict("the last load failed: load again before writing")
        self._revs = await self._revisions()
        self.entries = {}
        self._head = None
        self._next = 0
        self._sizes = {}
        self._base_bytes = 0
        head_key = self._key("head")
        entry = await self._get(head_key)
        if entry is not None and not _claimed(
            head := _decoded(head_key, entry.value or b"", _head_dec.decode)
        ):
            self._head = head
            await self._read_base(head)
            self._next = head.upto + 1
        found = self._head is not None
        found = await self._read_journal() or found
        self.stats.journal_records = self.journal_records
        self.stats.journal_bytes = self._journal_bytes
        self._conflict = None
        return found

    async def _read_journal(self) -> bool:
        """Apply the journal's complete commits after the base (from `_next`) to `entries`;
        whether it held any record. `_next` ends at the first record the next commit writes."""
        found = False
        # Journal records after the base, in order, until a slot holds an older record; read
        # `_WINDOW` slots at a time (one round trip each, gathered; the first slot alone, so
        # an empty journal costs one read), used as if one by one: a slot past where that
        # stops neither notes a revision nor fails the load.
        pending: dict[str, bytes | None] = {}
        group: int | None = None  # the token of the commit being read (None: between two)
        first_open = self._next
        n = self._next
        window = 1
        ended = False
        while not ended:
            keys = [self._key("j", (n + i) % self._slots) for i in range(window)]
            got = await asyncio.gather(*(self._fetch(k) for k in keys), return_exceptions=True)
            window = min(_WINDOW, self._slots)
            for key, slot in zip(keys, got, strict=True):
                if isinstance(slot, BaseException):
                    raise slot  # a slot the one-by-one read reaches
                # Only the slots a one-by-one read would reach give a revision (the one where
                # it stops included): later ones keep the listing's.
                self._noted(key, slot)
                if slot is None:
                    ended = True
                    break
                data = slot.value or b""
                rec = _decoded(key, data, decode_record)
                if rec.n != n or (group is not None and rec.token != group):
                    ended = True  # an older record, or another commit's in this one's group
                    break
                group = rec.token
                found = True
                self._sizes[n] = len(data)
                pending.update(rec.set)
                pending.update(dict.fromkeys(rec.delete))
                n += 1
                if rec.complete:
                    _apply(self.entries, pending)
                    pending = {}
                    group = None
                    first_open = n
        # An incomplete group at the end never committed: the next commit overwrites it.
        self._next = first_open
        self._sizes = {k: v for k, v in self._sizes.items() if k < first_open}
        return found

    async def _get(self, key: str) -> KeyValue.Entry | None:
        """The latest value of `key` (None: never written), its revision noted for the next
        write of it."""
        entry = await self._fetch(key)
        self._noted(key, entry)
        return entry

    async def _fetch(self, key: str) -> KeyValue.Entry | None:
        """The latest value of `key` (None: never written); its revision not noted."""
        try:
            return await self._kv.get(key)
        except KeyNotFoundError:
            return None

    def _noted(self, key: str, entry: KeyValue.Entry | None) -> None:
        """Note `entry`'s revision as the next write of `key` names it (0: none was read)."""
        if entry is None:
            self._revs[key] = 0
        else:
            self._note_rev(key, entry)

    def _rev(self, key: str) -> int:
        """The revision the next write of `key` names: as this writer last read or wrote it
        (0: it saw none)."""
        return self._revs.get(key, 0)

    async def _revisions(self) -> dict[str, int]:
        """Every key under the prefix and its revision (`seedance.core.kv.live_keys`: metadata
        only, never nats-py's keys(), which can return part of them)."""
        return await live_keys(self._kv, self._prefix)

    async def _read_base(self, head: Head) -> None:
        keys = [self._key("b", head.gen, i) for i in range(head.chunks)]
        values = await asyncio.gather(*(self._get(k) for k in keys))
        for i, entry in enumerate(values):
            if entry is None:
                raise StateConflict(f"base chunk {keys[i]} named by the head is missing")
            data = entry.value or b""
            chunk = _decoded(keys[i], data, lambda d: _chunk_dec.decode(zlib.decompress(d)))
            if chunk.token != head.token or chunk.index != i:
                raise StateConflict(
                    f"base chunk {keys[i]} is {chunk.token}/{chunk.index}, the head names "
                    f"{head.token}/{i}: two writers compacted at once"
                )
            self._base_bytes += len(data)
            self.entries.update(chunk.entries)

    def _note_rev(self, key: str, entry: KeyValue.Entry) -> None:
        """Write after what was read: the revision is what the next write of `key` names."""
        if entry.revision is not None:
            self._revs[key] = entry.revision

    # -- writing ----------------------------------------------------------------------------
    async def commit(self, changes: Mapping[str, bytes | None]) -> None:
        """Append one commit (entries set, or deleted with None); `entries` follows once it is
        durable. Raises `StateConflict` when another writer wrote first (nothing of this
        commit counts then), or the bus's error (it may or may not have landed: reload)."""
        if self._conflict is not None:
            raise self._conflict
        if not changes:
            return
        started = time.perf_counter()
        if self.journal_records + 1 >= self._slots:
            # The next record would overwrite one no base holds yet: the base first.
            await self._stop_compacting(wait=True)
            if self.journal_records + 1 >= self._slots:
                await self._compact_now()
        records = encode_records(self._next, changes, self._part_bytes, token=secrets.randbits(32))
        for i, data in enumerate(records):
            key = self._key("j", (self._next + i) % self._slots)
            try:
                self._revs[key] = await self._kv.update(key, data, last=self._rev(key))
            except KeyWrongLastSequenceError as exc:
                raise StateConflict(f"journal slot {key} was written by another writer") from exc
        for i, data in enumerate(records):
            self._sizes[self._next + i] = len(data)
        self._next += len(records)
        size = sum(len(r) for r in records)
        _apply(self.entries, changes)
        self.stats.commit_bytes = size
        self.stats.commit_s = time.perf_counter() - started
        self.stats.journal_records = self.journal_records
        self.stats.journal_bytes = self._journal_bytes
        if self._due() and (self._compacting is None or self._compacting.done()):
            # The map as of this record: later commits go on while the base is written.
            self._compacting = asyncio.create_task(
                self._compact(dict(self.entries), self._next - 1, background=True)
            )

    def _due(self) -> bool:
        return self.journal_records >= self._compact_records or (
            self._journal_bytes > max(self._base_bytes, 4 * self._part_bytes)
        )

    async def install(self, entries: Mapping[str, bytes]) -> None:
        """Make `entries` the state, written as a base now (a state migrated from an older
        format into an empty store)."""
        if not self.empty:
            raise StateConflict(f"{self._prefix} already holds a state: install is for a new one")
        self.entries = dict(entries)
        await self._compact_now()

    async def _compact_now(self) -> None:
        await self._stop_compacting(wait=True)
        if self._conflict is not None:
            raise self._conflict
        await self._compact(dict(self.entries), self._next - 1)
        if self._conflict is not None:
            raise self._conflict

    async def _compact(
        self, entries: dict[str, bytes], upto: int, *, background: bool = False
    ) -> None:
        """Claim the head, write `entries` (the map as of record `upto`) as a base in the slot
        the head does not name, then point the head at it. In the background a bus error
        leaves the old base current (the next commit tries again); in the foreground it is
        raised."""
        started = time.perf_counter()
        # The claim: the head as read (none yet: `_CLAIM`, so the first base goes to slot 0),
        # compare-and-set. Whoever names the slot next must write the head on the revision
        # this leaves, which only this writer holds.
        claim = self._head or _CLAIM
        gen = 1 - claim.gen
        token = secrets.token_hex(8)
        size = 0
        try:
            key = self._key("head")
            self._revs[key] = await self._kv.update(key, _enc.encode(claim), last=self._rev(key))
            chunks = 0
            for part in _chunked(entries, self._part_bytes):
                data = zlib.compress(
                    _enc.encode(_Chunk(token=token, index=chunks, entries=part)), 1
                )
                key = self._key("b", gen, chunks)
                self._revs[key] = await self._kv.update(key, data, last=self._rev(key))
                size += len(data)
                chunks += 1  # each write is an await: batches run between the chunks
            new = Head(gen=gen, chunks=chunks, token=token, upto=upto)
            key = self._key("head")
            self._revs[key] = await self._kv.update(key, _enc.encode(new), last=self._rev(key))
        except KeyWrongLastSequenceError:
            self._conflict = StateConflict("another writer wrote a base: this one is stale")
            log.warning("state_base_conflict", prefix=self._prefix)
            return
        except TRANSIENT_BUS_ERRORS as exc:
            if not background:
                raise
            log.warning("state_base_not_written", prefix=self._prefix, error=repr(exc))
            return
        self._head = new
        self._base_bytes = size
        # The journal after the base: what was written while it was being written.
        self._sizes = {n: b for n, b in self._sizes.items() if n > upto}
        self.stats.bases += 1
        self.stats.base_bytes = size
        self.stats.base_s = time.perf_counter() - started
        log.info(
            "state_base_written", prefix=self._prefix, chunks=chunks, bytes=size, upto=upto,
            entries=len(entries), seconds=round(self.stats.base_s, 3),
        )  # fmt: skip

    async def _stop_compacting(self, *, wait: bool = False) -> None:
        task, self._compacting = self._compacting, None
        if task is None:
            return
        if not wait:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        """Stop a base being written (it is written again by whoever commits next)."""
        await self._stop_compacting()

    # -- older formats ----------------------------------------------------------------------
    @property
    def empty(self) -> bool:
        """Nothing was ever written under the prefix (as of the last `load`; a claim without a
        base is nothing)."""
        return self._head is None and self._next == 0

    async def take_legacy_keys(self, prefix: str) -> dict[str, bytes]:
        """Every live key under `prefix` and its value (an older format's keys, one a record:
        `prefix` must not be this store's own)."""
        out: dict[str, bytes] = {}
        for key in await live_keys(self._kv, prefix):
            with contextlib.suppress(KeyNotFoundError):  # deleted since the listing
                out[key] = (await self._kv.get(key)).value or b""
        return out

    async def take_legacy(self, key: str) -> bytes | None:
        """The value of `key` (an older format's one key), None when absent."""
        try:
            entry = await self._kv.get(key)
        except KeyNotFoundError:
            return None
        return entry.value or b""

    async def drop_legacy(self, key: str) -> None:
        """Delete the older format's key once its state is in a base here."""
        with contextlib.suppress(KeyNotFoundError):
            await self._kv.delete(key)


def _apply(entries: dict[str, bytes], changes: Mapping[str, bytes | None]) -> None:
    for k, v in changes.items():
        if v is None:
            entries.pop(k, None)
        else:
            entries[k] = v


def _chunked(entries: Mapping[str, bytes], part_bytes: int) -> Iterable[dict[str, bytes]]:
    """The map in pieces of about `part_bytes` raw bytes (deflate only shrinks them)."""
    part: dict[str, bytes] = {}
    size = 0
    for k, v in entries.items():
        if part and size + len(k) + len(v) > part_bytes:
            yield part
            part, size = {}, 0
        part[k] = v
        size += len(k) + len(v) + 8
    if part or not entries:
        yield part
