"""A connection lost for less than ``BusSettings.reconnect_for_s`` is kept (the CLI's bound).

nats-py waits ``reconnect_time_wait`` between attempts at a server (2 s by default): with the
CLI's bound (``--connect-timeout-s``, 1 s in the integration tests) the give-up came before
the attempt after the first refused one, and an outage far shorter than the bound ended the
command with 69. Under a bound the wait is a quarter of it at most.

A TCP proxy stands between the connection and the pinned nats-server (shipped auth). The
outage is driven by events, not by time: the proxy drops the proxied connections and stops
listening until an attempt to reconnect was refused (the error callback hears it; the server
is untouched), then listens again: the next attempt must pass before the bound.
"""

from __future__ import annotations

import asyncio

from seedance.core import Bus, BusSettings
from seedance.testing.nats_proxy import pipe
from seedance.testing.waits import eventually
from tests.conftest import shipped_test_server

#: Short like the CLI's in tests; over a quarter of it, an attempt or two still fit on a
#: loaded machine, while nats-py's default 2 s wait does not.
BOUND_S = 1.5


class Proxy:
    """Pipes each accepted connection to ``upstream_port``; ``drop`` aborts them and stops
    listening (an attempt meanwhile is refused), ``listen`` listens again on the same port."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.streams: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.handlers: list[asyncio.Task[None] | None] = []

    async def listen(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.handlers.append(asyncio.current_task())
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self.streams += [w, uw]
        await asyncio.gather(pipe(r, uw), pipe(ur, w))

    async def drop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        for w in self.streams:
            w.transport.abort()
            w.close()
        self.streams = []

    async def close(self) -> None:
        await self.drop()
        await asyncio.gather(*(t for t in self.handlers if t is not None))


async def test_an_outage_of_one_refused_attempt_is_within_the_bound() -> None:
    server = shipped_test_server()
    proxy = Proxy(int(server.url.rsplit(":", 1)[1]))
    refused = asyncio.Event()  # an attempt to reconnect was refused: the outage may end

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, ConnectionRefusedError):
            refused.set()

    bus = None
    try:
        port = await proxy.listen()
        settings = BusSettings(url=f"nats://127.0.0.1:{port}", reconnect_for_s=BOUND_S)
        bus = await Bus.connect(settings, error_cb=on_error)
        await proxy.drop()
        attempt = asyncio.ensure_future(refused.wait())
        lost = asyncio.ensure_future(bus.gave_up.wait())
        await asyncio.wait({attempt, lost}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        attempt.cancel()
        lost.cancel()
        assert not bus.gave_up.is_set(), "given up before an attempt to reconnect"
        assert refused.is_set()
        await proxy.listen()  # back: the next attempt passes
        reconnecting = bus  # narrowed for the check

        def settled() -> bool:  # reconnected, or given up
            return reconnecting.nc.is_connected or reconnecting.gave_up.is_set()

        await eventually(settled, timeout_s=30)
        assert not bus.gave_up.is_set(), "given up before the attempt after the refused one"
        await bus.nc.flush(timeout=10)  # a round trip over the new connection
    finally:
        if bus is not None:
            await bus.close()
        await proxy.close()
        server.stop()
