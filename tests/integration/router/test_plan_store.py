"""The fleet planner's state in a `StateStore` under the shipped ``router`` user.

The state was one KV value, cut to fit one message: above ~130 req/s fleet-wide a handover kept
less than the planner's 600 s of arrivals (review2 finding 4's limit). Now a plan commits what
it changed, a new leader loads the whole store, and an older planner's one-value snapshot is
read once as the store's first base. The bus, KV, lease and permissions are real.
"""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError

from seedance.core import Bus
from seedance.core.kv import ensure_bucket
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_leader import PLAN_BUCKET
from seedance.router.plan_state import ModelSnapshot, PlanSnapshot, legacy_key
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _router


def _arrivals(rate: float, start_s: float, span_s: float, seed: int) -> list[tuple[float, int]]:
    rnd = random.Random(seed)
    return sorted(
        (start_s + rnd.random() * span_s, rnd.randrange(50, 4000))
        for _ in range(int(rate * span_s))
    )


async def test_a_history_larger_than_one_message_survives_a_handover_whole(
    auth_url: str, unique: str
) -> None:
    fleet = f"w{unique}"[:30]
    bus_a = await Bus.connect(_as(auth_url, "router"))
    bus_b = await Bus.connect(_as(auth_url, "router"))
    try:
        clock = _Clock(T0)
        a = await _router(bus_a, clock, fleet, "gw-a")
        b = await _router(bus_b, clock, fleet, "gw-b")
        assert a.fleet_plan.lease is not None
        assert b.fleet_plan.lease is not None
        assert await a.fleet_plan.lease.try_acquire()
        await a.fleet_plan.ready()  # restores (nothing) and binds
        # 500 req/s over the estimator's 600 s: ~3.9 MB of arrivals, where the one-value
        # snapshot kept the newest ~1 MiB of them (about 130 s).
        a.fleet_plan.estimators["m"].observe_arrivals(_arrivals(500, T0 - 600, 600, 1))
        a.plans["m"] = replace(a.plans["m"], replicas=9, capacity_factor=2.5)
        assert await a.fleet_plan.save()
        whole_bytes = a.fleet_plan.store_stats.commit_bytes
        # One more bin, one more plan: the commit is that bin and the plan, not the history.
        a.fleet_plan.estimators["m"].observe_arrivals(_arrivals(500, T0, 15, 2))
        a.plans["m"] = replace(a.plans["m"], replicas=10)
        assert await a.fleet_plan.save()
        assert a.fleet_plan.store_stats.commit_bytes < whole_bytes / 20
        state = a.fleet_plan.estimators["m"].state()
        assert len(msgspec.msgpack.encode(state)) > 3 * bus_a.nc.max_payload
        # The gateway that does not plan follows the committed count.
        assert await b.fleet_plan.fleet_target() == 10

        await a.fleet_plan.close()  # the lease released: b takes over at once
        assert await b.fleet_plan.lease.try_acquire()
        await b.fleet_plan.ready()
        assert b.fleet_plan.leading
        assert b.plans["m"] == a.plans["m"]
        assert b.fleet_plan.estimators["m"].state() == state  # every arrival, none trimmed
        # The restored arrivals are the store's own bins: b's first commit after a bin of its
        # own is that bin, not the history written again.
        b.fleet_plan.estimators["m"].observe_arrivals(_arrivals(500, T0 + 15, 15, 3))
        assert await b.fleet_plan.save()
        assert 0 < b.fleet_plan.store_stats.commit_bytes < whole_bytes / 20
    finally:
        for bus in (bus_a, bus_b):
            await bus.close()


async def test_an_older_planners_snapshot_is_read_once_as_the_stores_first_base(
    auth_url: str, unique: str
) -> None:
    fleet = f"o{unique}"[:30]
    admin = await Bus.connect(_as(auth_url, "admin"))
    bus = await Bus.connect(_as(auth_url, "router"))
    try:
        await admin.ensure_streams()
        last = (await admin.js.stream_info("SEEDANCE_ROUTING")).state.last_seq
        est = LoadEstimator()
        est.observe_arrivals(_arrivals(50, T0 - 600, 600, 3))
        old = PlanSnapshot(
            seq=last,
            models={
                "m": ModelSnapshot(
                    plan=PlanState(replicas=7, capacity_factor=1.8), estimator=est.state()
                )
            },
        )
        kv = await ensure_bucket(admin, PLAN_BUCKET)
        # As a planner of before the store wrote it: the whole value under <fleet>.
        await kv.put(legacy_key(fleet), msgspec.msgpack.encode(old))

        clock = _Clock(T0)
        first = await _router(bus, clock, fleet, "gw-a")
        assert first.fleet_plan.lease is not None
        assert await first.fleet_plan.lease.try_acquire()
        await first.fleet_plan.ready()
        assert first.plans["m"] == old.models["m"].plan
        assert first.fleet_plan.estimators["m"].state() == old.models["m"].estimator
        assert first.fleet_plan.seq == last
        with pytest.raises(KeyNotFoundError):  # read once: the store is the state now
            await kv.get(legacy_key(fleet))
        await first.fleet_plan.close()

        # The next leader restores the same from the store (the migrated base).
        again = await _router(bus, clock, fleet, "gw-b")
        assert again.fleet_plan.lease is not None
        assert await again.fleet_plan.lease.try_acquire()
        await again.fleet_plan.ready()
        assert again.plans["m"] == old.models["m"].plan
        assert again.fleet_plan.estimators["m"].state() == old.models["m"].estimator
    finally:
        for b in (admin, bus):
            await b.close()
