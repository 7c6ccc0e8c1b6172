"""A TCP proxy between one NATS client and a nats-server that loses the server's messages a
test picks: what a client sees when the server carried out its request but the answer never
came (a server busy past the request's time-out, a JetStream meta leader that applied a change
after the client gave up), and, where a test picks them too, the client's requests that never
reached the server (nothing carried out, no answer). Each side's bytes go frame by frame; each
``MSG``/``HMSG`` whose payload ``lose`` picks, and each ``PUB``/``HPUB`` whose subject
``lose_request`` picks, is dropped. It must not change or reorder what it forwards, and it loses
nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlparse

__all__ = ["LosingProxy", "pipe"]

#: The frames that carry a payload (its size is the control line's last token), the server's
#: and the client's.
_DOWN_PAYLOAD = (b"MSG ", b"HMSG ")
_UP_PAYLOAD = (b"PUB ", b"HPUB ")


class LosingProxy:
    """Forwards each accepted connection to ``upstream`` (a ``nats://`` URL), dropping the
    server's messages whose payload (headers included, for ``HMSG``) ``lose`` picks, and the
    client's publishes (requests) whose subject ``lose_request`` picks; ``lost`` and
    ``lost_requests`` hold what it dropped. ``url`` is where clients connect once started."""

    def __init__(
        self,
        upstream: str,
        lose: Callable[[bytes], bool],
        lose_request: Callable[[str], bool] = lambda subject: False,
    ) -> None:
        url = urlparse(upstream)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 4222
        self._lose, self._lose_request = lose, lose_request
        self.lost: list[bytes] = []
        self.lost_requests: list[str] = []
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
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
        except OSError:  # the server is gone: the client sees its connection closed
            writer.close()
            return
        for piping in (
            _frames(reader, up_writer, _UP_PAYLOAD, self._picked_request),
            _frames(up_reader, writer, _DOWN_PAYLOAD, self._picked_reply),
        ):
            task = asyncio.create_task(piping)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _picked_reply(self, line: bytes, payload: bytes) -> bool:
        if self._lose(payload):
            self.lost.append(payload)
            return True
        return False

    def _picked_request(self, line: bytes, payload: bytes) -> bool:
        subject = line.split()[1].decode()
        if self._lose_request(subject):
            self.lost_requests.append(subject)
            return True
        return False


async def _frames(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    with_payload: tuple[bytes, ...],
    picked: Callable[[bytes, bytes], bool],
) -> None:
    """Forward ``reader``'s frames to ``writer`` but those with a payload (``with_payload``)
    that ``picked`` (the control line, the payload) drops; then close ``writer``."""
    try:
        # a frame's line past the reader's limit (LimitOverrunError) ends the connection as a
        # dropped one does: the client reconnects or fails, it never hangs
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError
        ):
            while line := await reader.readuntil(b"\r\n"):
                frame = line
                if line.startswith(with_payload):
                    payload = await reader.readexactly(int(line.split()[-1]) + 2)
                    if picked(line, payload[:-2]):
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
