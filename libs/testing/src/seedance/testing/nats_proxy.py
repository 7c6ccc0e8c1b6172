"""A TCP proxy between one NATS client and a nats-server that loses the server's messages a
test picks: what a client sees when the server carried out its request but the answer never
came (a server busy past the request's time-out, a JetStream meta leader that applied a change
after the client gave up). The client's bytes go up as they come; the server's come down frame
by frame, and each ``MSG``/``HMSG`` whose payload ``lose`` picks is dropped. It must not change
or reorder what it forwards, and it loses nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlparse

__all__ = ["LosingProxy", "pipe"]

#: The server's frames that carry a payload (its size is the control line's last token).
_WITH_PAYLOAD = (b"MSG ", b"HMSG ")


class LosingProxy:
    """Forwards each accepted connection to ``upstream`` (a ``nats://`` URL), dropping the
    server's messages whose payload (headers included, for ``HMSG``) ``lose`` picks; ``lost``
    holds what it dropped. ``url`` is where clients connect once started."""

    def __init__(self, upstream: str, lose: Callable[[bytes], bool]) -> None:
        url = urlparse(upstream)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 4222
        self._lose = lose
        self.lost: list[bytes] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> LosingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"nats://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        for piping in (pipe(reader, up_writer), self._down(up_reader, writer)):
            task = asyncio.create_task(piping)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while line := await reader.readuntil(b"\r\n"):
                    frame = line
                    if line.startswith(_WITH_PAYLOAD):
                        payload = await reader.readexactly(int(line.split()[-1]) + 2)
                        if self._lose(payload[:-2]):
                            self.lost.append(payload[:-2])
                            continue
                        frame += payload
                    writer.write(frame)
                    await writer.drain()
        finally:
            writer.close()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Forward what ``reader`` gets to ``writer`` as it comes, until either side ends; then
    close ``writer``."""
    try:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
    finally:
        writer.close()
