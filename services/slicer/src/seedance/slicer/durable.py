"""The slicer's durable state: the one KV value a pool's leader writes after every batch.

Owns its format (`DurableState`: the scheduler's snapshot, the stream sequences applied per
durable, the batch's outbox, the replay clock and the quota policy in force) and its encoding
(`pack_state` / `unpack_state`: msgpack, deflated; an uncompressed value, as older slicers
wrote, still reads). It must not touch the KV or the bus, nor decide what goes in it: the
service (`seedance.slicer.service`) writes it compare-and-set and restores from it.
"""

from __future__ import annotations

import zlib

import msgspec

__all__ = ["APPLIED_KEPT", "ZLIB_MAGIC", "DurableState", "pack_state", "unpack_state"]

#: Applied sequences remembered per durable: a message redelivered after this many later ones
#: were applied would be taken for applied (redeliveries come within a second or so).
APPLIED_KEPT = 2048


class DurableState(msgspec.Struct, kw_only=True):
    #: The scheduler's snapshot (`Scheduler.to_bytes`); the key keeps the name deployed
    #: slicers wrote it under.
    engine: bytes
    #: Per durable, the stream sequences applied recently (at most `APPLIED_KEPT`) and the
    #: floor below which every message counts as applied. Not a single watermark: a batch
    #: that failed is redelivered *after* later messages were applied.
    applied: dict[str, list[int]] = msgspec.field(default_factory=dict)
    floor: dict[str, int] = msgspec.field(default_factory=dict)
    #: The decisions of the batch this snapshot ends with: (subject, encoded event).
    outbox: list[tuple[str, bytes]] = msgspec.field(default_factory=list)
    #: The latest trusted time seen (Unix seconds): a request's time with ``request_clock=replay``.
    replay_now_s: float | None = None
    #: The quota policy in force, as read from KV (None: the file's, ``quota_file``): the
    #: state was decided under it, so a restart and a standby restore it with the state.
    quota_doc: bytes | None = None
    quota_revision: int = 0


#: A compressed snapshot starts with this (a msgpack map, as older slicers wrote, never does).
ZLIB_MAGIC = b"SDZ1"


def pack_state(snap: DurableState) -> bytes:
    """The snapshot as written to the KV: msgpack, deflated at level 1 (about 3.7x smaller for
    a pool of 1,800 running jobs, ~10 ms), so that a pool stays well under the server's
    ``max_payload`` (1 MiB by default), which every KV value must fit in."""
    return ZLIB_MAGIC + zlib.compress(msgspec.msgpack.encode(snap), 1)


def unpack_state(value: bytes) -> DurableState:
    if value.startswith(ZLIB_MAGIC):
        value = zlib.decompress(value[len(ZLIB_MAGIC) :])
    return msgspec.msgpack.decode(value, type=DurableState)
