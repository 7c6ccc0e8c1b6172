"""What the fleet planner's store keeps on the server, and the move from the older store, with
the shipped ``router`` user (review2 of the plan store: 1024 journal slots kept 22.3 MB on the
server for a 0.8 MB state).
"""

from __future__ import annotations

import random

from seedance.core import Bus
from seedance.core.kv import live_keys
from seedance.router.plan_state import STORE_SLOTS, state_prefix
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
