"""W3C trace context across NATS: inject into and extract from message headers.

Set-up of exporters happens once, in a service's ``main()`` (``configure_tracing``); library code
only creates spans on whatever provider is installed.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["configure_tracing", "extract_context", "inject_headers", "tracer"]

_propagator = TraceContextTextMapPropagator()


@functools.cache
def tracer() -> trace.Tracer:
    """Seedance's tracer, made once: a span per handled message asked the provider for a new
    tracer each time (7 % of a busy slicer's CPU). Made before ``configure_tracing`` it is the
    API's proxy, which turns to the real provider once one is installed."""
    return trace.get_tracer("seedance")


def inject_headers(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) of the current span (or of ``context``'s) to
    ``headers``."""
    _propagator.inject(headers, context=context)
    return headers


def extract_context(headers: Mapping[str, str] | None) -> Context:
    return _propagator.extract(dict(headers or {}))


def configure_tracing(service_name: str) -> None:
    """Install an SDK tracer provider. Spans are exported only when ``OTEL_TRACES_EXPORTER`` says
    where (``console``, or ``otlp`` with the opentelemetry-exporter-otlp package installed)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "none")
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        # An optional extra, not installed with the workspace: the import is checked at run time.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
