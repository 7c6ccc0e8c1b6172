"""A tenant's trace context is a claim (review finding 9): the slicer's decisions from a
tenant's request start a trace of their own that links the tenant's context, never a child of
the tenant's span nor in its trace; a trusted observer's context is still their parent.

With and without spans exported: the consumer makes a root span linked to the tenant's, or,
with none, hands the durable runtime a new root's context (`seedance.core.tracing.new_root`)
for the effects' ``traceparent`` (the runtime's causes).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import pytest

from seedance.core import Bus
from seedance.events import decode, encode, new_event_id
from seedance.events.jobs import JobSubmitted, ResourceRequest
from seedance.events.slicing import Placement
from seedance.events.specs import Header
from seedance.events.subjects import jobs, observed, slicing
from seedance.testing.waits import wait_inventory_known
from seedance.testing.workloads import read_stream
from tests.integration.bus.test_tracing import in_memory_spans
from tests.integration.slicer.test_slicer_service import Decisions, add_nodes, inventory, slicer


def traceparent() -> tuple[str, int, int]:
    """A sampled W3C ``traceparent`` of fresh ids, and its trace and span ids."""
    trace_id, span_id = secrets.randbits(128) | 1, secrets.randbits(64) | 1
    return f"00-{trace_id:032x}-{span_id:016x}-01", trace_id, span_id


def parent_of(headers: dict[str, str] | None) -> tuple[int, int]:
    """The (trace id, parent span id) a message's ``traceparent`` names."""
    assert headers is not None
    assert "traceparent" in headers, headers
    _, trace_id, span_id, _ = headers["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16)


async def submit_with(bus: Bus, family: Any, tenant: str, job: str, header: str) -> None:
    """A job submitted on ``family``'s subject carrying the trace context ``header``."""
    ev = JobSubmitted(
        id=new_event_id(), at=datetime.now(UTC), job_id=job, tenant=tenant,
        request=ResourceRequest(gpus=1),
    )  # fmt: skip
    headers = {Header.TRACEPARENT.value: header, Header.MSG_ID.value: ev.id}
    await bus.js.publish(family.subject(tenant, "submitted"), encode(ev), headers=headers)


@pytest.mark.parametrize("exported", [False, True], ids=["no-exporter", "exporter"])
async def test_a_tenants_trace_is_linked_not_continued_a_trusted_observers_is(
    nats_url: str,
    tenants: tuple[Bus, Decisions, str, str],
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    exported: bool,
) -> None:
    spans = in_memory_spans()  # an SDK provider: new roots get ids, spans are kept
    if not exported:  # the services' default: no exporter, no span per message
        monkeypatch.setattr("seedance.core.consumer.spans_exported", lambda: False)
    bus, d, acme, globex = tenants
    claimed, tenant_trace, tenant_span = traceparent()
    seen, observer_trace, observer_span = traceparent()
    try:
        async with slicer(nats_url, unique):
            await add_nodes(bus, inventory(f"n0-{unique}", 8))
            # Known before the jobs come: each is placed by its own input, not by the node's.
            await wait_inventory_known(bus, timeout_s=10)
            await submit_with(bus, jobs, acme, "asked", claimed)
            await submit_with(bus, observed, globex, "seen", seen)
            await d.wait(lambda: bool(d.of(Placement, "asked")) and bool(d.of(Placement, "seen")))
        msgs = await read_stream(bus, "SEEDANCE_SLICING", 10.0, subject=slicing.PLACEMENTS)
        placed = {decode(m.data).job_id: parent_of(m.headers) for m in msgs}
        handled = [s for s in spans.get_finished_spans() if s.name == "handle slicer-jobs"]
    finally:
        spans.clear()
        spans.shutdown()

    trace_id, parent = placed["asked"]
    assert trace_id != tenant_trace  # not in the tenant's trace
    assert parent != tenant_span  # not the tenant's span's child
    trace_id, parent = placed["seen"]
    assert trace_id == observer_trace  # the observer's trace goes on
    if not exported:
        assert parent == observer_span  # its span's child, as no handling span is made
        assert not handled
        return
    # The handling spans: the observer's message's a child of its span, the tenant's a root
    # that links the tenant's span, and each decision a child of its input's handling span.
    by_id = {s.context.span_id: s for s in handled}
    observer_handling = by_id[parent]
    assert observer_handling.parent is not None
    assert observer_handling.parent.span_id == observer_span
    tenant_handling = by_id[placed["asked"][1]]
    assert tenant_handling.parent is None
    assert tenant_handling.context.trace_id == placed["asked"][0]
    assert [(ln.context.trace_id, ln.context.span_id) for ln in tenant_handling.links] == [
        (tenant_trace, tenant_span)
    ]
