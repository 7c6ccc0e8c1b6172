"""A real HTTP server on a loopback port for the graph-compiler's URL-fetch tests.

Owns the routes a test sets (a body, a redirect, a slow drip, a chunked body) and the record
of every request the server received, so a test can prove that a refused URL was never
requested at all. Runs in a thread of the test process; must not be used outside tests.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Route:
    body: bytes = b""
    status: int = 200
    location: str | None = None  # a redirect's target
    chunked: bool = False  # no Content-Length: the size is known only by reading
    drip_s: float = 0.0  # the pause between 1 KiB pieces of the body


@dataclass(frozen=True)
class Seen:
    path: str
    host: str


@dataclass
class ModelServer:
    host: str = "127.0.0.1"
    tls: ssl.SSLContext | None = None  # serve https with this context
    routes: dict[str, Route] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def url(self, path: str, host: str | None = None) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host or self.host}:{self.port}{path}"

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test reads `seen` instead

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _answer(self, handler: BaseHTTPRequestHandler) -> None:
        self.seen.append(Seen(handler.path, handler.headers.get("Host", "")))
        route = self.routes.get(handler.path, Route(status=404))
        handler.send_response(route.status)
        if route.location is not None:
            handler.send_header("Location", route.location)
        if route.chunked:
            handler.send_header("Transfer-Encoding", "chunked")
        else:
            handler.send_header("Content-Length", str(len(route.body)))
        handler.end_headers()
        for piece in _pieces(route.body, 1024 if route.drip_s or route.chunked else 0):
            if route.drip_s and self._stop.wait(route.drip_s):
                return  # the test is over
            try:
                frame = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
                handler.wfile.write(frame if route.chunked else piece)
                handler.wfile.flush()
            except OSError:  # the client gave up (a refused size or a deadline)
                return
        if route.chunked:
            handler.wfile.write(b"0\r\n\r\n")

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _pieces(body: bytes, size: int) -> Iterator[bytes]:
    if not size:
        yield body
        return
    for i in range(0, len(body), size):
        yield body[i : i + size]


def serve_models() -> Iterator[ModelServer]:
    server = ModelServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
