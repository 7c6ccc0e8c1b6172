"""A tenant's claimed time and a node's facts cannot move the slicer's decisions (issue 27,
items 3 and 5), against a real nats-server.

Each test failed on the slicer before the change: a finish back-dated 4.9 s (inside the 5 s
"claim skew" then honoured) placed the waiting tenant before its own submit; a submit at +4.9 s
and a finish at -4.9 s gave the job a negative span (the ledger billed it nothing); an
inventory for one node on another node's subject, or dated 290 s ahead, was taken as a fact;
a trusted observer's report of an end before the waiting job's submit placed that job then;
its report of a job's end after the job's submit but before its placement released it before
the placement (the ledger, whose end ends only allocations started before it, billed it for
ever).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from seedance.core import Bus
from seedance.events import decode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import JobCancelled, JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import (
    JobRejected,
    JobReleased,
    Placement,
    Preempted,
    Unschedulable,
)
from seedance.events.subjects import dlq, jobs, observed, telemetry
from seedance.events.telemetry import NodeInventory, NodeState
from seedance.slicer.service import SlicerService
from seedance.testing.identities import as_user
from seedance.testing.waits import eventually
from tests.integration.slicer.test_slicer_service import (
    Decisions,
    inventory,
    slicer,
)


@pytest.fixture
async def letters(bus: Bus, unique: str) -> AsyncIterator[list[DeadLetter]]:
    """The slicer's dead letters of this test's subjects."""
    got: list[DeadLetter] = []

    async def collect(msg: Any) -> None:
        letter = decode(msg.data, DeadLetter)
        if unique in letter.subject:
            got.append(letter)

    sub = await bus.nc.subscribe(dlq.subject("slicer"), cb=collect)
    try:
        yield got
    finally:
        await sub.unsubscribe()


def now() -> datetime:
    return datetime.now(UTC)


async def live_node(bus: Bus, svc: SlicerService, node: str, gpus: int, model: str = "T4") -> None:
    """A node whose inventory is dated now, as a live collector's is (the helper's T0 would
    date every placement it causes months back), known to the slicer before anything else."""
    inv = inventory(node, gpus, model)
    await bus.publish(telemetry.inventory(node), NodeInventory(**{**_fields(inv), "at": now()}))

    async def known() -> bool:
        return node in svc.scheduler.node_names

    await eventually(known, 15)


async def submit(bus: Bus, tenant: str, job: str, at: datetime, gpus: int = 1) -> None:
    ev = JobSubmitted(
        id=new_event_id(), at=at, job_id=job, tenant=tenant, request=ResourceRequest(gpus=gpus)
    )
    await bus.publish(jobs.subject(tenant, "submitted"), ev)


async def finish(bus: Bus, tenant: str, job: str, at: datetime) -> None:
    ev = JobFinished(id=new_event_id(), at=at, job_id=job, tenant=tenant)
    await bus.publish(jobs.subject(tenant, "finished"), ev)


def of(d: Decisions, kind: type, tenant: str, job: str) -> list[Any]:
    return [e for e in d.of(kind, job) if e.tenant == tenant]


def refused(svc: SlicerService, reason: str) -> float:
    value = svc._rt.registry.get_sample_value(
        "seedance_slicer_refused_node_facts_total", {"reason": reason}
    )
    return value or 0.0


async def test_a_back_dated_finish_never_places_the_waiting_tenant_before_its_submit(
    nats_url: str, tenants: tuple[Bus, Decisions, str, str], unique: str
) -> None:
    bus, d, acme, globex = tenants
    async with slicer(nats_url, unique) as svc:
        await live_node(bus, svc, f"n0-{unique}", 1)
        await submit(bus, acme, "holder", now())
        await d.wait(lambda: bool(of(d, Placement, acme, "holder")))
        await submit(bus, globex, "waiting", now())
        await d.wait(lambda: bool(of(d, Unschedulable, globex, "waiting")))
        (waited,) = of(d, Unschedulable, globex, "waiting")
        # acme ends its job "4.9 s ago": before globex asked, and maybe before it was placed.
        await finish(bus, acme, "holder", now() - timedelta(seconds=4.9))
        await d.wait(lambda: bool(of(d, Placement, globex, "waiting")))
        (placed,) = of(d, Placement, globex, "waiting")
        (released,) = of(d, JobReleased, acme, "holder")
        (held,) = of(d, Placement, acme, "holder")
        assert placed.at >= waited.at, "placed before its own submit"
        assert released.at >= held.at >= waited.at - timedelta(seconds=60)
        assert released.at >= waited.at  # the GPUs were freed after globex's wait began
        assert placed.at == released.at
        assert released.claimed_at is not None
        assert released.claimed_at < released.at


async def test_claims_on_both_ends_never_shrink_or_invert_a_jobs_span(
    nats_url: str, tenants: tuple[Bus, Decisions, str, str], unique: str
) -> None:
    bus, d, acme, _ = tenants
    async with slicer(nats_url, unique) as svc:
        await live_node(bus, svc, f"n0-{unique}", 1)
        sent = now()
        await submit(bus, acme, "short", sent + timedelta(seconds=4.9))
        await d.wait(lambda: bool(of(d, Placement, acme, "short")))
        seen_placed = now()
        (placed,) = of(d, Placement, acme, "short")
        # Placed when received (on the server's clock: between sending and seeing it), not at
        # the claim 4.9 s ahead.
        assert sent <= placed.at <= seen_placed
        ended = now()
        await finish(bus, acme, "short", ended - timedelta(seconds=4.9))
        await d.wait(lambda: bool(of(d, JobReleased, acme, "short")))
        (released,) = of(d, JobReleased, acme, "short")
        assert released.at >= ended, "the finish's claim moved the end"
        # The span billed (placement to release) is the time the job really held the GPU.
        assert released.at - placed.at >= ended - seen_placed > timedelta(0)


async def test_a_node_fact_dated_before_a_submit_never_places_or_ends_a_job_before_it(
    nats_url: str, tenants: tuple[Bus, Decisions, str, str], unique: str
) -> None:
    """A node agent's clock behind the server's (or a replayed inventory): the capacity it
    adds places the waiting job no earlier than its submit (billing starts at the placement),
    and a back-dated removal ends the job no earlier than its placement (billing ends there).
    On the slicer before the change both were stamped with the inventory's own `at`."""
    bus, d, acme, _ = tenants
    late = f"n1-{unique}"
    async with slicer(nats_url, unique) as svc:
        await live_node(bus, svc, f"n0-{unique}", 1)
        await submit(bus, acme, "holder", now())
        await d.wait(lambda: bool(of(d, Placement, acme, "holder")))
        await submit(bus, acme, "waiting", now())
        await d.wait(lambda: bool(of(d, Unschedulable, acme, "waiting")))
        (waited,) = of(d, Unschedulable, acme, "waiting")  # at the submit, as the slicer took it
        behind = waited.at - timedelta(minutes=10)
        added = NodeInventory(**{**_fields(inventory(late, 1)), "at": behind})
        await bus.publish(telemetry.inventory(late), added)
        await d.wait(lambda: bool(of(d, Placement, acme, "waiting")))
        (placed,) = of(d, Placement, acme, "waiting")
        assert placed.node == late
        assert placed.at >= waited.at, "placed before its own submit"
        earlier = behind - timedelta(minutes=1)  # dated even before the node was added
        gone = NodeInventory(
            **{**_fields(added), "id": new_event_id(), "state": NodeState.REMOVED, "at": earlier}
        )
        await bus.publish(telemetry.inventory(late), gone)
        await d.wait(lambda: bool(of(d, Preempted, acme, "waiting")))
        (evicted,) = of(d, Preempted, acme, "waiting")
        assert evicted.at >= placed.at, "billing ended before it started"


