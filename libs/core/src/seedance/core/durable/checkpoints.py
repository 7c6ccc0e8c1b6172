"""Whole-state checkpoints at a stream sequence, moved forward only: the replicated services' form.

Owns the checkpoint protocol of a deterministic, active-active service (the cost-ledger: every
replica steps the same input stream in the same order and so holds equal states at equal
sequences): a snapshot's bytes in chunks under the writer's two slots (the one the head does not
name, so the current checkpoint is never overwritten), then the head key (sequence, where, a
digest) moved forward by compare-and-set. A head at or past the sequence is left alone (another
replica is there already); a reader checks the digest, so a slot reused while it read is noticed
and it reads the newer head. The key layout is the ledger's of before this module, so stored
checkpoints restore unchanged. It must not know what the bytes mean or decide when to write.

Keys, in the bucket: ``<key>`` the head (`CheckpointHead`, msgpack array);
``<key>.<writer>.<slot>.<i>`` chunk ``i``.

A head that does not decode, or chunks that fail the digest while the head stays as it was
(no writer reused the slot: they are not a writer's), are `CorruptState` naming the key (a
tenant once had the server write a publish ack over the ledger's head: review-reply p13, a raw
ValidationError and exit 1 at every restart). Never read past: the replica would restore an
older state, or none, and replay from there as if nothing were wrong.
"""

from __future__ import annotations

import hashlib

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from seedance.core.state_store import CorruptState

__all__ = ["CHUNK_BYTES", "CheckpointHead", "Checkpoints", "checkpoint_digest"]

#: A chunk is at most this many bytes: below the server's default 1 MiB message limit.
CHUNK_BYTES = 512 * 1024
#: Reads of a head and its chunks before giving up (each retry: a writer reused the slot).
_READS = 10
#: Compare-and-set attempts on the head before leaving it to the replica that moved it.
_CAS_ATTEMPTS = 5


class CheckpointHead(msgspec.Struct, array_like=True, frozen=True):
    """Where the latest checkpoint is: its input sequence, chunks' key prefix and digest."""

    seq: int
    chunks: int
    replica: str
    slot: int
    prefix: str
    digest: bytes
    revision: int = 0  # the head key's KV revision (not stored)


def checkpoint_digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class Checkpoints:
    """The checkpoints under `key` in `kv`, as `writer` reads and writes them."""

    def __init__(self, kv: KeyValue, key: str, writer: str, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._kv = kv
        self._key = key
        self._writer = writer
        self._chunk_bytes = chunk_bytes

    async def read(self) -> tuple[int, bytes] | None:
        """The latest checkpoint's sequence and bytes (None: none was written). `CorruptState`
        for a head that does not decode or chunks that are not the head's."""
        failed: tuple[int, list[bytes] | None] | None = None  # head revision, chunks read
        for _ in range(_READS):
            head = await self.head()
            if head is None:
                return None
            parts = await self._read_chunks(head)
            if parts is not None and checkpoint_digest(b"".join(parts)) == head.digest:
                return head.seq, b"".join(parts)
            if failed == (head.revision, parts):
                # The same head and the same chunks twice: no writer is reusing the slot
                # (that moves the head first), so what the head names is not a writer's.
                raise self._corrupt_chunks(head, parts)
            failed = (head.revision, parts)
            # The writer re-used that slot while we read it: a newer head is there, re-read.
        raise RuntimeError(f"{self._key}: no consistent checkpoint after {_READS} reads")

    async def head(self) -> CheckpointHead | None:
        """The stored head (None: none); `CorruptState` naming the key if it does not decode."""
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        try:
            head = msgspec.msgpack.decode(entry.value, type=CheckpointHead)
        except msgspec.DecodeError as exc:
            raise CorruptState(
                f"checkpoint key {self._key!r} does not decode ({exc}; {len(entry.value)} "
                f"bytes, starting {entry.value[:24]!r}): not a checkpoint head; restore or "
                "remove it"
            ) from None
        return msgspec.structs.replace(head, revision=entry.revision or 0)

    async def _read_chunks(self, head: CheckpointHead) -> list[bytes] | None:
        """The chunks ``head`` names (None: one is missing)."""
        parts = []
        for i in range(head.chunks):
            try:
                parts.append((await self._kv.get(f"{head.prefix}.{i}")).value or b"")
            except KeyNotFoundError:
                return None
        return parts

    def _corrupt_chunks(self, head: CheckpointHead, parts: list[bytes] | None) -> CorruptState:
        keys = f"{head.prefix}.0..{head.chunks - 1}"
        if parts is None:
            found = "one is missing"
        else:
            data = b"".join(parts)
            found = f"{len(data)} bytes, starting {data[:24]!r}, sizes {[len(p) for p in parts]}"
        return CorruptState(
            f"checkpoint key {self._key!r} names chunks {keys!r} that are not its checkpoint "
            f"(the digest does not match; {found}): restore or remove them and the head"
        )

    async def write(self, seq: int, data: bytes) -> bool:
        """`data` as the checkpoint at `seq` unless the stored one is as advanced; True if
        written. Raises the bus's error (nothing moved then: the head still names the last)."""
        head = await self.head()
        if head is not None and head.seq >= seq:
            return False  # another replica is there already (equal state at equal seq)
        slot = 1 - head.slot if head is not None and head.replica == self._writer else 0
        size = self._chunk_bytes
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        prefix = f"{self._key}.{self._writer}.{slot}"
        for i, chunk in enumerate(chunks):
            await self._kv.put(f"{prefix}.{i}", chunk)
        new = CheckpointHead(seq=seq, chunks=len(chunks), replica=self._writer, slot=slot,
                             prefix=prefix, digest=checkpoint_digest(data))  # fmt: skip
        value = msgspec.msgpack.encode(new)
        for _ in range(_CAS_ATTEMPTS):
            try:
                if head is None:
                    await self._kv.create(self._key, value)
                else:
                    await self._kv.update(self._key, value, last=head.revision)
            except KeyWrongLastSequenceError:
                head = await self.head()  # the other replica moved it: look again
                if head is not None and head.seq >= seq:
                    return False
                continue
            return True
        return False
