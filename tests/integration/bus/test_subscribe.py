"""``Bus.subscribe`` returns only once the server holds the subscription, against a real
nats-server reached through a TCP proxy that holds back the subscriber's SUB (and whatever it
writes after it, in order) until the test lets it go: a server that reads the SUB later than
the PING before it, as a loaded one can. ``subscribe(); flush()`` returned while the SUB was
still held (nats-py writes flush's PING before the SUB waiting in its buffer), and a MIG plan
published meanwhile was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import Any
from urllib.parse import urlparse

import nats
import nats.errors
import pytest
from nats.aio.msg import Msg

from seedance.core import Bus, BusSettings
from seedance.core.barrier import flushed
from seedance.testing.identities import password
from seedance.testing.nats_proxy import pipe
from seedance.testing.waits import eventually
from tests.conftest import shipped_test_server


class HoldingProxy:
    """Forwards one NATS connection both ways; the client's bytes from its ``SUB <subject>``
    on are held (in order) until ``release``."""

    def __init__(self, upstream: str, subject: str) -> None:
        url = urlparse(upstream)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 4222
        self._sub = b"SUB " + subject.encode()
        self.held = bytearray()
        self.holding = asyncio.Event()
        self._released = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._up: asyncio.StreamWriter | None = None
        self.url = ""

    @property
    def ping_behind_the_sub(self) -> bool:
        """The client wrote a PING after the held SUB (its answer proves the SUB arrived)."""
        return b"\r\nPING\r\n" in bytes(self.held)

    async def release(self) -> None:
        """Send what was held, and from then on everything as it comes."""
        if self._released.is_set():
            return
        self._released.set()
        if self._up is not None:
            self._up.write(bytes(self.held))  # before any later read is forwarded: in order
            await self._up.drain()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        self._up = up_writer
        for task in (self._to_server(reader, up_writer), pipe(up_reader, writer)):
            t = asyncio.create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self.holding.is_set() and self._sub in data:
                    at = data.index(self._sub)
                    writer.write(data[:at])  # what came before the SUB (a PING) goes on now
                    await writer.drain()
                    self.held += data[at:]
                    self.holding.set()
                    continue
                if self.holding.is_set() and not self._released.is_set():
                    self.held += data
                    continue
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def proxied_bus(nats_url: str, subject: str) -> AsyncIterator[tuple[Bus, HoldingProxy]]:
    proxy = HoldingProxy(nats_url, subject)
    await proxy.start()
    try:
        bus = await Bus.connect(BusSettings(url=proxy.url, name="subscriber"))
        try:
            yield bus, proxy
        finally:
            await proxy.release()
            await bus.close()
    finally:
        await proxy.stop()


async def returns_once_the_held_sub_is_read(proxy: HoldingProxy, call: Awaitable[Any]) -> None:
    """``call`` (which subscribes) must not return while the proxy holds its SUB, and must
    have asked behind it (a PING) for the proof that the server has it; released, it returns."""
    task = asyncio.ensure_future(call)
    try:
        await eventually(
            lambda: task.done() or proxy.ping_behind_the_sub,
            what="the call returned or its PING queued behind the SUB",
        )
        assert not task.done(), "returned before the server had the SUB"
        await proxy.release()
        async with asyncio.timeout(10):
            await task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_subscribe_returns_once_the_server_holds_the_subscription(
    nats_url: str, bus: Bus, unique: str
) -> None:
    subject = f"held.{unique}"
    got: list[bytes] = []

    async def on_msg(msg: Msg) -> None:
        got.append(msg.data)

    async with proxied_bus(nats_url, subject) as (subscriber, proxy):
        await returns_once_the_held_sub_is_read(proxy, subscriber.subscribe(subject, on_msg))
        # Published from another connection right after: delivered.
        await bus.nc.publish(subject, b"plan")
        await eventually(lambda: got == [b"plan"], what="the message delivered")


async def test_a_plain_flush_returns_while_the_server_has_not_read_the_sub(
    nats_url: str, unique: str
) -> None:
    """The client defect `flushed` works around, pinned: when nats-py writes flush's PING
    behind what it buffered, this fails, and `flushed` can become one flush again."""
    subject = f"held.{unique}"
    async with proxied_bus(nats_url, subject) as (subscriber, proxy):
        nc = subscriber.nc  # the raw nats-py connection the barrier takes
        await nc.subscribe(subject)
        async with asyncio.timeout(10):
            await nc.flush()  # answered: the PING went out ahead of the SUB
        assert proxy.holding.is_set()
        assert not proxy.ping_behind_the_sub


async def test_flushed_returns_once_the_server_has_read_what_was_written_before_it(
    nats_url: str, bus: Bus, unique: str
) -> None:
    """A raw connection's barrier (the tests' probes, the allocation API's request
    subscription): `flushed` waits for the held SUB, and a message published from another
    connection right after it is delivered."""
    subject = f"held.{unique}"
    async with proxied_bus(nats_url, subject) as (subscriber, proxy):
        nc = subscriber.nc  # the raw nats-py connection the barrier takes
        subs: list[Any] = []

        async def subscribe_then_flushed() -> None:  # as a caller writes it: no await between
            subs.append(await nc.subscribe(subject))
            await flushed(nc)

        await returns_once_the_held_sub_is_read(proxy, subscribe_then_flushed())
        await bus.nc.publish(subject, b"plan")
        msg = await subs[0].next_msg(timeout=10)
        assert msg.data == b"plan"


async def test_flushed_refuses_while_the_connection_is_reconnecting() -> None:
    """nats-py's ``flush`` returns at once while reconnecting, having sent nothing (its read
    and flush tasks are stopped): ``flushed`` says so (a transient error the caller retries)
    rather than report a barrier no server answered (review of 2026-12-07)."""
    server = shipped_test_server()
    nc = await nats.connect(
        server.url, name="test-admin", user="admin", password=password("admin"),
        max_reconnect_attempts=-1, reconnect_time_wait=30,
    )  # fmt: skip
    try:
        server.stop()
        await eventually(lambda: nc.is_reconnecting, what="the client reconnecting")
        await nc.subscribe("plans.held")
        with pytest.raises(nats.errors.ConnectionReconnectingError):
            await flushed(nc)
        assert nc.is_reconnecting  # and the connection is left to its reconnect loop
    finally:
        with contextlib.suppress(ConnectionResetError):  # nats-py drains the lost socket
            await nc.close()
        server.stop()
