"""Two gateways that both believe they lead a fleet (a split brain), and a gateway's bin too
large for one message, under the shipped users.

Review2 finding 9: a planner whose snapshot write was refused (another leader wrote since)
still published and followed its decision, and binding the shared ``router-plan-<fleet>``
consumer deleted the other leader's reader. Now the refused write means superseded: that
decision is dropped, the lease given up; and each leader reads with its own consumer.
"""

from __future__ import annotations

import random

import pytest

from seedance.core import Bus
from seedance.core.kv import ensure_bucket
from seedance.events import decode
from seedance.events.routing import PlanObservations
from seedance.events.subjects import routing
from tests.integration.router.test_plan_leader import (
    T0,
    _as,
    _Clock,
    _expire_lease,
    _interval,
    _router,
)

# The lease is taken by hand and the clock jumps by bins (conftest.lease_held_by_hand).
pytestmark = pytest.mark.usefixtures("lease_held_by_hand")


async def _count(admin: Bus, subject: str) -> int:
    info = await admin.js.stream_info("SEEDANCE_ROUTING", subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_a_superseded_leader_acts_on_nothing_and_leaves_the_others_reader(
    auth_url: str, unique: str
) -> None:
    fleet = f"s{unique}"[:30]
    bus_a = await Bus.connect(_as(auth_url, "router"))
    bus_b = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock_a, clock_b = _Clock(T0), _Clock(T0)
        a = await _router(bus_a, clock_a, fleet, "gw-a")
        b = await _router(bus_b, clock_b, fleet, "gw-b")
        assert a.fleet_plan.lease is not None
        assert b.fleet_plan.lease is not None
        assert await a.fleet_plan.lease.try_acquire()
        await a.fleet_plan.report(T0)
        await b.fleet_plan.report(T0)
        assert await a.planning.plan_once() == []
        rnd = random.Random(5)
        for k in range(4):
            assert len(await _interval([a, b], [clock_a, clock_b], rnd, T0 + 15 * (k + 1))) == 1
        # a stalls past its lease (it has not refreshed: it still thinks it holds it) and b
        # takes the lapsed lease, resumes from a's snapshot and writes its own.
        await _expire_lease(admin, fleet)
        assert await b.fleet_plan.lease.try_acquire()
        assert a.fleet_plan.lease.held
        end_s = T0 + 15 * 5
        for svc, clock in ((a, clock_a), (b, clock_b)):
            clock.t = end_s
            await svc.fleet_plan.report(end_s + 0.01)
        assert len(await b.planning.plan_once()) == 1
        # a plans too (its own reader has bin 5), finds its snapshot write refused:
        # superseded, it publishes nothing and gives the lease up.
        subject = routing.subject("m", "replicas")
        published = await _count(admin, subject)
        assert await a.planning.plan_once() == []
        assert await _count(admin, subject) == published
        assert not a.fleet_plan.leading
        assert not a.fleet_plan.lease.held  # given up; b's key left alone
        assert a.metrics.plans_superseded._value.get() == 1
        assert (
            await (await ensure_bucket(admin, "seedance-leases")).get(f"router-plan.{fleet}")
        ).value == b"gw-b"
        # b's reader survived a's binding (each leader's consumer has its own name) ...
        names = [f"router-plan-{fleet}-gw-a", f"router-plan-{fleet}-gw-b"]
        info = await admin.js.consumer_info(routing.PLAN_STREAM, names[1])
        assert info.name == names[1]
        # ... and b goes on planning alone; a does not take the lease back.
        recs = await _interval([a, b], [clock_a, clock_b], rnd, T0 + 15 * 6)
        assert len(recs) == 1
        assert b.fleet_plan.leading
        assert not await a.fleet_plan.lease.try_acquire()
    finally:
        for bus in (bus_a, bus_b, admin):
            await bus.close()


async def test_a_bin_too_large_for_one_message_reaches_the_stream_in_parts(
    auth_url: str, unique: str
) -> None:
    """Review2 finding 5: ~2700 req/s of one model fill the server's 1 MiB per 15 s bin."""
    fleet = f"z{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        svc = await _router(bus, clock, fleet, f"gw{unique}"[:30])
        before = await admin.js.stream_info("SEEDANCE_ROUTING")
        n = 60_000  # 4000 req/s over the bin
        for i in range(n):
            svc.fleet_plan.arrivals.record("m", T0 + i * 15 / n, 1024 + i % 3000)
        await svc.fleet_plan.report(T0 + 15.01)
        info = await admin.js.stream_info("SEEDANCE_ROUTING")
        added = info.state.last_seq - before.state.last_seq
        assert added >= 2  # split
        got = 0
        for seq in range(before.state.last_seq + 1, info.state.last_seq + 1):
            msg = await admin.js.get_msg("SEEDANCE_ROUTING", seq)
            assert msg.data is not None
            assert len(msg.data) <= bus.nc.max_payload
            event = decode(msg.data, PlanObservations)
            if event.gateway == svc.fleet_plan.gateway:
                got += len(event.arrivals)
        assert got == n
        assert svc.metrics.observations_dropped.labels("too_large")._value.get() == 0
    finally:
        for b in (bus, admin):
            await b.close()
