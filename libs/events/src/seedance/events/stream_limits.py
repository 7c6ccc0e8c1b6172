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
message (discard old) and is sized so that no tenant can make it evict one (`LIMITS`). A copy is
larger than its original by the ``Nats-Stream-Source`` header the server adds
(`COPY_HEADER_MAX_BYTES`), so the requests stream is bounded in messages as well as bytes.
"""

from __future__ import annotations

__all__ = ["COPY_HEADER_MAX_BYTES", "JOB_EVENT_MAX_BYTES", "LIMITS", "StreamLimit"]

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
#: At most this many requests in ``SEEDANCE_JOB_REQUESTS`` (discard new), and observed events in
#: ``SEEDANCE_OBSERVED`` (discard old). The Alibaba GPU-sharing trace's whole 1,213-node cluster
#: submits 1,638 jobs per 30 days (docs/security.md); a job is ~4 events, so 1,000,000 is ~150
#: times that cluster's retention, and twice the ~500,000 events the 512 MiB is sized for
#: (~4,000 jobs a day). Only empty junk reaches it first: 1,000,000 x 58 B is 55 MiB.
_REQUESTS_MSGS = 1_000_000
_OBSERVED_MSGS = 1_000_000
#: What the server adds to each copy it sources into another stream: the ``Nats-Stream-Source``
#: header (``NATS/1.0``, the origin stream's name, the origin sequence, the source's filter and
#: transform, the copy's subject, an 8-character hash; the header block itself where the original
#: had none). Measured on the pinned server (tests/integration/bus/test_store_limits.py): 120 B for
#: an empty ``seedance.jobs.acme.submitted`` at a 4-digit sequence (58 B stored in the requests
#: stream, 178 B as a copy), one byte more per sequence digit and per subject character. The
#: widest copy a Seedance writer can cause: a 20-digit sequence and a 94-character subject
#: (``seedance.observed.<63-character tenant>.move_refused``; tenants publish only on their own
#: ``seedance.jobs.<tenant>.<kind>``, 87 at most; a writer's own headers count in the original's
#: bytes), 120 + 16 + 66 = 202 B; 256 leaves room for a longer stream name.
COPY_HEADER_MAX_BYTES = 256


class StreamLimit(NamedTuple):
    max_bytes: int
    max_msg_size: int = -1
    discard_new: bool = False
    max_msgs: int = -1


#: Per stream: its reservation, largest message and discard policy. Trusted writers' streams keep
#: discard old (their oldest go first at the bound, as SEEDANCE_TELEMETRY always did). The streams
#: bounded before audit F2 keep their figures (TELEMETRY, NODE_PLANS, MODELS, LEDGER_IN,
#: NODE_DECISIONS: 8.06 GiB); the ones it bounded share 1.38 GiB, and the split of the job streams
#: (requests, observed, their merge, its copies' headers) added 1.98 GiB, so that with the object
#: stores (16.25 GiB) the catalogue reserves 27.66 GiB and the shipped ``max_file_store`` 32G
#: (29.80 GiB) keeps 2.14 GiB
#: for the KV buckets, which reserve nothing (at least 2 GiB: review R2, R6, R7: 48G broke compose
#: upgrades and the Kubernetes volume claim). Each figure: a typical event's bytes x what the
#: retention holds, far above the compose/demo fleet (a few nodes, tens of jobs a day). A larger
#: fleet raises the stream's figure here and ``max_file_store`` with it (docs/deploy.md); the test
#: in tests/unit/deploy/test_images.py holds the sum under it.
LIMITS: dict[str, StreamLimit] = {
    # ~1 KiB a job event, ~4 a job: 512 MiB is ~500,000 events, ~4,000 jobs a day for the 30
    # days' retention; full, it refuses new requests (never evicts an unhandled one). The
    # figure SEEDANCE_JOBS had when it took the requests itself.
    # Bounded in messages too (`_REQUESTS_MSGS`): the copies' headers are per message, and
    # 512 MiB of the smallest junk was 9.26 million copies of 178 B, 1.53 GiB (review C1).
    "SEEDANCE_JOB_REQUESTS": StreamLimit(
        _REQUESTS, JOB_EVENT_MAX_BYTES, discard_new=True, max_msgs=_REQUESTS_MSGS
    ),
    # The observers' submit and end of each pod (~1 KiB each, ~2 a job), trusted writers only:
    # ~8,000 a day for the 30 days' retention is 240 MiB, 240,000 events. Discard old: a tenant
    # cannot write here, so nothing but the fleet's own volume fills it, and the bridge is
    # never refused.
    "SEEDANCE_OBSERVED": StreamLimit(_OBSERVED, max_msgs=_OBSERVED_MSGS),
    # The slicer's merged input (sourced, discard old: a sourced message is never refused, so
    # the observers' events always get in). It evicts an event only past its bound, which is
    # the two origins' bounds and the 512 MiB an older SEEDANCE_JOBS may hold from before the
    # split: over one 30-day retention it receives at most what the requests stream accepted
    # in it (a discard-new stream of the same age holds everything it accepted then: at most
    # its bounds, however a tenant floods) and what the observers published, each copy larger
    # by its header: bytes + messages x `COPY_HEADER_MAX_BYTES` per origin (1.73 GiB in all),
    # so a tenant alone can never make it evict an unread event. (Work-queue retention would
    # also bound it, but the slicer's readers are not its only readers: tests and benches read
    # it whole.) An operator purging a tenant's requests purges its copies here too
    # (docs/security.md): a purged origin accepts a fresh bound, its copies stay.
    "SEEDANCE_JOBS": StreamLimit(
        _REQUESTS
        + _REQUESTS_MSGS * COPY_HEADER_MAX_BYTES
        + _OBSERVED
        + _OBSERVED_MSGS * COPY_HEADER_MAX_BYTES
        + 512 * _MIB
    ),
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