async def test_an_observers_back_dated_end_never_places_the_waiting_job_before_its_submit(
    nats_url: str, tenants: tuple[Bus, Decisions, str, str], unique: str
) -> None:
    """A trusted observer (the replayer, with its shipped user) reports the holder's end at a
    time after the holder was placed and before the waiting job was asked for: the release
    keeps the report's time (the past it reports is billed there), the waiting job is placed
    at its own submit, never before (billing starts at the placement)."""
    bus, d, acme, globex = tenants
    replayer = await Bus.connect(as_user(nats_url, "replayer"))
    try:
        async with slicer(nats_url, unique) as svc:
            await live_node(bus, svc, f"n0-{unique}", 1)
            await submit(bus, acme, "holder", now())
            await d.wait(lambda: bool(of(d, Placement, acme, "holder")))
            await submit(bus, globex, "waiting", now())
            await d.wait(lambda: bool(of(d, Unschedulable, globex, "waiting")))
            (held,) = of(d, Placement, acme, "holder")
            (waited,) = of(d, Unschedulable, globex, "waiting")  # at its submit
            assert held.at < waited.at
            ended = held.at + (waited.at - held.at) / 2
            report = JobFinished(id=new_event_id(), at=ended, job_id="holder", tenant=acme)
            await replayer.publish(observed.subject(acme, "finished"), report)
            await d.wait(lambda: bool(of(d, Placement, globex, "waiting")))
            (placed,) = of(d, Placement, globex, "waiting")
            (released,) = of(d, JobReleased, acme, "holder")
            assert released.at == ended  # the observer's past, for what it observed
            assert placed.at >= waited.at, "placed before its own submit"
            assert placed.at == waited.at  # no later either: the GPU was free by then
    finally:
        await replayer.close()


