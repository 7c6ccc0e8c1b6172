"""Trace context across the bus: a batch handler's span links every message's producer span."""

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


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once per process; no other test sets one (services
    # configure tracing in their main(), which tests run as processes).
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    # The provider stays installed (it cannot be replaced); later tests' spans are not kept.
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
