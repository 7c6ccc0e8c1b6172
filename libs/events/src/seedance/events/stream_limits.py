"""What each stream of the catalogue may hold: its byte reservation and, where tenants write,
the largest message it takes.

Owns these figures and the reasons for them; ``seedance.events.subjects`` puts them on its
streams. It must not declare a stream, subject or consumer, nor connect to a server.

Why every stream is bounded (security audit F2): a stream without ``max_bytes`` reserves
nothing and grows into the server's whole ``max_file_store``; one tenant publishing 1 MiB junk
on its own ``seedance.jobs.<t>.submitted`` filled it, and from then every write of the
deployment (other tenants' requests, the slicer's placements, the ledger's entries, even
telemetry with its own reservation) was refused until an operator purged it. A stream with
``max_bytes`` reserves it at creation and cannot grow past it, so one stream filling stops
writes to that stream only. The sum of the reservations (`RESERVED_BYTES`, with the object
stores') must fit the shipped servers' ``max_file_store`` (tests/unit/deploy/test_images.py).

Streams tenants write to (``SEEDANCE_JOBS``, ``SEEDANCE_GRAPH``) refuse new messages when
full (``discard_new``) rather than evict the oldest: eviction would drop other tenants'
requests not yet handled. A tenant can still fill its share of such a stream and block every
tenant's NEW requests there until retention or an operator's purge; per-tenant NATS accounts
with JetStream limits would bound one tenant's bytes, and are not done (docs/security.md).
"""

from __future__ import annotations

__all__ = ["JOB_EVENT_MAX_BYTES", "LIMITS", "StreamLimit"]

from typing import NamedTuple

_KIB = 1024
_MIB = 1024**2
_GIB = 1024**3

#: The largest message ``SEEDANCE_JOBS`` takes. The largest valid job event is 21,230 bytes
#: (`job.submitted.v1` with 64 labels of 256 characters, the most `seedance.events.jobs`
#: validates: security audit p4); 64 KiB is three times that, room for the headers (trace
#: context, ``Nats-Msg-Id``) and a new field, and 1/16 of the server's 1 MiB ``max_payload``.
JOB_EVENT_MAX_BYTES = 64 * _KIB


class StreamLimit(NamedTuple):
    max_bytes: int
    max_msg_size: int = -1
    discard_new: bool = False


#: Per stream: its reservation, largest message and discard policy. Trusted writers' streams
#: keep discard old (their oldest go first at the bound, as SEEDANCE_TELEMETRY always did);
#: the figures are what a deployment's 30 days (400 for costs) hold at the demo fleet's rates
#: with ample room, and an operator with a larger fleet raises them with ``max_file_store``.
LIMITS: dict[str, StreamLimit] = {
    "SEEDANCE_JOBS": StreamLimit(2 * _GIB, JOB_EVENT_MAX_BYTES, discard_new=True),
    "SEEDANCE_TELEMETRY": StreamLimit(2 * _GIB),
    "SEEDANCE_SLICING": StreamLimit(2 * _GIB),
    "SEEDANCE_NODE_PLANS": StreamLimit(64 * _MIB),
    "SEEDANCE_ROUTING": StreamLimit(512 * _MIB),
    "SEEDANCE_ROUTING_PLAN": StreamLimit(512 * _MIB),
    # Tenants' compile requests and the compiler's results (a result's report lists every
    # fallback node, so no message bound below max_payload here): refused when full.
    "SEEDANCE_GRAPH": StreamLimit(256 * _MIB, discard_new=True),
    "SEEDANCE_MODELS": StreamLimit(_GIB),
    "SEEDANCE_COSTS": StreamLimit(2 * _GIB),
    "SEEDANCE_LEDGER_IN": StreamLimit(4 * _GIB),
    "SEEDANCE_NODE_DECISIONS": StreamLimit(_GIB),
    # Dead letters: each at most 1/8 of max_payload (seedance.core.dead_letters), the oldest
    # go first, so a tenant's flood of junk never stops a reader from setting one aside.
    "SEEDANCE_DLQ": StreamLimit(512 * _MIB),
}
