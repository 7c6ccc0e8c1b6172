"""JSON encoding and typed decoding of events; encoders and decoders are built once.

JSON (not msgpack) because users read cost streams from any language and with ``nats sub``;
msgspec's JSON is about as fast as its msgpack for these small messages.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import msgspec

from seedance.events.base import Event
from seedance.events.cost import CostEvent
from seedance.events.dlq import DeadLetter
from seedance.events.graph import GraphEvent
from seedance.events.jobs import ObservedJobEvent
from seedance.events.routing import RoutingEvent
from seedance.events.slicing import SlicingEvent
from seedance.events.telemetry import TelemetryEvent

if TYPE_CHECKING:
    # PEP 747: a TypeForm[T] is a Struct type *or a union of them* (``SlicingEvent``), so one
    # signature types both; mypy enables it by default. Only annotations name it (no runtime
    # dependency on typing_extensions).
    from typing_extensions import TypeForm

__all__ = ["AnyEvent", "DecodeError", "decode", "encode", "event_types"]

AnyEvent = (
    TelemetryEvent
    | ObservedJobEvent
    | SlicingEvent
    | RoutingEvent
    | GraphEvent
    | CostEvent
    | DeadLetter
)

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


class DecodeError(ValueError):
    """A payload is not a valid event of the expected types; the message names what is wrong."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


@cache
def _decoder(types: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(types)


@overload
def decode(data: bytes) -> AnyEvent: ...
@overload
def decode(data: bytes, types: TypeForm[T]) -> T: ...
def decode(data: bytes, types: Any = AnyEvent) -> Any:
    """Decode ``data`` as one of ``types`` (a Struct type or a union of them), typed as it.

    ``decode(data, CostEntry)`` is a ``CostEntry``; ``decode(data, SlicingEvent)`` is the
    union; ``decode(data)`` is any event (``AnyEvent``).

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
    for union in (
        TelemetryEvent,
        ObservedJobEvent,
        SlicingEvent,
        RoutingEvent,
        GraphEvent,
        CostEvent,
    ):
        out.extend(cast(Any, union).__args__)
    out.append(DeadLetter)
    return out
