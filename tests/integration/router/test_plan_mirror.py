"""The planner's mirror of the reports when its origin is created again or it is deleted
(review1 findings 5, 7), on a real nats-server under the shipped authorisation.

``SEEDANCE_ROUTING`` deleted and created again: the mirror ``SEEDANCE_ROUTING_PLAN`` keeps the
old reports at the old sequences, drops the new ones and reports no error; the planner must
neither merge the stale ones nor skip the new ones. It refuses to plan (error, gauge) until an
operator deletes the mirror and provisions it again, then replays every new report. A mirror
deleted at run time is waited for (the router's user may not create it) until provision
creates it again, and planning goes on. This module deletes the catalogue's
streams, so it runs on a server of its own (``auth_url`` is per module).
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest
from nats.js.errors import NotFoundError
from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.core.kv import provision
from seedance.events.subjects import STREAMS, routing
from seedance.testing.waits import eventually
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _interval, _leading, _router

_ORIGIN = next(s for s in STREAMS if s.name == routing.STREAM)

# The lease is taken by hand and the clock jumps by bins (conftest.lease_held_by_hand).
pytestmark = pytest.mark.usefixtures("lease_held_by_hand")


@pytest.fixture(autouse=True)
async def fresh_streams(auth_url: str) -> None:
    """Both streams new for each test: one test's diverged mirror is not the next one's."""
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        for name in (routing.PLAN_STREAM, routing.STREAM):
            with contextlib.suppress(NotFoundError):
                await admin.js.delete_stream(name)
        await admin.ensure_streams()
    finally:
        await admin.close()


async def test_an_origin_created_again_stops_planning_until_the_mirror_is_rebuilt(
    auth_url: str, unique: str
) -> None:
    fleet = f"o{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        svc = await _router(bus, clock, fleet, "gw-a")
        plan, gauge = svc.fleet_plan, svc.metrics.plan_mirror_diverged
        assert plan.lease is not None
        assert await plan.lease.try_acquire()
        await plan.report(T0)
        assert await svc.planning.plan_once() == []
        rnd = random.Random(5)
        for k in range(1, 9):  # two minutes of reports, planned on
            assert len(await _interval([svc], [clock], rnd, T0 + 15 * k)) == 1
        seq_before = plan.seq
        assert seq_before > 8

        # The origin deleted and created again: its sequences restart at 1, the mirror keeps
        # the old reports (at sequences the new ones reuse) and takes no new one.
        await admin.js.delete_stream(routing.STREAM)
        await admin.ensure_streams([_ORIGIN])
        for k in range(9, 12):
            assert await _interval([svc], [clock], rnd, T0 + 15 * k) == []  # refused
            assert gauge._value.get() == 1
            assert plan.seq == 0  # moved back to the new origin's start, nothing stale read
        assert not plan.leading

        # The operator's fix (OPERATOR_FIX): the mirror deleted and provisioned again (the
        # router's user may not create it); it copies the new origin from its first message,
        # and every new report is merged.
        await admin.js.delete_stream(routing.PLAN_STREAM)
        await provision(admin)
        recs = await _interval([svc], [clock], rnd, T0 + 15 * 12)
        assert len(recs) == 1
        assert gauge._value.get() == 0
        assert plan.leading
        last = await admin.js.get_last_msg(routing.STREAM, routing.fleet_observed(fleet))
        assert plan.seq == last.seq  # every report of the new origin read
        # The 60 s since the origin was created again are all in the estimator (20 req/s),
        # the 45 s reported while planning was refused too.
        est = plan.estimators["m"]
        assert len(est.recent_arrivals(T0 + 180, 60)) == pytest.approx(20 * 60, rel=0.15)
    finally:
        for b in (bus, admin):
            await b.close()


async def test_a_restored_position_past_the_new_origin_skips_nothing(
    auth_url: str, unique: str
) -> None:
    """A planner restarted after the origin (and the mirror, by the operator) were created
    again: its saved sequence is past the new origin's last; the new reports are read."""
    fleet = f"r{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        first = await _leading(bus, clock, fleet, "gw-a")
        rnd = random.Random(6)
        for k in range(1, 5):
            assert len(await _interval([first], [clock], rnd, T0 + 15 * k)) == 1
        saved = first.fleet_plan.seq
        await first.fleet_plan.close()

        await admin.js.delete_stream(routing.STREAM)
        await admin.js.delete_stream(routing.PLAN_STREAM)
        await admin.ensure_streams()
        second = await _router(bus, clock, fleet, "gw-a")
        assert second.fleet_plan.lease is not None
        assert await second.fleet_plan.lease.try_acquire()
        recs: list[object] = []
        for k in range(5, 8):
            recs += await _interval([second], [clock], rnd, T0 + 15 * k)
        origin = await admin.js.stream_info(routing.STREAM)
        assert origin.state.last_seq < saved  # the case: the saved position is past it
        last = await admin.js.get_last_msg(routing.STREAM, routing.fleet_observed(fleet))
        assert second.fleet_plan.seq == last.seq
        assert recs  # planned again
        est = second.fleet_plan.estimators["m"]
        # 45 s of the new origin's reports merged, not skipped (the 60 s before them restored).
        assert len(est.recent_arrivals(T0 + 105, 45)) == pytest.approx(20 * 45, rel=0.15)
    finally:
        for b in (bus, admin):
            await b.close()


async def test_a_mirror_deleted_at_run_time_is_awaited_until_provision(
    auth_url: str, unique: str
) -> None:
    fleet = f"d{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        svc = await _leading(bus, clock, fleet, "gw-a")
        rnd = random.Random(7)
        for k in range(1, 4):
            assert len(await _interval([svc], [clock], rnd, T0 + 15 * k)) == 1
        await admin.js.delete_stream(routing.PLAN_STREAM)
        with capture_logs() as logs:  # the router's user may not create it: it waits
            waiting = asyncio.create_task(_interval([svc], [clock], rnd, T0 + 15 * 4))

            def said() -> bool:
                return any(
                    e["event"] == "stream_not_provisioned" and e["stream"] == routing.PLAN_STREAM
                    for e in logs
                )

            try:
                await eventually(said, 20.0, what="the planner waiting for its mirror")
                assert not waiting.done()
                assert bus.awaiting == frozenset()  # the replica still routes: still ready
                await provision(admin)  # the operator's
                assert len(await asyncio.wait_for(waiting, 20.0)) == 1
            finally:
                waiting.cancel()
        for k in range(5, 7):  # every interval planned on the mirror provision made
            assert len(await _interval([svc], [clock], rnd, T0 + 15 * k)) == 1
        assert (await admin.js.stream_info(routing.PLAN_STREAM)).config.mirror is not None
        est = svc.fleet_plan.estimators["m"]
        assert len(est.recent_arrivals(T0 + 90, 90)) == pytest.approx(20 * 90, rel=0.15)
    finally:
        for b in (bus, admin):
            await b.close()
