"""An OTLP/HTTP trace receiver for tests: what an OpenTelemetry collector's ``otlp`` receiver is
to a service's exporter, on a free loopback port.

It answers ``POST /v1/traces`` as the OTLP specification says: the body is a protobuf
``ExportTraceServiceRequest`` (``Content-Type: application/x-protobuf``, gzip-encoded or not),
decoded with the messages OpenTelemetry publishes (``opentelemetry-proto``), and the answer is
an ``ExportTraceServiceResponse``. Every span received is kept as a ``ReceivedSpan`` with its
resource's ``service.name``; ``wait_for`` waits (with a deadline) until spans matching a
predicate have arrived. So a test sees what a collector would see, from the real exporter
across a real process boundary, not what an in-process exporter was handed.

Usage::

    async with OtlpReceiver() as otlp:
        env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint}
        ... start a service with env ...
        spans = await otlp.wait_for(lambda s: s.trace_id == trace_id, timeout_s=60)

What it does not cover (a real collector does): OTLP over gRPC, OTLP/JSON (answered 415),
the metrics and logs signals (404), partial-success answers, throttling (429 with
``Retry-After``) and TLS; it keeps everything in memory and never drops.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = ["TRACES_PATH", "OtlpReceiver", "ReceivedSpan"]

#: The OTLP/HTTP path of the traces signal (the exporter adds it to OTEL_EXPORTER_OTLP_ENDPOINT).
TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it (ids as lowercase hex, as W3C writes them)."""

    service_name: str
    trace_id: str
    span_id: str
    #: Empty for a root span.
    parent_span_id: str
    name: str
    #: ``SPAN_KIND_CONSUMER``, ``SPAN_KIND_PRODUCER``... (the protobuf enum's names).
    kind: str
    scope: str
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    #: ``(trace_id, span_id)`` of each link.
    links: tuple[tuple[str, str], ...] = ()


class OtlpReceiver:
    """``POST /v1/traces`` on ``127.0.0.1:<free port>``; ``endpoint`` is the base URL."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        #: Each request as decoded, in arrival order (what the exporter sent, whole).
        self.requests: list[ExportTraceServiceRequest] = []
        #: Requests refused (status, reason): a wrong content type, a body that does not decode.
        self.refused: list[tuple[int, str]] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._port = 0

    @property
    def endpoint(self) -> str:
        """``OTEL_EXPORTER_OTLP_ENDPOINT`` for an exporter (the signal path is added to it)."""
        if self._runner is None:
            raise RuntimeError("start() the receiver first")
        return f"http://127.0.0.1:{self._port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post(TRACES_PATH, self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        # A socket bound here, so that the port is known without asking aiohttp's internals.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def wait_for(
        self, match: Callable[[ReceivedSpan], bool], timeout_s: float, *, count: int = 1
    ) -> list[ReceivedSpan]:
        """The spans received so far that ``match``, once there are ``count``; ``TimeoutError``
        (saying what did arrive) if there are fewer after ``timeout_s``. Woken by each request,
        never polling."""

        def found() -> list[ReceivedSpan]:
            return [s for s in self.spans if match(s)]

        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: len(found()) >= count)
        except TimeoutError:
            names = sorted({f"{s.service_name}: {s.name}" for s in self.spans})
            raise TimeoutError(
                f"{len(found())} of {count} matching spans within {timeout_s} s; "
                f"received {len(self.spans)} spans in {len(self.requests)} requests ({names}), "
                f"refused {self.refused}"
            ) from None
        return found()

    async def _traces(self, request: web.Request) -> web.Response:
        ctype = request.content_type
        if ctype != PROTOBUF:
            return await self._refuse(415, f"content type {ctype!r}: only {PROTOBUF} is served")
        body = await request.read()  # aiohttp inflates a body sent with Content-Encoding: gzip
        message = ExportTraceServiceRequest()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            return await self._refuse(400, f"not an ExportTraceServiceRequest: {exc}")
        async with self._changed:
            self.requests.append(message)
            self.spans.extend(_spans(message))
            self._changed.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF
        )

    async def _refuse(self, status: int, reason: str) -> web.Response:
        async with self._changed:
            self.refused.append((status, reason))
            self._changed.notify_all()
        return web.Response(status=status, text=reason)


def _spans(message: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    out: list[ReceivedSpan] = []
    for resource_spans in message.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            out.extend(
                _received(span, resource, scope_spans.scope.name) for span in scope_spans.spans
            )
    return out


def _received(span: Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
    return ReceivedSpan(
        service_name=str(resource.get("service.name", "")),
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        name=span.name,
        kind=Span.SpanKind.Name(span.kind),
        scope=scope,
        attributes=_attributes(span.attributes),
        resource=resource,
        links=tuple((ln.trace_id.hex(), ln.span_id.hex()) for ln in span.links),
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which)
