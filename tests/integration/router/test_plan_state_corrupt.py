"""A stored plan state that does not decode stops planning, never the gateway.

review-reply p17: a tenant had the server write a JetStream publish ack over the fleet's
``<fleet>.plan.head`` (``seedance-router-plan``); every gateway that took the planner lease
restored it, got `CorruptState` and the whole process exited 78, two gateways in ~4 s. Here an
operator connection writes the same bytes over the head of a fleet that planned; a restarted
gateway (the shipped ``router`` user) takes the lease and must refuse to plan (error log naming
the key, gauge 1) and go on, and plan again once the operator removes the state.
"""

from __future__ import annotations

import random

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.core.kv import ensure_bucket, live_keys
from seedance.router.plan_leader import PLAN_BUCKET
from seedance.router.plan_state import state_prefix
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _interval, _leading, _router

# The lease is taken by hand and the clock jumps by bins (conftest.lease_held_by_hand).
pytestmark = pytest.mark.usefixtures("lease_held_by_hand")

#: What the server wrote there (its publish ack, review-reply p17).
PUB_ACK = b'{"stream":"SEEDANCE_JOBS","seq":1}'


async def test_a_plan_head_that_does_not_decode_stops_planning_not_the_gateway(
    auth_url: str, unique: str
) -> None:
    fleet = f"c{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    admin = await Bus.connect(_as(auth_url, "admin"))
    try:
        clock = _Clock(T0)
        first = await _leading(bus, clock, fleet, "gw-a")
        rnd = random.Random(7)
        for k in range(1, 4):  # planned and committed
            assert len(await _interval([first], [clock], rnd, T0 + 15 * k)) == 1
        await first.fleet_plan.close()  # the gateway stopped: its lease released

        kv = await ensure_bucket(admin, PLAN_BUCKET)
        head = f"{state_prefix(fleet)}.head"
        await kv.put(head, PUB_ACK)

        second = await _router(bus, clock, fleet, "gw-b")
        plan, gauge = second.fleet_plan, second.metrics.plan_state_refused
        assert plan.lease is not None
        assert await plan.lease.try_acquire()
        with capture_logs() as logs:
            for k in range(4, 6):  # refused at every interval, the gateway carries on
                assert await _interval([second], [clock], rnd, T0 + 15 * k) == []
                assert gauge._value.get() == 1
                assert not plan.leading
        refused = [e for e in logs if e["event"] == "plan_state_refused"]
        assert len(refused) == 2
        assert refused[0]["log_level"] == "error"
        assert f"state key '{head}' does not decode" in refused[0]["reason"]
        assert plan.lease.held  # kept: no other gateway restores it meanwhile

        # The operator's fix: the fleet's plan state purged (deleted keys would leave markers
        # the store's compare-and-set writes refuse); the next interval restores an empty
        # state (from the reports published from then on) and the one after plans.
        await admin.js.purge_stream(
            f"KV_{PLAN_BUCKET}", subject=f"$KV.{PLAN_BUCKET}.{state_prefix(fleet)}.>"
        )
        assert await live_keys(kv, state_prefix(fleet)) == {}
        assert await _interval([second], [clock], rnd, T0 + 15 * 6) == []
        assert gauge._value.get() == 0
        assert plan.leading
        assert len(await _interval([second], [clock], rnd, T0 + 15 * 7)) == 1
        await second.fleet_plan.close()
    finally:
        for b in (bus, admin):
            await b.close()
