"""Seedance's event vocabulary and its subject catalogue.

This package owns every message that crosses the bus and every subject, stream and durable
consumer name. Nothing else in Seedance writes a subject string. It must not import NATS or any
service: it is plain data, shared by the services, the SDK and the tools.

Evolution rule (tested with golden messages in ``proto/golden/``):

* Every event is a frozen, keyword-only ``msgspec.Struct`` with a stable tag such as
  ``"job.submitted.v1"``. The tag is the version.
* A new field must have a default. Old consumers ignore it (unknown fields are tolerated on
  decode), new consumers read the default from old producers.
* Anything else (a rename, a type change, a removal, a new required field) is a new type with a
  new tag (``...v2``). Both versions stay in the family's union until the old one is retired.
* Units live in field names (``mem_mib``, ``cost_usd``, ``energy_j``). Timestamps are UTC
  ``datetime`` values, encoded as RFC 3339.
"""

from seedance.events.base import Event, EventId, derived_event_id, new_event_id
from seedance.events.codec import DecodeError, decode, encode, event_types

__all__ = [
    "DecodeError",
    "Event",
    "EventId",
    "decode",
    "derived_event_id",
    "encode",
    "event_types",
    "new_event_id",
]
