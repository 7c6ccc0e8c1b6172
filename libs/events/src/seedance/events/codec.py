"""JSON encoding and typed decoding of events; encoders and decoders are built once.

JSON (not msgpack) because users read cost streams from any language and with ``nats sub``;
msgspec's JSON is about as fast as its msgpack for these small messages.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar, cast

import msgspec

from seedance.events.base import Event
from seedance.events.cost import CostEvent
from seedance.events.dlq import DeadLetter
from seedance.events.graph import GraphEvent
from seedance.events.jobs import JobEvent
from seedance.events.routing import RoutingEvent
from seedance.events.slicing import SlicingEvent
from seedance.events.telemetry import TelemetryEvent

__all__ = ["AnyEvent", "DecodeError", "decode", "encode", "event_types"]

AnyEvent = (
    TelemetryEvent | JobEvent | SlicingEvent | RoutingEvent | GraphEvent | CostEvent | DeadLetter
)

E = TypeVar("E", bound=Event)

_encoder = msgspec.json.Encoder()


class DecodeError(ValueError):
    """A payload is not a valid event of the expected types; the message names what is wrong."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


@cache
def _decoder(types: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(types)


def decode(data: bytes, types: Any = AnyEvent) -> Any:
    """Decode ``data`` as one of ``types`` (a Struct type or a union of them).

    Raises:
        DecodeError: with msgspec's message, which names the field and the problem
            (for example ``Expected `int`, got `str` - at `$.request.gpus```).
    """
    try:
        return _decoder(types).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise DecodeError(str(exc)) from exc


def event_types() -> list[type[Event]]:
    """Every concrete event type, for schema generation and golden tests."""
    out: list[type[Event]] = []
    for union in (TelemetryEvent, JobEvent, SlicingEvent, RoutingEvent, GraphEvent, CostEvent):
        out.extend(cast(Any, union).__args__)
    out.append(DeadLetter)
    return out
