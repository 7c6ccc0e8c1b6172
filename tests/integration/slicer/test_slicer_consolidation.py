"""Consolidation through the bus (issue 30): the slicer service runs its consolidation rounds
after batches, on trusted time, over its real state. A job that said it is movable
(``job.submitted.v1``'s ``movable``) is moved off a lightly used node: a ``slice.preempted.v1``
with reason ``consolidation`` and its explanation, then its placement elsewhere. A job that did
not say so is never moved. The disruption budget holds when a burst of ends leaves many nodes
light at once. Each round publishes the capacity plan per pool (GPU model) and exports it as
metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from seedance.core import Bus
from seedance.events import decode, new_event_id
from seedance.events.jobs import JobSubmitted, ResourceRequest
from seedance.events.slicing import CapacityPlan, Placement, Preempted
from seedance.events.subjects import jobs, slicing
from seedance.slicer.service import SlicerService
from seedance.testing.waits import next_matching
from tests.integration.slicer.test_slicer_service import (
    T0,
    Decisions,
    add_nodes,
    finish,
    inventory,
    nodes_known,
    slicer,
)
from tests.integration.slicer.test_slicer_service import env as env  # the fixture, reused

#: A round after every batch (trusted time moves between batches), so a test waits on events,
#: never on an interval.
EVERY_BATCH = {"consolidate_interval_s": 1e-6}


async def add_known(svc: SlicerService, bus: Bus, node: str, gpus: int) -> None:
    """Add `node` and wait until the slicer knows it, before a job that should run there is
    submitted. Inventory and jobs come through separate durables: a job decided first waits
    (``no_capacity``) and is placed by the inventory's batch, at the inventory's trusted time
    (its ``at``: `T0`, months before the server's receive time that dates a tenant's request).
    Such a job has "run" longer than the disruption budget's ``max_lost_s`` and is never
    moved: the flake of the movable case under load, reproduced by submitting first."""
    await add_nodes(bus, inventory(node, gpus))
    await nodes_known(svc, node)


async def one_movable_beside_a_full_node(
    svc: SlicerService, bus: Bus, d: Decisions, tenant: str, n0: str, n1: str, *, movable: bool
) -> None:
    """n0 (4 GPUs) filled by a-d, none movable; then n1 (4 GPUs) and `e` placed there, movable
    or not: the one move consolidation may make is e's, onto n0's freed GPUs."""
    await add_known(svc, bus, n0, 4)
    for j in "abcd":
        await submit(bus, tenant, j, movable=False)
    await d.wait(lambda: len(d.of(Placement)) == 4)
    await add_known(svc, bus, n1, 4)
    await submit(bus, tenant, "e", movable=movable)
    await d.wait(lambda: bool(d.of(Placement, "e")))


async def submit(bus: Bus, tenant: str, job: str, *, movable: bool, gpus: int = 1) -> None:
    ev = JobSubmitted(
        id=new_event_id(), at=T0 + timedelta(minutes=1), job_id=job, tenant=tenant,
        request=ResourceRequest(gpus=gpus), movable=movable,
    )  # fmt: skip
    await bus.publish(jobs.subject(tenant, "submitted"), ev)


def moves(d: Decisions) -> list[Preempted]:
    return [e for e in d.of(Preempted) if e.reason == "consolidation"]


async def settled(svc: SlicerService, d: Decisions, bus: Bus, tenant: str, probe: str) -> None:
    """Wait until a probe job submitted now is placed and a round ran after it, and every move
    the slicer recorded is on the bus."""
    await submit(bus, tenant, probe, movable=False, gpus=0)
    await d.wait(lambda: bool(d.of(Placement, probe)))

    def done() -> bool:
        snap = svc.scheduler.snapshot()
        ran = snap.moves.last_round_s is not None and snap.moves.last_round_s >= (
            svc.state.decided_s or 0.0
        )
        return ran and len(moves(d)) == sum(n for _, n in snap.moves.per_job)

    await d.wait(done)


@pytest.mark.parametrize("movable", [True, False])
async def test_only_a_job_that_said_it_is_movable_is_moved_and_placed_again(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, movable: bool
) -> None:
    bus, d = env
    t = f"t{unique}"
    n0, n1 = f"n0-{unique}", f"n1-{unique}"
    async with slicer(nats_url, unique, **EVERY_BATCH) as svc:
        await one_movable_beside_a_full_node(svc, bus, d, t, n0, n1, movable=movable)
        first = d.of(Placement, "e")[0]
        assert first.node == n1
        # Placed at its submit (the server's receive time), not at the inventory's T0.
        assert first.at - T0 > timedelta(days=1)
        # Two ends leave room on n0: e alone keeps n1 (a quarter used) busy.
        await finish(bus, t, "c")
        await finish(bus, t, "d")
        if movable:
            await d.wait(lambda: len(d.of(Placement, "e")) == 2)
            (moved,) = moves(d)
            assert (moved.job_id, moved.node, moved.by_job_id) == ("e", n1, "")
            assert f"node {n1} is being emptied" in moved.detail
            again = d.of(Placement, "e")[1]
            assert again.node == n0
        await settled(svc, d, bus, t, "probe")
        if not movable:
            assert moves(d) == []
            assert [p.node for p in d.of(Placement, "e")] == [n1]
        assert not [e for e in d.of(Preempted) if e.job_id != "e"]  # a..d never moved


@pytest.mark.parametrize(("per_window", "expected"), [(1, 1), (2, 2)])
async def test_the_disruption_budget_holds_under_a_burst_of_light_nodes(
    nats_url: str, env: tuple[Bus, Decisions], unique: str, per_window: int, expected: int
) -> None:
    bus, d = env
    t = f"t{unique}"
    budget = {
        "consolidate_min_per_window": per_window,
        "consolidate_window_fraction": 0.0,
        "consolidate_window_s": 3600.0,
    }
    async with slicer(nats_url, unique, **EVERY_BATCH, **budget) as svc:
        # Four 2-GPU nodes, each filled by a movable job and a filler, one node at a time.
        for i in range(4):
            await add_known(svc, bus, f"n{i}-{unique}", 2)
            await submit(bus, t, f"m{i}", movable=True)
            await submit(bus, t, f"f{i}", movable=False)
            await d.wait(lambda n=2 * (i + 1): len(d.of(Placement)) == n)
        # A burst: every filler ends, every node is half used, two drains would fit.
        for i in range(4):
            await finish(bus, t, f"f{i}")
        await settled(svc, d, bus, t, "probe-1")
        await settled(svc, d, bus, t, "probe-2")  # more rounds: the window's budget is spent
        assert len(moves(d)) == expected
        assert {m.job_id for m in moves(d)} <= {f"m{i}" for i in range(4)}


async def test_the_capacity_plan_per_pool_is_published_and_exported(
    nats_url: str, env: tuple[Bus, Decisions], unique: str
) -> None:
    bus, d = env
    t = f"t{unique}"
    pool = f"p{unique}"
    sub = await bus.js.subscribe(slicing.capacity(pool), ordered_consumer=True)
    try:
        async with slicer(nats_url, unique, **EVERY_BATCH) as svc:
            await add_nodes(bus, inventory(f"n0-{unique}", 4), inventory(f"n1-{unique}", 4))
            for j in ("a", "b", "c"):
                await submit(bus, t, j, movable=False)
            await d.wait(lambda: len(d.of(Placement)) == 3)

            # A round after the placements: the plan says 3 GPUs in use, one node needed, one
            # empty node releasable (headroom: none yet, observed for less than a start-up).
            # The slicer publishes a plan every round: bounded by the clock, not a cancel.
            def three_in_use(msg: Any) -> bool:
                plan = decode(msg.data)
                assert isinstance(plan, CapacityPlan)
                return plan.gpus_in_use == 3

            msg = await next_matching(sub, three_in_use, 15, what="a plan of 3 GPUs in use")
            plan = decode(msg.data)
            assert isinstance(plan, CapacityPlan)
            assert (plan.pool, plan.gpu_model, plan.nodes, plan.gpus_per_node) == (pool, "T4", 2, 4)
            assert (plan.nodes_busy, plan.nodes_needed, plan.releasable_nodes) == (1, 1, 1)
            assert msg.subject == slicing.capacity(pool)

            def gauge(state: str) -> float | None:
                return svc._rt.registry.get_sample_value(
                    "seedance_slicer_capacity_nodes", {"gpu_model": "T4", "state": state}
                )

            await d.wait(lambda: gauge("needed") == 1.0 and gauge("releasable") == 1.0)
            assert gauge("present") == 2.0
    finally:
        await sub.unsubscribe()
