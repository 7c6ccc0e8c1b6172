"""Trace context across the bus: a batch handler's span links every message's producer span,
and each message gets a span of its own that continues its producer's trace, but for a
tenant's message: its span (or, with no span exported, its context) is a new root that links
the tenant's, so nothing Seedance does is a child of a tenant's span or in a tenant's trace."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from seedance.core import Bus, Delivery, PullConsumer
from seedance.core.errors import RetryableError
from seedance.events.jobs import JobEvent
from seedance.events.subjects import ConsumerSpec, jobs, observed
from tests.integration.bus.test_bus import drain, submitted

#: Where a trusted observer publishes (its context is continued) and where a tenant does (its
#: context is only linked).
FAMILIES = [pytest.param(observed, id="trusted"), pytest.param(jobs, id="tenant")]


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


def spec_on(family: Any, tenant: str, unique: str) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"test-{unique}",
        stream=jobs.IN_STREAM,  # both families: the merged stream
        filter_subjects=(family.subject(tenant, "submitted"),),
    )


async def consume(bus: Bus, spec: ConsumerSpec, until: Any, **handler: Any) -> None:
    """A consumer of ``spec`` with ``handler`` (``handler=`` or ``batch_handler=``), fetched
    until ``until()`` holds, then closed."""
    consumer = PullConsumer(spec, service="svc", types=JobEvent, batch=10, **handler)
    await consumer.start(bus)
    try:
        await drain(consumer, until)
    finally:
        await consumer.close()


async def published(
    bus: Bus, family: Any, tenant: str, spans: InMemorySpanExporter
) -> set[tuple[int, int]]:
    """Three submits published on ``family``'s subject: their publish spans' (trace, span) ids."""
    subject = family.subject(tenant, "submitted")
    for i in range(3):
        await bus.publish(subject, submitted(tenant, f"job-{i}"))
    producers = {
        (s.context.trace_id, s.context.span_id)
        for s in spans.get_finished_spans()
        if s.name == f"publish {subject}"
    }
    assert len(producers) == 3
    return producers


def check_handled(
    family: Any, handled: list[tuple[int, int]], producers: set[tuple[int, int]]
) -> None:
    """A trusted producer's context is the handling's; a tenant's trace is not the handling's."""
    if family is observed:
        assert set(handled) == producers
    else:
        assert len(set(handled)) == len(handled) == 3
        assert all(trace_id and span_id for trace_id, span_id in handled)  # valid roots
        assert not {t for t, _ in handled} & {t for t, _ in producers}


@pytest.mark.parametrize("family", FAMILIES)
async def test_a_batch_span_links_each_message_producer(
    bus: Bus, unique: str, spans: InMemorySpanExporter, family: Any
) -> None:
    tenant = f"t{unique}"
    producers = await published(bus, family, tenant, spans)

    handled: list[str] = []

    async def batch(ds: list[Delivery[Any]]) -> list[None]:
        handled.extend(d.event.id for d in ds)
        return [None] * len(ds)

    spec = spec_on(family, tenant, unique)
    await consume(bus, spec, lambda: len(handled) == 3, batch_handler=batch)
    (span,) = [s for s in spans.get_finished_spans() if s.name == f"handle {spec.durable} batch"]
    assert span.kind == trace.SpanKind.CONSUMER
    ids = {(link.context.trace_id, link.context.span_id) for link in span.links}
    assert ids == producers
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 3
    # And one span per message: a child of its producer's span (its trace goes on), or for a
    # tenant's message a new root that links the tenant's span.
    per_message = [s for s in spans.get_finished_spans() if s.name == f"handle {spec.durable}"]
    assert len(per_message) == 3
    assert all(s.kind == trace.SpanKind.CONSUMER for s in per_message)
    if family is observed:
        assert {(s.parent.trace_id, s.parent.span_id) for s in per_message if s.parent} == producers
        assert not any(s.links for s in per_message)
    else:
        assert all(s.parent is None for s in per_message)
        linked = {(ln.context.trace_id, ln.context.span_id) for s in per_message for ln in s.links}
        assert linked == producers
        check_handled(family, [(s.context.trace_id, s.context.span_id) for s in per_message],
                      producers)  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
async def test_without_an_exporter_each_message_continues_its_producer_without_a_span(
    bus: Bus,
    unique: str,
    spans: InMemorySpanExporter,
    monkeypatch: pytest.MonkeyPatch,
    family: Any,
) -> None:
    """No span exported (``spans_exported`` False, the services' default): no span per message,
    but each delivery carries its producer's context (what it causes continues that trace) and
    a per-message handler runs under it; the batch span still links every producer. A tenant's
    message is handled under a new root's context instead (what it causes, and the lines
    logged meanwhile, are not in the tenant's trace)."""
    monkeypatch.setattr("seedance.core.consumer.spans_exported", lambda: False)
    tenant = f"t{unique}"
    producers = await published(bus, family, tenant, spans)

    carried: list[tuple[int, int]] = []

    async def batch(ds: list[Delivery[Any]]) -> list[None]:
        for d in ds:
            assert d.trace_context is not None
            context = trace.get_current_span(d.trace_context).get_span_context()
            carried.append((context.trace_id, context.span_id))
        return [None] * len(ds)

    spec = spec_on(family, tenant, unique)
    await consume(bus, spec, lambda: len(carried) == 3, batch_handler=batch)
    check_handled(family, carried, producers)
    finished = spans.get_finished_spans()
    assert not [s for s in finished if s.name == f"handle {spec.durable}"]
    (span,) = [s for s in finished if s.name == f"handle {spec.durable} batch"]
    assert {(link.context.trace_id, link.context.span_id) for link in span.links} == producers

    # The per-message path: the handler runs with its producer's (or a new root's) context
    # current: the one its log lines carry.
    current: list[tuple[int, int]] = []

    async def one(d: Delivery[Any]) -> None:
        context = trace.get_current_span().get_span_context()
        current.append((context.trace_id, context.span_id))

    again = spec_on(family, tenant, f"{unique}-one")
    await consume(bus, again, lambda: len(current) == 3, handler=one)
    check_handled(family, current, producers)
    assert not [s for s in spans.get_finished_spans() if s.name == f"handle {again.durable}"]


async def test_a_settle_that_logs_a_tenants_message_logs_a_new_roots_ids(
    bus: Bus, unique: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No span exported: a nak's log line (written under the delivery's context) carries a new
    root's trace and span ids, never the tenant's as the service's own."""
    monkeypatch.setattr("seedance.core.consumer.spans_exported", lambda: False)
    logged: list[tuple[int, int]] = []

    class Lines:
        """The consumer's logger: records the ids a line written now would carry."""

        def info(self, event: str, **fields: Any) -> None:
            context = trace.get_current_span().get_span_context()
            logged.append((context.trace_id, context.span_id))

    monkeypatch.setattr("seedance.core.consumer.log", Lines())
    tenant = f"t{unique}"
    producers = await published(bus, jobs, tenant, spans)

    async def later(ds: list[Delivery[Any]]) -> list[BaseException]:
        return [RetryableError("not yet", delay_s=60.0)] * len(ds)

    spec = spec_on(jobs, tenant, unique)
    await consume(bus, spec, lambda: len(logged) == 3, batch_handler=later)
    check_handled(jobs, logged, producers)
