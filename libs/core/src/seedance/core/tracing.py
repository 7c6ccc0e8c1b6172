"""W3C trace context across NATS (inject into and extract from message headers), and the one
place a process's tracer provider and exporters are set up from the ``OTEL_*`` variables.

Set-up happens once, in a service's ``main()`` (``configure_tracing``, through
``seedance.core.entry``); library code only creates spans on whatever provider is installed and
must not configure one. The OTLP exporter is an optional extra of this library
(``seedance-gpu-core[otlp]``), imported only when asked for.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from seedance.core.errors import SettingsError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = [
    "EXPORTERS",
    "configure_tracing",
    "extract_context",
    "inject_headers",
    "new_root",
    "spans_exported",
    "tracer",
    "tracer_provider",
]

_propagator = TraceContextTextMapPropagator()


@functools.cache
def tracer() -> trace.Tracer:
    """Seedance's tracer, made once: a span per handled message asked the provider for a new
    tracer each time (7 % of a busy slicer's CPU). Made before ``configure_tracing`` it is the
    API's proxy, which turns to the real provider once one is installed."""
    return trace.get_tracer("seedance")


def spans_exported(provider: trace.TracerProvider | None = None) -> bool:
    """Whether a finished span goes anywhere: the provider (the installed one unless given) has
    a span processor.

    False for the SDK provider ``configure_tracing`` installs when ``OTEL_TRACES_EXPORTER`` is
    unset or ``none`` (Seedance's default) and for the API's no-op provider; True for one with an
    exporter's processor (or a test's in-memory one, added at any time). Consumers ask this per
    batch and make no per-message span while it is False (each cost ~35 us of a busy slicer's
    time for nothing). Only the SDK's processor list is read, a private attribute: a provider of
    another shape counts as exporting, so spans are never lost to an SDK change (a unit test
    pins the attribute)."""
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return False
    active = getattr(provider, "_active_span_processor", None)
    processors = getattr(active, "_span_processors", None)
    if not isinstance(processors, tuple):
        return True
    return bool(processors)


def inject_headers(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) of the current span (or of ``context``'s) to
    ``headers``."""
    _propagator.inject(headers, context=context)
    return headers


#: A version-00 ``traceparent`` in its one canonical form (what every W3C propagator writes).
_TRACEPARENT_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_EMPTY = Context()


def extract_context(headers: Mapping[str, str] | None) -> Context:
    """The trace context in ``headers`` (an empty context when there is none, or it is invalid).

    A canonical version-00 ``traceparent`` without ``tracestate`` (every message Seedance
    publishes) is read here, to the same context the W3C propagator gives, at ~40 % of its
    cost (it runs once per consumed message); anything else goes to the propagator."""
    traceparent = headers.get("traceparent") if headers else None
    if headers is None or traceparent is None:
        return Context()
    match = _TRACEPARENT_00.fullmatch(traceparent)
    if match is None or "tracestate" in headers:
        return _propagator.extract(dict(headers))
    trace_id, span_id, flags = match.groups()
    context = trace.SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16)),
    )
    if not context.is_valid:  # an all-zero id: no parent, as the propagator says
        return Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(context), _EMPTY)


def new_root(name: str, provider: trace.TracerProvider | None = None) -> Context:
    """The context of a new root span named ``name``, made without a span: what handling a
    message whose producer's context must not be continued (a tenant's:
    `seedance.events.subjects.published_by_tenant`) runs under while no span is exported
    (`spans_exported`), so that what it causes starts a trace of its own at ~1/7 of a span's
    cost (docs/bus.md). Its ids come from the provider's generator and its sampled flag from
    the provider's sampler, as a root span's would; under the API's no-op provider (whose
    spans are invalid) it is an empty context: no trace at all, never the producer's. The
    installed provider unless ``provider`` is given."""
    if provider is None:
        provider = trace.get_tracer_provider()
    ids = getattr(provider, "id_generator", None)
    sampler = getattr(provider, "sampler", None)
    if ids is None or sampler is None:
        return Context()
    trace_id = ids.generate_trace_id()
    result = sampler.should_sample(_EMPTY, trace_id, name, trace.SpanKind.CONSUMER)
    flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if result.decision.is_sampled() else 0)
    context = trace.SpanContext(trace_id, ids.generate_span_id(), False, trace_flags=flags)
    return trace.set_span_in_context(trace.NonRecordingSpan(context), _EMPTY)


#: What ``OTEL_TRACES_EXPORTER`` may name (a comma-separated list, as the specification says).
EXPORTERS = ("otlp", "console", "none")

#: The OTLP protocols (``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``) and the module that speaks each;
#: ``http/json`` has no Python exporter.
_OTLP_MODULES = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}

#: What to install for each protocol, said in the error when it is missing.
_OTLP_INSTALL = {
    "http/protobuf": "the core library's extra `seedance-gpu-core[otlp]` "
    "(opentelemetry-exporter-otlp-proto-http; every service and its image depend on it)",
    "grpc": "opentelemetry-exporter-otlp-proto-grpc (not shipped: Seedance's images speak "
    "OTLP over HTTP; set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf and port 4318)",
}


def configure_tracing(service_name: str, *, version: str | None = None) -> None:
    """Install ``tracer_provider``'s provider as this process's (once, in ``main()``)."""
    provider = tracer_provider(service_name, version=version)
    if provider is not None:
        trace.set_tracer_provider(provider)


def tracer_provider(service_name: str, *, version: str | None = None) -> TracerProvider | None:
    """An SDK tracer provider, configured by the standard ``OTEL_*`` variables of the process's
    environment (the SDK and the exporter read theirs from it too, so there is one source).

    ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP over HTTP/protobuf by default, to
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``,
    ``http://localhost:4318`` when neither is set; headers, timeout, compression and
    certificates from their ``OTEL_EXPORTER_OTLP_*`` variables, read by the exporter),
    ``console``, ``none``. Unset means ``none``, unlike the specification's ``otlp``: a service
    started without a collector must not log a failed export every few seconds. Spans are
    still made (and their ids logged) without an exporter, but for one per consumed message
    (`spans_exported`: the batch's span and the producers' contexts stand for them).
    ``OTEL_SERVICE_NAME`` (or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``) overrides
    ``service_name``;
    ``OTEL_SDK_DISABLED=true`` installs nothing (the API's no-op provider stays). Sampling
    (``OTEL_TRACES_SAMPLER``) and batching (``OTEL_BSP_*``) are the SDK's own.

    An exporter that is named but not installed, an unknown exporter or protocol, raises
    ``SettingsError`` naming the variable and what to install or set: the service ends with
    that one line, not a traceback. The provider flushes its spans and shuts down at exit
    (the SDK's ``atexit`` hook): what a drained service did still leaves the process.
    """
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env):
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            exporters.append(_otlp_exporter(env))
    # The resource from the environment first: OTEL_SERVICE_NAME must win over our default
    # (Resource.create lets explicit attributes override the environment's, so the default is
    # given only when the environment names no service).
    attributes = {} if _names_service(env) else {SERVICE_NAME: service_name}
    if version is not None:
        attributes[SERVICE_VERSION] = version
    provider = TracerProvider(resource=Resource.create(attributes))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    raw = env.get("OTEL_TRACES_EXPORTER", "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER={raw!r}: {', '.join(unknown)} is not an exporter Seedance "
            f"ships; expected {', '.join(EXPORTERS)} (comma-separated)"
        )
    return [] if "none" in names else names


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    var = next(
        (
            v
            for v in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
            if env.get(v, "").strip()
        ),
        None,
    )
    protocol = env[var].strip().lower() if var else "http/protobuf"
    module = _OTLP_MODULES.get(protocol)
    if module is None:
        raise SettingsError(
            f"{var}={protocol!r}: expected http/protobuf (the default, shipped) or grpc; "
            "the Python exporter has no http/json"
        )
    try:
        exporter_class = importlib.import_module(module).OTLPSpanExporter
    except ImportError as exc:
        raise SettingsError(
            f"OTEL_TRACES_EXPORTER=otlp over {protocol} needs the OTLP exporter, which is not "
            f"installed ({exc.name or module} is missing): install {_OTLP_INSTALL[protocol]}"
        ) from None
    return cast("SpanExporter", exporter_class())


def _names_service(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SERVICE_NAME", "").strip():
        return True
    pairs = (
        kv.split("=", 1)[0].strip() for kv in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(",")
    )
    return "service.name" in pairs
