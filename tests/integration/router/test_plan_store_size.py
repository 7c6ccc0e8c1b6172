"""What the fleet planner's store keeps on the server, and the move from the older store, with
the shipped ``router`` user (review2 of the plan store: 1024 journal slots kept 22.3 MB on the
server for a 0.8 MB state).
"""

from __future__ import annotations

import random
import zlib
from dataclasses import replace

import msgspec

from seedance.core import Bus
from seedance.core.kv import live_keys
from seedance.core.state_store import Head, StateStore
from seedance.router.plan_state import STORE_SLOTS, older_state_prefix, state_prefix
from tests.integration.router.test_plan_leader import T0, _as, _Clock, _router


async def test_the_store_keeps_its_slots_and_a_base_not_a_thousand_records(
    auth_url: str, unique: str
) -> None:
    fleet = f"g{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    try:
        svc = await _router(bus, _Clock(T0), fleet, "gw-a")
        store, kv = svc.fleet_plan._store, svc.fleet_plan._kv
        assert store is not None
        assert kv is not None
        await store.load()
        rng = random.Random(3)
        bin_bytes = 20_000  # one released bin a commit (incompressible), 40 in the window
        for n in range(1100):  # 1100 plans at 15 s: 4.6 h
            changes: dict[str, bytes | None] = {f"a/{n}/0/m": rng.randbytes(bin_bytes)}
            if n >= 40:
                changes[f"a/{n - 40}/0/m"] = None
            await store.commit(changes)
        await store.close()
        state = sum(len(v) for v in store.entries.values())
        # The bucket keeps one value a key (history 1): what the server keeps for this store.
        keys = await live_keys(kv, state_prefix(fleet))
        kept = sum([len((await kv.get(k)).value or b"") for k in keys])
        print(f"state {state / 1e6:.2f} MB, server keeps {kept / 1e6:.2f} MB for the store")
        assert kept < 4 * (state + store.stats.base_bytes)  # 1024 slots: 22.3 MB, 28x
        assert len([k for k in keys if ".j." in k]) <= STORE_SLOTS
    finally:
        await bus.close()


async def test_an_older_planners_store_is_read_once_and_its_keys_deleted(
    auth_url: str, unique: str
) -> None:
    fleet = f"o{unique}"[:30]
    bus_a = await Bus.connect(_as(auth_url, "router"))
    bus_b = await Bus.connect(_as(auth_url, "router"))
    try:
        clock = _Clock(T0 + 120)
        a = await _router(bus_a, clock, fleet, "gw-a")
        b = await _router(bus_b, clock, fleet, "gw-b")
        fa, fb = a.fleet_plan, b.fleet_plan
        assert fa._kv is not None
        assert fa.lease is not None
        assert fb.lease is not None
        fa._store = StateStore(fa._kv, older_state_prefix(fleet))  # the older planner's store
        assert await fa.lease.try_acquire()
        await fa.ready()
        rnd = random.Random(1)
        fa.estimators["m"].observe_arrivals(
            sorted((T0 - 60 + rnd.random() * 60, 100) for _ in range(3000))
        )
        a.plans["m"] = replace(a.plans["m"], replicas=7, capacity_factor=1.5)
        assert await fa.save()
        assert await fa.save()  # a second commit in the older journal
        await fa.close()
        assert await live_keys(fa._kv, older_state_prefix(fleet))

        assert await fb.lease.try_acquire()
        await fb.ready()
        assert fb.leading
        assert b.plans["m"] == a.plans["m"]
        assert fb.estimators["m"].state() == fa.estimators["m"].state()
        assert not await live_keys(fa._kv, older_state_prefix(fleet))  # deleted
        b.plans["m"] = replace(b.plans["m"], replicas=8)
        assert await fb.save()
        await fb.close()
        again = StateStore(fa._kv, state_prefix(fleet))
        assert await again.load()
        assert fb._store is not None
        assert again.entries == fb._store.entries
    finally:
        for bus in (bus_a, bus_b):
            await bus.close()


async def test_an_older_store_left_unloadable_is_dropped_and_the_planner_leads(
    auth_url: str, unique: str
) -> None:
    # The older code could leave a head naming a base two writers wrote (review2): no read
    # mends it, so a planner that waited for it would never lead again.
    fleet = f"u{unique}"[:30]
    bus = await Bus.connect(_as(auth_url, "router"))
    try:
        svc = await _router(bus, _Clock(T0 + 120), fleet, "gw-a")
        fp = svc.fleet_plan
        assert fp._kv is not None
        assert fp.lease is not None
        older = older_state_prefix(fleet)
        head = Head(gen=0, chunks=1, token="a" * 16, upto=-1)
        await fp._kv.put(f"{older}.head", msgspec.msgpack.encode(head))
        chunk = msgspec.msgpack.encode(["b" * 16, 0, {"~seq": b"x"}])  # another base's chunk
        await fp._kv.put(f"{older}.b.0.0", zlib.compress(chunk))
        assert await fp.lease.try_acquire()
        await fp.ready()
        assert fp.leading
        assert not await live_keys(fp._kv, older)
    finally:
        await bus.close()
