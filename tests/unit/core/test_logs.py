"""Log lines written inside a span carry its trace and span ids (``add_trace_context``)."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from seedance.core.logs import add_trace_context


def test_a_line_inside_a_span_carries_its_ids() -> None:
    provider = TracerProvider()
    try:
        with provider.get_tracer("t").start_as_current_span("handle") as span:
            event = add_trace_context(None, "info", {"event": "placed"})
        context = span.get_span_context()
    finally:
        provider.shutdown()
    assert event["trace_id"] == f"{context.trace_id:032x}"
    assert event["span_id"] == f"{context.span_id:016x}"


def test_a_remote_parent_alone_gives_its_trace() -> None:
    # A context extracted from headers, with no span of ours started yet: the caller's ids.
    remote = trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(1),
    )
    with trace.use_span(trace.NonRecordingSpan(remote)):
        event = add_trace_context(None, "info", {"event": "x"})
    assert event["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert event["span_id"] == "b7ad6b7169203331"


def test_a_line_outside_any_span_is_left_alone() -> None:
    event: dict[str, Any] = {"event": "service_started"}
    assert add_trace_context(None, "info", dict(event)) == event
