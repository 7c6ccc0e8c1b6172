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

Streams tenants write to (``SEEDANCE_JOB_REQUESTS``, ``SEEDANCE_GRAPH``) refuse new messages
when full (``discard_new``) rather than evict the oldest: eviction would drop other tenants'
requests not yet handled. A tenant can still fill its share of such a stream and block every
tenant's NEW requests there until retention or an operator's purge; per-tenant NATS accounts
with JetStream limits would bound one tenant's bytes, and are not done (docs/security.md).
It cannot stop the trusted observers' job events: they land in ``SEEDANCE_OBSERVED``, which no
tenant writes, and reach the slicer through ``SEEDANCE_JOBS``, which takes every sourced
message (discard old) and is sized so that no tenant can make it evict one (`LIMITS`).
"""

from __future__ import annotations

__all__ = ["JOB_EVENT_MAX_BYTES", "LIMITS", "StreamLimit"]

from typing import NamedTuple

_KIB = 1024
_MIB = 1024**2
_GIB = 1024**3

#: The largest message ``SEEDANCE_JOB_REQUESTS`` takes. The schema bounds characters, the stream
#: bytes: ``job.submitted.v1`` at `seedance.events.jobs`' maxima (64 labels of a 63-character key
#: and a 256-character value, 32 GPU models of 64 characters) in its widest encoding, every
#: character a control character msgspec writes as ``\u00XX`` (6 bytes; UTF-8 is at most 4), is
#: 134,686 bytes (tests/integration/bus/test_store_limits.py builds and stores it; review R5: 64 KiB
#: refused schema-valid CJK, emoji and control-character events). 256 KiB is 1.9 times that, room
#: for the headers (trace context, ``Nats-Msg-Id``) and a new field, and 1/4 of the server's 1 MiB
#: ``max_payload``.
JOB_EVENT_MAX_BYTES = 256 * _KIB
_REQUESTS = 512 * _MIB
_OBSERVED = 256 * _MIB


class StreamLimit(NamedTuple):
    max_bytes: int
    max_msg_size: int = -1
    discard_new: bool = False


#: Per stream: its reservation, largest message and discard policy. Trusted writers' streams keep
#: discard old (their oldest go first at the bound, as SEEDANCE_TELEMETRY always did). The streams
#: bounded before audit F2 keep their figures (TELEMETRY, NODE_PLANS, MODELS, LEDGER_IN,
#: NODE_DECISIONS: 8.06 GiB); the ones it bounded share 1.38 GiB, and the split of the job streams
#: (requests, observed, their merge) added 1.5 GiB, so that with the object stores (16.25 GiB) the
#: catalogue reserves 27.19 GiB and the shipped ``max_file_store`` 32G (29.80 GiB) keeps 2.61 GiB
#: for the KV buckets, which reserve nothing (at least 2 GiB: review R2, R6, R7: 48G broke compose
#: upgrades and the Kubernetes volume claim). Each figure: a typical event's bytes x what the
#: retention holds, far above the compose/demo fleet (a few nodes, tens of jobs a day). A larger
#: fleet raises the stream's figure here and ``max_file_store`` with it (docs/deploy.md); the test
#: in tests/unit/deploy/test_images.py holds the sum under it.
LIMITS: dict[str, StreamLimit] = {
    # ~1 KiB a job event, ~4 a job: 512 MiB is ~500,000 events, ~4,000 jobs a day for the 30
    # days' retention; full, it refuses new requests (never evicts an unhandled one). The
    # figure SEEDANCE_JOBS had when it took the requests itself.
    "SEEDANCE_JOB_REQUESTS": StreamLimit(_REQUESTS, JOB_EVENT_MAX_BYTES, discard_new=True),
    # The observers' submit and end of each pod (~1 KiB each, ~2 a job), trusted writers only:
    # ~8,000 a day for the 30 days' retention is 240 MiB. Discard old: a tenant cannot write
    # here, so nothing but the fleet's own volume fills it, and the bridge is never refused.
    "SEEDANCE_OBSERVED": StreamLimit(_OBSERVED),
    # The slicer's merged input (sourced, discard old: a sourced message is never refused, so
    # the observers' events always get in). It evicts an event only past its bound, which is
    # the two origins' bounds and the 512 MiB an older SEEDANCE_JOBS may hold from before the
    # split: over one 30-day retention it receives at most what the requests stream accepted
    # in it (a discard-new stream of the same age holds everything it accepted then: at most
    # its bound, however a tenant floods) and what the observers published, so a tenant alone
    # can never make it evict an unread event. (Work-queue retention would also bound it, but
    # the slicer's readers are not its only readers: tests and benches read it whole.)
    "SEEDANCE_JOBS": StreamLimit(_REQUESTS + _OBSERVED + 512 * _MIB),
    "SEEDANCE_TELEMETRY": StreamLimit(2 * _GIB),
    # ~0.5 KiB a placement/release/share, a few per job: ~500,000 over 30 days.
    "SEEDANCE_SLICING": StreamLimit(256 * _MIB),
    "SEEDANCE_NODE_PLANS": StreamLimit(64 * _MIB),
    # Route observations and the router's plans, one day's retention: ~0.5 KiB each, ~130,000 a
    # day (1.5 a second) each.
    "SEEDANCE_ROUTING": StreamLimit(64 * _MIB),
    "SEEDANCE_ROUTING_PLAN": StreamLimit(64 * _MIB),
    # Tenants' compile requests and the compiler's results (a result's report lists every
    # fallback node, so no message bound below max_payload here), ~10 KiB a pair: ~13,000 over
    # 30 days. Refused when full.
    "SEEDANCE_GRAPH": StreamLimit(128 * _MIB, discard_new=True),
    "SEEDANCE_MODELS": StreamLimit(_GIB),
    # Ledger entries, ~0.5 KiB each, kept 400 days: ~1,300 a day.
    "SEEDANCE_COSTS": StreamLimit(256 * _MIB),
    "SEEDANCE_LEDGER_IN": StreamLimit(4 * _GIB),
    "SEEDANCE_NODE_DECISIONS": StreamLimit(_GIB),
    # Dead letters: each at most 1/8 of max_payload (seedance.core.dead_letters), the oldest
    # go first, so a tenant's flood of junk never stops a reader from setting one aside; 128
    # MiB is at least 1,000 of the largest, far more of the usual few-KiB ones.
    "SEEDANCE_DLQ": StreamLimit(128 * _MIB),
}
