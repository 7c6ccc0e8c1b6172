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
    #: The original payload, base64 (it may not be valid UTF-8 or JSON at all).
    payload: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)
