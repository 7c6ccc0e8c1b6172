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
"""

from __future__ import annotations

import hashlib

import msgspec
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

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
        """The latest checkpoint's sequence and bytes (None: none was written)."""
        for _ in range(_READS):
            head = await self.head()
            if head is None:
                return None
            data = await self._read_chunks(head)
            if data is not None:
                return head.seq, data
            # The writer re-used that slot while we read it: a newer head is there, re-read.
        raise RuntimeError(f"{self._key}: no consistent checkpoint after {_READS} reads")

    async def head(self) -> CheckpointHead | None:
        try:
            entry = await self._kv.get(self._key)
        except KeyNotFoundError:
            return None
        if not entry.value:
            return None
        head = msgspec.msgpack.decode(entry.value, type=CheckpointHead)
        return msgspec.structs.replace(head, revision=entry.revision or 0)

    async def _read_chunks(self, head: CheckpointHead) -> bytes | None:
        parts = []
        for i in range(head.chunks):
            try:
                parts.append((await self._kv.get(f"{head.prefix}.{i}")).value or b"")
            except KeyNotFoundError:
                return None
        data = b"".join(parts)
        return data if checkpoint_digest(data) == head.digest else None

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
