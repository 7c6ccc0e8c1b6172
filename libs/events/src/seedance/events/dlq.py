"""The dead letter: a message that will never be handled, with the reason and the original."""

from __future__ import annotations

import msgspec

from seedance.events.base import Event

__all__ = ["DeadLetter"]


class DeadLetter(Event, frozen=True, kw_only=True, tag="dlq.dead_letter.v1"):
    service: str
    subject: str
    stream_seq: int | None = None
    num_delivered: int | None = None
    error_kind: str
    reason: str
    #: The original payload, base64 (it may not be valid UTF-8 or JSON at all); only its
    #: first bytes where ``truncated`` (a letter must fit the server's max_payload, which the
    #: whole original, base64, need not: security audit F3).
    payload: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    #: The original payload's whole size and SHA-256 (hex), whatever ``payload`` carries.
    payload_bytes: int | None = None
    payload_sha256: str | None = None
    #: Whether ``payload``, ``headers`` or ``reason`` carry less than the original's.
    truncated: bool = False
