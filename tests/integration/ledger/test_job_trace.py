"""One trace per job: from the service that places it (linked to the SDK's submit, a tenant's
context: never its parent) through the ledger to its cost entries.

Real nats-server, the real SDK client and ledger service (in process, so that an in-memory
exporter sees their spans). The slicer's part is played by the shared pull consumer's batch path
with ``Bus.publish_many(causes=...)``: the library contract that carries a batching service's
effects on its causes' traces. The job's costs are produced while the ledger steps a later
sample (the one that closes their windows), yet they continue the job's trace, not the sample's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from seedance.core import Bus, Delivery, PullConsumer
from seedance.events import decode, derived_event_id
from seedance.events.cost import CostEntry
from seedance.events.jobs import JobSubmitted
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import ConsumerSpec, jobs, slicing, telemetry
from seedance.sdk import SeedanceClient
from seedance.testing.servers import NatsServer
from seedance.testing.workloads import START
from tests.conftest import serving
from tests.integration.bus.test_bus import drain
from tests.integration.bus.test_tracing import in_memory_spans
from tests.integration.ledger.test_ledger_service import caught_up, ledger, read_all, sample

pytestmark = pytest.mark.integration


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = in_memory_spans()
    yield exporter
    exporter.clear()
    exporter.shutdown()


def trace_id_of(headers: dict[str, str] | None) -> int:
    """The trace id of a W3C ``traceparent`` header (``00-<trace>-<span>-<flags>``)."""
    assert headers is not None
    assert "traceparent" in headers, headers
    return int(headers["traceparent"].split("-")[1], 16)


async def test_a_jobs_trace_runs_from_the_sdk_submit_to_its_cost_entries(
    bus: Bus, server: NatsServer, spans: InMemorySpanExporter, unique: str
) -> None:
    tenant, job, node = "acme", f"job-{unique}", f"trace-node-{unique}"

    async def place(ds: Sequence[Delivery[Any]]) -> list[None]:
        # The slicer's part: each job placed under its submit message's own span.
        placements = [
            (
                slicing.subject(tenant, "placement"),
                Placement(
                    id=derived_event_id(d.event.id, "placement"),
                    at=START,
                    job_id=d.event.job_id,
                    tenant=tenant,
                    node=node,
                    gpu_model="T4",
                    kind=PlacementKind.WHOLE,
                    gpus=[GpuAssignment(index=0)],
                ),
            )
            for d in ds
        ]
        await bus.publish_many(placements, causes=[d.trace_context for d in ds])
        return [None] * len(ds)

    spec = ConsumerSpec(
        durable=f"trace-{unique}", stream="SEEDANCE_JOBS",
        filter_subjects=(jobs.subject(tenant, "submitted"),),
    )  # fmt: skip
    placer = PullConsumer(spec, service="placer", types=JobSubmitted, batch_handler=place)
    await placer.start(bus)
    async with serving(ledger(server.url, f"trace{unique}")) as service:
        async with await SeedanceClient.connect(server.url) as client:
            await client.submit_job(tenant, job)
        await drain(placer, lambda: bool(spans_named(spans, f"handle {spec.durable}")))
        # A sample twenty minutes on closes the job's first windows: its costs are made now.
        await bus.publish(telemetry.sample(node), sample(node, 20))
        await caught_up(bus, service, 2)
    await placer.close()

    (submit,) = spans_named(spans, f"publish {jobs.subject(tenant, 'submitted')}")
    (handled,) = spans_named(spans, f"handle {spec.durable}")
    # The tenant's submit is a request: its handling is a new trace's root, linked to it.
    job_trace = handled.context.trace_id
    assert job_trace != submit.context.trace_id
    assert handled.parent is None
    assert [link.context.span_id for link in handled.links] == [submit.context.span_id]
    # The placement is stepped under a span of its own, continuing the job's trace; the sample
    # has one only if it produced costs (the server may source it before the placement: then
    # the late placement settles them), as no input that produces nothing gets a span.
    stepped = spans_named(spans, "handle ledger-in")
    assert job_trace in {s.context.trace_id for s in stepped}
    assert len(stepped) <= 2
    assert {s.context.trace_id for s in stepped} <= {job_trace, sample_trace(spans, node)}

    msgs = await read_all(bus, "SEEDANCE_COSTS", f"seedance.costs.{tenant}.entry")
    entries = [(decode(m.data, CostEntry), m.headers) for m in msgs]
    assert entries, "the sample closed the job's windows: cost entries expected"
    for entry, headers in entries:
        assert entry.job_id == job
        assert trace_id_of(headers) == job_trace  # the job's trace, not the sample's


def spans_named(spans: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in spans.get_finished_spans() if s.name == name]


def sample_trace(spans: InMemorySpanExporter, node: str) -> int:
    (published,) = spans_named(spans, f"publish {telemetry.sample(node)}")
    return int(published.context.trace_id)
