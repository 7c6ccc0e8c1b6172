"""A tiny HTTP endpoint per service: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

Built on asyncio streams so that no web framework enters the services' images for three GET
routes. Readiness is a callable the service provides (connected to NATS, consumers bound);
so is liveness's "connecting" state: the endpoint is up before the first connection to NATS,
and ``/healthz`` answers 503 with what it is waiting for until that connection is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["HealthServer"]


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], bool],
        host: str,
        port: int,
        *,
        waiting_for: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._waiting_for = waiting_for
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def host(self) -> str:
        """The address listened on: the bound socket's once started (a name given in the
        settings, ``localhost`` say, becomes the address it resolved to)."""
        if self._server is None:
            return self._host
        return str(self._server.sockets[0].getsockname()[0])

    def url(self, path: str = "/") -> str:
        """``http://host:port<path>`` where it listens (the bound address once started)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5.0)
            while (await asyncio.wait_for(reader.readline(), timeout=5.0)) not in (b"\r\n", b""):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            path = parts[1] if len(parts) >= 2 else "/"
            if path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
            elif path == "/healthz":
                waiting = self._waiting_for()
                status = "200 OK" if waiting is None else "503 Service Unavailable"
                text = "ok\n" if waiting is None else f"not ready: {waiting}\n"
                ctype, body = "text/plain", text.encode()
            elif path == "/readyz":
                ok = self._ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", b"ready\n" if ok else b"not ready\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass  # a client that hangs up or stalls gets nothing; the server carries on
        finally:
            writer.close()
