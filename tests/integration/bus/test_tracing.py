"""Trace context across the bus: a batch handler's span links every message's producer span,
and each message gets a span of its own that continues its producer's trace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from seedance.core import Bus, Delivery, PullConsumer
from seedance.events.jobs import JobEvent
from seedance.events.subjects import jobs
from tests.integration.bus.test_bus import drain, spec_for, submitted


def in_memory_spans() -> InMemorySpanExporter:
    """An exporter that keeps every span finished from now on, in this process.

    The global provider can be set once per process: the first caller installs an SDK provider,
    later ones add their exporter to it (services configure tracing in their main(), which
    tests run as processes, so no other test sets one).
    """
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = in_memory_spans()
    yield exporter
    # The processor stays installed (a provider cannot drop one); later spans are not kept.
    exporter.clear()
    exporter.shutdown()


async def test_a_batch_span_links_each_message_producer(
    bus: Bus, unique: str, spans: InMemorySpanExporter
) -> None:
    tenant = f"t{unique}"
    sent = [submitted(tenant, f"job-{i}") for i in range(3)]
    for event in sent:
        await bus.publish(jobs.subject(tenant, "submitted"), event)
    producers = {
        s.context.span_id
        for s in spans.get_finished_spans()
        if s.name == f"publish {jobs.subject(tenant, 'submitted')}"
    }
    assert len(producers) == 3

    handled: list[str] = []

    async def batch(ds: list[Delivery[Any]]) -> list[None]:
        handled.extend(d.event.id for d in ds)
        return [None] * len(ds)

    spec = spec_for(tenant, unique)
    consumer = PullConsumer(spec, service="svc", types=JobEvent, batch_handler=batch, batch=10)
    await consumer.start(bus)
    await drain(consumer, lambda: len(handled) == 3)
    (span,) = [s for s in spans.get_finished_spans() if s.name == f"handle {spec.durable} batch"]
    assert span.kind == trace.SpanKind.CONSUMER
    assert {link.context.span_id for link in span.links} == producers
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 3
    # And one span per message, each a child of its producer's span (its trace goes on).
    per_message = [s for s in spans.get_finished_spans() if s.name == f"handle {spec.durable}"]
    assert len(per_message) == 3
    assert {s.parent.span_id for s in per_message if s.parent} == producers
    assert all(s.kind == trace.SpanKind.CONSUMER for s in per_message)


async def test_without_an_exporter_each_message_continues_its_producer_without_a_span(
    bus: Bus, unique: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No span exported (``spans_exported`` False, the services' default): no span per message,
    but each delivery carries its producer's context (what it causes continues that trace) and
    a per-message handler runs under it; the batch span still links every producer."""
    monkeypatch.setattr("seedance.core.consumer.spans_exported", lambda: False)
    tenant = f"t{unique}"
    for i in range(3):
        await bus.publish(jobs.subject(tenant, "submitted"), submitted(tenant, f"job-{i}"))
    producers = {
        (s.context.trace_id, s.context.span_id)
        for s in spans.get_finished_spans()
        if s.name == f"publish {jobs.subject(tenant, 'submitted')}"
    }
    assert len(producers) == 3

    carried: list[tuple[int, int]] = []

    async def batch(ds: list[Delivery[Any]]) -> list[None]:
        for d in ds:
            assert d.trace_context is not None
            context = trace.get_current_span(d.trace_context).get_span_context()
            carried.append((context.trace_id, context.span_id))
        return [None] * len(ds)

    spec = spec_for(tenant, unique)
    consumer = PullConsumer(spec, service="svc", types=JobEvent, batch_handler=batch, batch=10)
    await consumer.start(bus)
    try:
        await drain(consumer, lambda: len(carried) == 3)
    finally:
        await consumer.close()
    assert set(carried) == producers
    finished = spans.get_finished_spans()
    assert not [s for s in finished if s.name == f"handle {spec.durable}"]
    (span,) = [s for s in finished if s.name == f"handle {spec.durable} batch"]
    assert {(link.context.trace_id, link.context.span_id) for link in span.links} == producers

    # The per-message path: the handler runs with its producer's context current.
    current: list[tuple[int, int]] = []

    async def one(d: Delivery[Any]) -> None:
        context = trace.get_current_span().get_span_context()
        current.append((context.trace_id, context.span_id))

    again = spec_for(tenant, f"{unique}-one")
    consumer = PullConsumer(again, service="svc", types=JobEvent, handler=one, batch=10)
    await consumer.start(bus)
    try:
        await drain(consumer, lambda: len(current) == 3)
    finally:
        await consumer.close()
    assert set(current) == producers
    assert not [s for s in spans.get_finished_spans() if s.name == f"handle {again.durable}"]
