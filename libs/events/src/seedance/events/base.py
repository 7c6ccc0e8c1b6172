"""The base of every event: a time-ordered id and the moment it happened.

Owns the id scheme (UUIDv7, so ids sort by time and double as ``Nats-Msg-Id``). Must not know
about subjects or transport.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from datetime import datetime
from typing import Annotated

import msgspec

__all__ = ["Event", "EventId", "UtcDatetime", "derived_event_id", "new_event_id"]

#: A UUIDv7 in its canonical text form.
EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
#: A moment with its offset. A naive datetime is refused at decode (``Expected `datetime` with a
#: timezone component``): a tenant's ``at`` without one crash-looped the ledger once, and no
#: service can know which zone a naive time meant.
UtcDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


def new_event_id(unix_ms: int | None = None, *, at: datetime | None = None) -> str:
    """Return a new UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then randomness.

    The time is the caller's: ``at`` (the event's own ``at``, from the producer's injected
    clock, so a replay stamps ids in its virtual time) or ``unix_ms``. Without either the time
    bits are zero: the id is still unique (74 random bits) but sorts before time-stamped ones.
    This layer sits below ``seedance.core.clock`` and so never reads the wall clock itself; the
    time part is an ordering hint that no decision reads. Python 3.11 has no ``uuid.uuid7``,
    hence this small implementation.
    """
    if at is not None:
        unix_ms = int(at.timestamp() * 1000)
    ms = 0 if unix_ms is None else unix_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return _uuid_text(value)


def _uuid_text(value: int) -> str:
    """``str(uuid.UUID(int=value))`` without building the object (a collector builds one id
    per node per tick: half the cost of the id)."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def derived_event_id(
    cause_id: str, role: str, unix_ms: int | None = None, *, key: bytes | None = None
) -> str:
    """A UUIDv7 determined by the event that caused it and the effect's role.

    A service that re-publishes an effect after a crash (it published, then died before
    acknowledging the cause) gets the same id again, so the stream's de-duplication and the
    sinks' idempotency drop the repeat. The time bits are the cause's, so ids still sort by time;
    a cause that is not a UUID (a key such as the ledger's ``usage:<job>:<node>:<window>:r0``)
    takes ``unix_ms`` for them.

    ``key``: a secret of the publishing service's (`seedance.core.id_key`), for an effect
    published into a stream tenants write to. JetStream's duplicate window is per stream, so a
    tenant that could compute the id could publish it first on its own subject and have the
    service's event dropped as a duplicate; keyed (blake2b's keyed mode) it cannot, and the
    service's replicas and restarts, reading the same key, still derive the same id.
    """
    text = f"{cause_id}/{role}".encode()  # an empty key is blake2b's unkeyed hash
    digest = int.from_bytes(hashlib.blake2b(text, digest_size=10, key=key or b"").digest())
    if unix_ms is not None:
        ms = unix_ms
    elif _CANONICAL_UUID.fullmatch(cause_id):  # what uuid.UUID reads, without building one
        ms = int(cause_id[:8] + cause_id[9:13], 16)
    else:
        try:
            ms = uuid.UUID(cause_id).int >> 80
        except ValueError:
            ms = 0
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((digest >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= digest & ((1 << 62) - 1)
    # The slicer derives two ids per decision: uuid.UUID's parse and text were ~2 % of its time.
    return _uuid_text(value)


_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Fields every event carries.

    Attributes:
        id: unique, time-ordered (by the ``at`` its producer stamped it with); published as
            ``Nats-Msg-Id`` so a re-send inside the stream's duplicate window is dropped, and
            used by sinks to stay idempotent.
        at: when the fact happened (UTC, timezone-aware). For replayed fleets this is the
            replay's virtual time. On a tenant's own subjects it is a *claim*: the service
            that reads the request stamps it with the server's receive time (DESIGN, "A
            tenant's event is a request, never a fact").
    """

    id: EventId
    at: UtcDatetime
