"""The shapes of the catalogue's entries: streams, their sources, durable consumers, key-value
buckets, object stores, and the message headers Seedance sets.

Owns these frozen dataclasses and nothing else: the entries themselves are declared in
``seedance.events.subjects`` (streams, subjects, consumers) and ``seedance.events.stores``
(buckets, object stores); ``seedance.core.bus`` turns them into JetStream configuration. It must
not name a stream, subject or bucket, nor import the bus.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "BucketSpec",
    "ConsumerSpec",
    "Header",
    "ObjectStoreSpec",
    "StreamSource",
    "StreamSpec",
]


class Header(enum.StrEnum):
    MSG_ID = "Nats-Msg-Id"
    TRACEPARENT = "traceparent"
    TRACESTATE = "tracestate"


@dataclass(frozen=True)
class StreamSource:
    """Messages of another stream (those matching ``filter_subject``) copied into this one."""

    stream: str
    filter_subject: str


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    #: How long messages are kept; 0 keeps them until the size limit.
    max_age_s: float = 0.0
    #: Publish de-duplication window on Nats-Msg-Id (JetStream's default is 2 min).
    duplicate_window_s: float = 120.0
    max_bytes: int = -1
    #: At most this many messages in the stream (-1: no limit); discard new refuses past it
    #: as past ``max_bytes``.
    max_msgs: int = -1
    #: At most this many messages per subject, the oldest discarded (-1: no limit).
    max_msgs_per_subject: int = -1
    #: The largest message the stream takes (-1: the server's max_payload); a larger publish
    #: is refused by the server (err_code 10054).
    max_msg_size: int = -1
    #: ``True``: at ``max_bytes`` the stream refuses new messages (err_code 10077, "maximum
    #: bytes exceeded") rather than evict its oldest: where tenants write, evicting would drop
    #: another tenant's unprocessed requests.
    discard_new: bool = False
    description: str = ""
    #: A stream that merges others into one order (every reader sees the same interleaving).
    sources: tuple[StreamSource, ...] = ()
    #: A stream that copies another's messages matching a filter, each at the origin's sequence
    #: (the server skips the sequences it filters out): a stream of its own to read, where the
    #: readers' grants can name no other service's consumer. It has no subjects of its own.
    mirror: StreamSource | None = None


@dataclass(frozen=True)
class ConsumerSpec:
    """A durable pull consumer; replicas of a service bind the same durable and share work."""

    durable: str
    stream: str
    filter_subjects: tuple[str, ...]
    ack_wait_s: float = 30.0
    max_deliver: int = 10
    max_ack_pending: int = 10_000
    #: Redelivery delays after a nak without an explicit delay or an ack timeout.
    backoff_s: tuple[float, ...] = field(default=())
    #: ``False``: no acks; the reader tracks its own position (a replica replaying from its
    #: checkpoint), and the consumer is removed after ``inactive_s`` without a reader.
    acked: bool = True
    start_seq: int = 0
    inactive_s: float = 0.0
    #: ``True``: created, the consumer delivers only what is published after (a reader of
    #: commands that must not act on a stream's history, e.g. on the first start after an
    #: upgrade); one that exists keeps its start (a consumer's start cannot change).
    deliver_new: bool = False


@dataclass(frozen=True)
class BucketSpec:
    name: str
    history: int = 1
    #: Keys expire this long after their last write (0: never); leases rely on it.
    ttl_s: float = 0.0
    description: str = ""
    #: Keys are read by direct get (``$JS.API.DIRECT.GET.<stream>.<key subject>``), which a
    #: permission can confine to a key; STREAM.MSG.GET names the key in its body.
    direct: bool = False


@dataclass(frozen=True)
class ObjectStoreSpec:
    name: str
    #: Objects expire this long after they were written (0: never).
    ttl_s: float = 0.0
    max_bytes: int = -1
    description: str = ""
