"""The fleet planner's store under faults, with the shipped ``router`` user (review2 of the
plan-store merge): a commit whose reply was lost, a deposed leader's late base and late count.
Each test failed on the code before the fix; the bus, KV, lease and permissions are real.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any

import nats.errors

from seedance.core import Bus
from seedance.core.state_store import StateStore
from seedance.router.plan_state import state_prefix
from tests.integration.bus.test_state_store import LandsThenTimesOut
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _router


def _arrivals(rate: float, start_s: float, span_s: float, seed: int) -> list[tuple[float, int]]:
    rnd = random.Random(seed)
    return sorted(
        (start_s + rnd.random() * span_s, rnd.randrange(50, 4000))
        for _ in range(int(rate * span_s))
    )


async def test_a_commit_whose_reply_was_lost_is_reloaded_before_the_next(
    auth_url: str, unique: str
) -> None:
    fleet = f"x{unique}"[:30]
    bus_a = await Bus.connect(_as(auth_url, "router"))
    bus_b = await Bus.connect(_as(auth_url, "router"))
    try:
        clock = _Clock(T0 + 120)
        a = await _router(bus_a, clock, fleet, "gw-a")
        b = await _router(bus_b, clock, fleet, "gw-b")
        fp = a.fleet_plan
        flaky = LandsThenTimesOut(fp._kv)
        # Records of at most 150 KB, so that a commit of a few bins is several records (the
        # shipped 900 KiB is reached the same way by a few busy bins or models).
        fp._store = StateStore(flaky, state_prefix(fleet), part_bytes=150_000)  # type: ignore[arg-type]
        assert fp.lease is not None
        assert b.fleet_plan.lease is not None
        assert await fp.lease.try_acquire()
        await fp.ready()
        assert await fp.save()

        fp.estimators["m"].observe_arrivals(_arrivals(500, T0 - 60, 60, 1))
        fp.seq += 10
        a.plans["m"] = replace(a.plans["m"], replicas=5)
        flaky.armed = True
        assert await fp.save()  # landed, but the bus said it timed out
        assert not fp.leading  # restores before it commits again

        await fp.ready()  # the next interval
        assert fp.leading
        fp.estimators["m"].observe_arrivals(_arrivals(500, T0, 60, 2))
        fp.seq += 10
        a.plans["m"] = replace(a.plans["m"], replicas=6)
        assert await fp.save()
        s2 = (fp.seq, fp.estimators["m"].state(), a.plans["m"])
        await fp.close()

        assert await b.fleet_plan.lease.try_acquire()
        # The store as the next leader restores it (not `ready()`: its catch-up would rewind the
        # sequences this test advanced by hand, past the origin's last, to the origin's start).
        await b.fleet_plan._restore()
        # Before the fix: a mixture of the two commits (seq 20, 37,500 of 60,000 arrivals).
        assert (b.fleet_plan.seq, b.fleet_plan.estimators["m"].state(), b.plans["m"]) == s2
    finally:
        for bus in (bus_a, bus_b):
            await bus.close()


async def test_a_deposed_leaders_late_count_holds_one_commit_at_most(
    auth_url: str, unique: str
) -> None:
    fleet = f"c{unique}"[:30]
    buses = [await Bus.connect(_as(auth_url, "router")) for _ in range(3)]
    try:
        clock = _Clock(T0 + 120)
        a, b, c = [
            await _router(bus, clock, fleet, f"gw-{n}") for bus, n in zip(buses, "abc", strict=True)
        ]
        fa, fb = a.fleet_plan, b.fleet_plan
        assert fa.lease is not None
        assert fb.lease is not None
        assert await fa.lease.try_acquire()
        await fa.ready()
        a.plans["m"] = replace(a.plans["m"], replicas=3)
        assert await fa.save()
        assert await c.fleet_plan.fleet_target() == 3

        # a's next plan: the commit lands; the count's put is buffered by a client that is
        # reconnecting (its request times out) and reaches the server later.
        real_kv = fa._kv
        assert real_kv is not None
        late: list[tuple[str, bytes]] = []

        class _Buffered:
            def __getattr__(self, name: str) -> Any:
                return getattr(real_kv, name)

            async def put(self, key: str, value: bytes) -> int:
                late.append((key, value))
                raise nats.errors.TimeoutError

        fa._kv = _Buffered()  # type: ignore[assignment]
        a.plans["m"] = replace(a.plans["m"], replicas=4)
        assert await fa.save()
        await fa.lease.release()  # a's lease lapses (partitioned): b takes over

        assert await fb.lease.try_acquire()
        await fb.ready()  # restores a's commit
        b.plans["m"] = replace(b.plans["m"], replicas=8)
        assert await fb.save()
        assert await c.fleet_plan.fleet_target() == 8

        assert late
        for key, value in late:  # a's buffered put is flushed on reconnect
            await real_kv.put(key, value)
        assert await c.fleet_plan.fleet_target() == 4  # until b's next commit
        assert await fb.save()  # b plans 8 again, unchanged
        assert await c.fleet_plan.fleet_target() == 8  # was 4 for good before the fix
    finally:
        for bus in buses:
            await bus.close()


class _Paused:
    """The real KV; a base's writes stop after its first chunk until `go` is set (a stall:
    the event loop busy, a slow link), then go on."""

    def __init__(self, kv: Any) -> None:
        self._kv = kv
        self.go = asyncio.Event()
        self.chunks = 0
        self.stalled = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if ".b." in key:
            self.chunks += 1
            if self.chunks == 2:
                self.stalled.set()
                await self.go.wait()
        return await self._kv.update(key, value, last=last)


async def test_a_leader_standing_down_stops_its_base_and_the_next_loads(
    auth_url: str, unique: str
) -> None:
    fleet = f"b{unique}"[:30]
    bus_a = await Bus.connect(_as(auth_url, "router"))
    bus_b = await Bus.connect(_as(auth_url, "router"))
    try:
        clock = _Clock(T0 + 120)
        a = await _router(bus_a, clock, fleet, "gw-a")
        b = await _router(bus_b, clock, fleet, "gw-b")
        fa, fb = a.fleet_plan, b.fleet_plan
        paused = _Paused(fa._kv)
        fa._store = StateStore(  # type: ignore[arg-type]
            paused, state_prefix(fleet), slots=16, compact_records=2, part_bytes=60_000
        )
        fb._store = StateStore(fb._kv, state_prefix(fleet), slots=16, compact_records=2,  # type: ignore[arg-type]
                               part_bytes=60_000)  # fmt: skip
        assert fa.lease is not None
        assert fb.lease is not None
        assert await fa.lease.try_acquire()
        await fa.ready()
        for i in range(2):  # two commits of several chunks' worth: a base is due
            fa.estimators["m"].observe_arrivals(_arrivals(200, T0 - 120 + 60 * i, 60, i))
            a.plans["m"] = replace(a.plans["m"], replicas=3 + i)
            assert await fa.save()
        await asyncio.wait_for(paused.stalled.wait(), 10)  # chunk 0 written, the rest stalled

        await fa.lease.release()  # a's lease lapses; b takes over and loads
        assert await fb.lease.try_acquire()
        await fb.ready()
        assert fb.leading
        assert await fa.ready() is None  # a notices: it stands down, its base stopped
        paused.go.set()
        await asyncio.sleep(0)
        assert fa._store is not None
        assert fa._store._compacting is None

        fb.estimators["m"].observe_arrivals(_arrivals(200, T0, 60, 7))
        b.plans["m"] = replace(b.plans["m"], replicas=9)
        assert await fb.save()
        assert fb._store is not None
        assert fb._store._compacting is not None
        await fb._store._compacting  # b's own base
        state = (fb.seq, fb.estimators["m"].state(), b.plans["m"])
        await fb.close()

        assert await fa.lease.try_acquire()
        await fa.ready()  # before the fix: "two writers compacted at once", for good
        assert fa.leading
        assert (fa.seq, fa.estimators["m"].state(), a.plans["m"]) == state
    finally:
        for bus in (bus_a, bus_b):
            await bus.close()