async def test_an_observers_end_between_submit_and_placement_is_never_before_the_placement(
    nats_url: str, tenants: tuple[Bus, Decisions, str, str], unique: str
) -> None:
    """The bridge's delayed report: globex's job, asked for and waiting, is placed when a node
    joins (an ordinary input); then a trusted observer reports it cancelled at a time while it
    waited. Its release is dated at its placement, never before it."""
    bus, d, acme, globex = tenants
    replayer = await Bus.connect(as_user(nats_url, "replayer"))
    try:
        async with slicer(nats_url, unique) as svc:
            await live_node(bus, svc, f"n0-{unique}", 1)
            await submit(bus, acme, "holder", now())
            await d.wait(lambda: bool(of(d, Placement, acme, "holder")))
            await submit(bus, globex, "y", now())
            await d.wait(lambda: bool(of(d, Unschedulable, globex, "y")))
            (waited,) = of(d, Unschedulable, globex, "y")
            await live_node(bus, svc, f"n1-{unique}", 1)  # room: y is placed now
            await d.wait(lambda: bool(of(d, Placement, globex, "y")))
            (placed,) = of(d, Placement, globex, "y")
            assert placed.at > waited.at
            ended = waited.at + (placed.at - waited.at) / 2  # cancelled while it waited
            report = JobCancelled(id=new_event_id(), at=ended, job_id="y", tenant=globex)
            await replayer.publish(observed.subject(globex, "cancelled"), report)
            await d.wait(lambda: bool(of(d, JobReleased, globex, "y")))
            (released,) = of(d, JobReleased, globex, "y")
            assert released.at == placed.at, "released before it was placed: billed for ever"
    finally:
        await replayer.close()


async def test_a_node_speaking_for_another_node_or_from_the_future_is_dead_lettered(
    nats_url: str,
    tenants: tuple[Bus, Decisions, str, str],
    letters: list[DeadLetter],
    unique: str,
) -> None:
    bus, d, acme, _ = tenants
    a10, victim = f"a10-{unique}", f"victim-{unique}"
    async with slicer(nats_url, unique) as svc:
        await live_node(bus, svc, victim, 4, model="A10")
        # With node a10's credentials (its own subject), an inventory naming the victim and
        # relabelling its four A10s as H100s; then the victim's own subject, dated 290 s ahead.
        forged = inventory(victim, 4, model="H100")
        await bus.publish(telemetry.inventory(a10), forged)
        ahead = NodeInventory(
            **{**_fields(inventory(victim, 4, model="H100")), "at": now() + timedelta(seconds=290)}
        )
        await bus.publish(telemetry.inventory(victim), ahead)
        await d.wait(lambda: len(letters) == 2)
        by_kind = {letter.error_kind: letter for letter in letters}
        assert set(by_kind) == {"subject_mismatch", "future_time"}
        assert by_kind["subject_mismatch"].subject == telemetry.inventory(a10)
        assert f"node {victim!r}" in by_kind["subject_mismatch"].reason
        assert "s after the server's receive time" in by_kind["future_time"].reason
        assert refused(svc, "subject_mismatch") == 1.0
        assert refused(svc, "future_time") == 1.0
        # The victim still has its A10s: a job asking for an H100 waits, an A10 job is placed.
        await submit_model(bus, acme, "h100", "H100")
        await submit_model(bus, acme, "a10", "A10")
        await d.wait(lambda: bool(of(d, Placement, acme, "a10")))
        await d.wait(
            lambda: bool(of(d, Unschedulable, acme, "h100") or of(d, JobRejected, acme, "h100"))
        )
        assert not of(d, Placement, acme, "h100")


def _fields(inv: NodeInventory) -> dict[str, Any]:
    return {f: getattr(inv, f) for f in inv.__struct_fields__}


async def submit_model(bus: Bus, tenant: str, job: str, model: str) -> None:
    ev = JobSubmitted(
        id=new_event_id(),
        at=now(),
        job_id=job,
        tenant=tenant,
        request=ResourceRequest(gpus=1, gpu_models=[model]),
    )
    await bus.publish(jobs.subject(tenant, "submitted"), ev)
