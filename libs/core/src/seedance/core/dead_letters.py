"""Dead letters: the one way a Seedance reader sets aside a message it will never apply.

Owns building a ``DeadLetter`` from a JetStream message (its payload, headers and place in the
stream) and publishing it on ``seedance.dlq.<service>``. Shared by the acked pull consumer
(``seedance.core.consumer``, which terminates the original once the letter is durable) and by
readers that keep their own position and never ack (the ledger's replicas: the letter is all).
Must not decide what is poison, nor settle the original: the caller does both.
"""

from __future__ import annotations

import hashlib

import msgspec
import nats.errors
from nats.aio.msg import Msg

from seedance.core.bus import Bus
from seedance.core.logs import get_logger
from seedance.events import derived_event_id, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.subjects import Header, dlq

__all__ = ["DeadLetters", "dead_letter_of"]

log = get_logger(__name__)

#: What a letter carries of the original at most, so that the whole letter (base64 payload,
#: JSON headers, reason) stays under 128 KiB, 1/8 of the server's 1 MiB max_payload: an
#: 800,000-byte original, base64 in its letter, was over it, and the letter's publish failed
#: (MaxPayloadError) at every delivery until the message was dropped (security audit F3). The
#: size and SHA-256 of the whole payload identify it. 64 KiB holds the whole of a usual event
#: (a few KiB) but not of the widest schema-valid one (134,686 bytes with every character
#: JSON-escaped: seedance.events.stream_limits): such a letter carries a prefix, flagged
#: ``truncated``.
PAYLOAD_PREFIX_BYTES = 64 * 1024
HEADERS_MAX_BYTES = 8 * 1024
REASON_MAX_CHARS = 4096


def dead_letter_of(
    msg: Msg, *, service: str, kind: str, reason: str, letter_id: str | None = None
) -> DeadLetter:
    """The dead letter for a JetStream message: its payload, headers and where it was.

    Stamped with the original's stream time (no wall clock). ``letter_id`` defaults to a new id;
    a deterministic replica passes one derived from the message, so its twins' letters are one.
    """
    md = msg.metadata
    data = bytes(msg.data)
    headers: dict[str, str] = {}
    used = 0
    for name, value in (msg.headers or {}).items():
        used += len(msgspec.json.encode({name: value}))  # as the letter will carry it
        if used > HEADERS_MAX_BYTES:
            break
        headers[name] = value
    return DeadLetter(
        id=letter_id or new_event_id(),
        at=md.timestamp,
        service=service,
        subject=msg.subject,
        stream_seq=md.sequence.stream,
        num_delivered=md.num_delivered,
        error_kind=kind,
        reason=reason[:REASON_MAX_CHARS],
        payload=data[:PAYLOAD_PREFIX_BYTES],
        headers=headers,
        payload_bytes=len(data),
        payload_sha256=hashlib.sha256(data).hexdigest(),
        truncated=(
            len(data) > PAYLOAD_PREFIX_BYTES
            or len(headers) < len(msg.headers or {})
            or len(reason) > REASON_MAX_CHARS
        ),
    )


class DeadLetters:
    """Publishes one service's dead letters and logs each one.

    With ``id_key`` (the service's secret, `seedance.core.id_key`) a letter's id is derived from
    its original (the ``Nats-Msg-Id`` it was published with, else its stream and sequence), so
    deterministic replicas that all reject the same input publish one letter: the others' copies
    are dropped by the duplicate window. Keyed, because ``SEEDANCE_DLQ`` is a stream nodes write
    to (their agents' ``seedance.dlq.<service>``) and the duplicate window is the stream's: a
    node that could compute the letter's id from its own bad message's could publish it first
    and have the letter dropped (docs/security.md, "Nats-Msg-Id"). Without a key each letter
    gets a new id. A failed publish raises (``NoStream``, a timeout, a NATS error): the caller
    decides whether to retry the original later or to fail.
    """

    def __init__(self, bus: Bus, service: str, *, id_key: bytes | None = None) -> None:
        if id_key is not None and not id_key:
            raise ValueError("an empty id_key would derive unkeyed ids: pass None for new ids")
        self._bus = bus
        self.service = service
        self._id_key = id_key

    def letter(self, msg: Msg, kind: str, reason: str) -> DeadLetter:
        letter_id = None
        if self._id_key is not None:
            md = msg.metadata
            cause = (msg.headers or {}).get(Header.MSG_ID.value) or (
                f"{md.stream}:{md.sequence.stream}"
            )
            letter_id = derived_event_id(cause, f"{self.service}-dead-letter", key=self._id_key)
        return dead_letter_of(msg, service=self.service, kind=kind, reason=reason,
                              letter_id=letter_id)  # fmt: skip

    async def send(self, msg: Msg, kind: str, reason: str) -> DeadLetter:
        """Publish the letter for ``msg`` and wait for the stream's ack."""
        letter = self.letter(msg, kind, reason)
        try:
            await self._bus.publish(dlq.subject(self.service), letter)
        except nats.errors.MaxPayloadError:
            # Never at the bounds above under a 1 MiB max_payload; on a server configured
            # smaller, the letter without the original's bytes (its size and SHA-256 stay)
            # rather than a failure every delivery repeats until the message is dropped.
            letter = msgspec.structs.replace(letter, payload=b"", headers={}, truncated=True)
            await self._bus.publish(dlq.subject(self.service), letter)
        log.warning(
            "message_dead_lettered",
            service=self.service,
            kind=kind,
            reason=reason,
            subject=msg.subject,
            stream_seq=msg.metadata.sequence.stream,
            payload_bytes=letter.payload_bytes,
            truncated=letter.truncated,
        )
        return letter
