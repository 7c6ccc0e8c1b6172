"""structlog, configured once per process: JSON in deployment, console when run locally.

Every line written inside a span carries its ``trace_id`` and ``span_id`` (W3C hex, as
OpenTelemetry's log data model names them), so a log line leads to its trace and a trace to its
lines. Must not configure tracing (``seedance.core.tracing`` does) nor write anywhere but stderr.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import trace

__all__ = ["add_trace_context", "configure_logging", "get_logger"]


def add_trace_context(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: the current span's trace and span ids, when a span is current.

    Read from the context, not from a bound logger, so a line logged anywhere under a handled
    message's span (a library's record included) names that message's trace. A context with
    no valid span (outside any span, or ``OTEL_SDK_DISABLED``) adds nothing.
    """
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", trace.format_trace_id(context.trace_id))
        event.setdefault("span_id", trace.format_span_id(context.span_id))
    return event


#: Whether a logger keeps the configuration it first logged with (structlog's
#: ``cache_logger_on_first_use``: faster, and right for a process configured once). The test
#: session turns it off: its tests call entry points in-process, which configure logging, and a
#: cached logger would then ignore ``structlog.testing.capture_logs`` in every later test.
CACHE_LOGGERS = True


def configure_logging(*, json: bool | None = None, level: str = "INFO") -> None:
    """Configure structlog and route stdlib logging through the same processors.

    ``json=None`` picks JSON when stderr is not a terminal (containers, CI, log shippers).
    """
    if json is None:
        json = not sys.stderr.isatty()
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_context,
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=CACHE_LOGGERS,
    )
    # Libraries' stdlib records (nats-py, grpc, asyncio) go through the same renderer: one
    # structured line each, their tracebacks inside it (JSON escapes the newlines).
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.stdlib.get_logger(name)  # the same logger, with its type said
