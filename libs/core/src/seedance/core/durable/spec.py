"""What a durable runtime is handed: where its state and lease live (`DurableSpec`) and the
protocols of the parts it drives (`DurableCore`, `Leadership`, `DurableMetrics`).

Owns these declarations only; the runtime that uses them is `seedance.core.durable.runtime`
(which re-exports them). It must not hold behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from seedance.core.consumer import Delivery
from seedance.core.durable.state import Outbox
from seedance.core.errors import InvalidMessage
from seedance.events import Event

__all__ = ["DurableCore", "DurableMetrics", "DurableSpec", "Leadership"]


class DurableCore(Protocol):
    """What the runtime drives: inputs to effects, on the state it holds."""

    def check(self, d: Delivery[Any]) -> InvalidMessage | None:
        """Why a delivery must not be applied at all (dead-lettered), or None. May raise:
        dead-lettered as an application that raised."""

    def trusted_time(self, d: Delivery[Any]) -> datetime:
        """When the delivery's event happens, from trusted clocks (may move the state's)."""

    def apply(self, event: Any, at: datetime) -> Outbox:
        """The event applied at `at`: the effects to publish. May raise: the batch is rolled
        back and replayed without it."""

    def after_batch(self, last: Event) -> Outbox:
        """What a batch that applied something ends with (`last`: its last applied event).
        May raise: the batch is rolled back and naked."""

    def settled(self, committed: bool) -> None:
        """The batch or change since the last call was made durable (or rolled back): count
        what it decided, or forget it."""


class Leadership(Protocol):
    """Who leads (`seedance.core.kv.Lease` is one). ``acquired`` is set while ``held``."""

    @property
    def held(self) -> bool: ...

    @property
    def acquired(self) -> asyncio.Event: ...

    async def keep(self) -> None:
        """Acquire and refresh until cancelled (then give it up)."""

    async def release(self) -> None: ...


class DurableMetrics(Protocol):
    @property
    def leader(self) -> Any: ...  # a Gauge: 1 while leading

    @property
    def state_write_seconds(self) -> Any: ...  # a Histogram: one commit's time


@dataclass(frozen=True, kw_only=True)
class DurableSpec:
    #: The KV bucket and key prefix of the state (`StateStore`).
    bucket: str
    key: str
    #: The lease's key in `LEASE_BUCKET`, who holds it (the replica; "" the host name), its TTL
    #: (the poll period is a sixth of it, also with a `Leadership` handed in; its key unused).
    lease_key: str
    holder: str = ""
    lease_ttl_s: float = 10.0
    #: Fields every log line of the runtime carries besides its own (the slicer's ``pool``).
    log_fields: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: Options of its `StateStore` where the store's defaults do not fit (the slicer's
    #: ``compact_records``: its base costs much more than the k8s-bridge's).
    store: Mapping[str, int] = field(default_factory=dict, hash=False)
