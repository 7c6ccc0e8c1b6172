"""One push consumer: created under a name the server allows, and its deliveries read in order.

Owns creating the consumer (`watching`: its filter in the API subject, as tenant permissions
require; a tenant reading its own streams takes the first free one of its own names,
``subjects.tenant_consumers``, since the server grants no other), answering its heartbeats and
flow control while events are read (`Watch`), and deleting it afterwards. Must not decode: the
caller knows which event family it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import api as js_api

from seedance.core.bus import Bus
from seedance.core.errors import NoStream, SeedanceError
from seedance.events.subjects import (
    TENANT_CONSUMERS,
    consumer_create,
    deliver_prefix,
    tenant_consumers,
)

__all__ = ["ConsumersInUse", "Watch", "watching"]

#: The client's guard around a bus call: a refused permission raised naming the subject.
Guard = Callable[[Awaitable[Any], str, str], Awaitable[Any]]

#: JetStream's error code for a consumer asked of a stream that does not exist.
_STREAM_NOT_FOUND = 10059
#: ... and for a consumer created (action "create") under a name another one holds.
_CONSUMER_EXISTS = 10148
#: How long a JetStream API request waits for its answer (nats-py's default).
_API_TIMEOUT_S = 5.0


class ConsumersInUse(SeedanceError):
    """Every consumer name a tenant may hold on a stream is taken by its other readers (the
    server allows ``TENANT_CONSUMERS`` per stream)."""


class Watch:
    def __init__(self, bus: Bus, queue: asyncio.Queue[Any], stream: str, name: str) -> None:
        self._bus = bus
        self._nc = bus.nc
        self._queue = queue
        self._js = bus.js
        self._stream = stream
        self._name = name

    async def is_empty(self) -> bool:
        """True when the stream holds nothing for this watch (delivered or still pending)."""
        info = await self._js.consumer_info(self._stream, self._name)
        return int(info.num_pending) == 0 and int(info.delivered.consumer_seq or 0) == 0

    async def next_msg(self) -> Any:
        """The next event's message (answering heartbeats and flow control on the way); raises
        ``BusUnavailable`` once the connection is given up (`BusSettings.reconnect_for_s`),
        where waiting on would wait for ever."""
        while True:
            msg = await self._next()
            if msg.data:
                return msg
            if msg.reply:
                await self._nc.publish(msg.reply, b"")

    async def _next(self) -> Any:
        if not self._queue.empty():
            return self._queue.get_nowait()
        gave_up = self._bus.gave_up
        if gave_up.is_set():
            raise self._bus.lost()
        got = asyncio.ensure_future(self._queue.get())
        lost = asyncio.ensure_future(gave_up.wait())
        try:
            await asyncio.wait({got, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            if not got.done():
                got.cancel()
        if got.done() and not got.cancelled():
            return got.result()
        raise self._bus.lost()

    async def next_data(self) -> bytes:
        return bytes((await self.next_msg()).data)


@contextlib.asynccontextmanager
async def watching(
    bus: Bus,
    guarded: Guard,
    stream: str,
    filter_subject: str | None,
    from_start: bool,
    *,
    own_tenant: str | None = None,
) -> AsyncIterator[Watch]:
    """A push consumer whose filter is in the API subject; it exists once the ``async with``
    is entered and is deleted on leaving. No filter: the whole stream (operators). With
    ``own_tenant`` (this connection is that tenant's user, reading its own stream) it takes
    the first free one of the tenant's own names and delivers under the tenant's deliver
    prefix (the one subject space Seedance's account exports to the tenants' account,
    ``subjects.deliver_prefix``); otherwise a name of 64 random bits, delivering to an inbox."""
    nc = bus.nc
    own = own_tenant if filter_subject else None
    prefix = deliver_prefix(own) if own is not None else nc.new_inbox().rpartition(".")[0]
    inbox = f"{prefix}.{uuid.uuid4().hex}"
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)
    sub = await nc.subscribe(inbox, cb=queue.put)
    name = ""
    config = js_api.ConsumerConfig(
        filter_subject=filter_subject,
        deliver_subject=inbox,
        ack_policy=js_api.AckPolicy.NONE,
        deliver_policy=js_api.DeliverPolicy.ALL if from_start else js_api.DeliverPolicy.NEW,
        inactive_threshold=30.0,
        idle_heartbeat=5.0,
        flow_control=True,
    )
    try:
        try:
            if own is not None and filter_subject:
                name = await _create_own(bus, guarded, stream, own, filter_subject, config)
            else:
                name = f"watch-{uuid.uuid4().hex[:16]}"
                await guarded(
                    bus.js.add_consumer(stream, config.evolve(name=name)),
                    "reading",
                    filter_subject or stream,
                )
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code != _STREAM_NOT_FOUND:
                raise
            raise NoStream(
                f"no stream {stream} on this server: Seedance's streams are created by "
                "`seedance admin provision` (run first by compose and Kubernetes); has it run?"
            ) from None
        yield Watch(bus, queue, stream, name)
    finally:
        # A connection given up is closed: nothing left to unsubscribe, and the error that
        # ended the read (`Watch.next_msg`) must not be replaced by nats-py's "closed".
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await sub.unsubscribe()
        if name:
            with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
                await bus.js.delete_consumer(stream, name)


async def _create_own(
    bus: Bus,
    guarded: Guard,
    stream: str,
    tenant: str,
    filter_subject: str,
    config: js_api.ConsumerConfig,
) -> str:
    """Create ``config`` under the first free one of ``tenant``'s consumer names (from a random
    one on, so concurrent readers rarely meet); its name.

    ``action: create`` makes the server refuse a name another reader holds, where nats-py's
    create-or-update would take that reader's consumer over."""
    names = tenant_consumers(tenant)
    start = secrets.randbelow(len(names))
    for name in names[start:] + names[:start]:
        body = {"stream_name": stream, "config": config.evolve(name=name).as_dict()}
        body["action"] = "create"
        msg = await guarded(
            bus.nc.request(
                consumer_create(stream, name, filter_subject),
                json.dumps(body).encode(),
                timeout=_API_TIMEOUT_S,
            ),
            "reading",
            filter_subject,
        )
        err = json.loads(msg.data).get("error")
        if err is None:
            return name
        if err.get("err_code") != _CONSUMER_EXISTS:
            nats.js.errors.APIError.from_error(err)  # raises the error it names
    raise ConsumersInUse(
        f"all {TENANT_CONSUMERS} of tenant {tenant!r}'s consumers on {stream} "
        f"({', '.join(names)}) are in use by its other readers (the server allows no more): "
        "close one; one whose reader went away ends 30 s after it stopped reading, unless it "
        "was created without that limit, which only deleting it ends (as this tenant: "
        f"`nats consumer rm {stream} <name>`)"
    )
