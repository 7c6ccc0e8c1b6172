"""The fleet planner's state at high arrival rates: what one plan's commit costs, and a restore.

For each rate, a synthetic fleet of one model (uniform arrivals over the estimator's 600 s, two
15 s bins pending, prompt tokens uniform 50..4000, seed 1), then one interval later (a bin
released into the estimator, the oldest bin gone from its window). Per row, the median of
--repeat runs (wall clock, this process, on the event loop's thread):

* ``whole``: the state as one msgpack value, as planners before the store wrote it after every
  plan (they then cut it to one message: 1 MiB); ``save_ms`` its encode;
* ``store``: the commit `seedance.router.plan_state.PlanEntries` makes of the interval's change
  and its deflated journal records (`seedance.core.state_store.encode_records`); ``save_ms``
  the estimator's state, the diff and the records; ``restore_ms`` decoding the whole map back
  (`PlanEntries.restore`, the bus read not included).

``--bus`` also measures them on a fresh nats-server (`seedance.testing.servers.NatsServer`):
the state before the interval installed as the store's base, the interval's commit
(``commit_ms``, through the bus), then a new leader's read, ``load_ms`` (`StateStore.load`,
base and journal) plus the decode, median of --repeat; printed as ``bus: ...`` rows.

    nice .venv/bin/python -m tools.bench.bench_plan_snapshot [--rates 100,500,1000,2000] [--bus]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import msgspec

from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateStore, encode_records
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_observations import MergeState
from seedance.router.plan_state import (
    STORE_COMPACT_RECORDS,
    STORE_SLOTS,
    ModelSnapshot,
    PlanEntries,
    PlanSnapshot,
)
from seedance.testing.servers import NatsServer

T = 1_765_000_005.0  # a 15 s bin edge
BIN_S = 15.0
LIMIT = (1 << 20) - 4096  # the server's default max_payload, less the headers' room


def _snapshot(est: LoadEstimator, pending: tuple[tuple[float, int], ...]) -> PlanSnapshot:
    return PlanSnapshot(
        seq=1,
        planned_s=T,
        models={"m": ModelSnapshot(plan=PlanState(replicas=4), estimator=est.state())},
        merge=MergeState(pending=(("m", pending),)),
    )


def _uniform(rnd: random.Random, n: int, start_s: float, span_s: float) -> list[tuple[float, int]]:
    return sorted((start_s + rnd.random() * span_s, rnd.randint(50, 4000)) for _ in range(n))


async def _bus_rows(fleets: list[tuple[int, PlanSnapshot, PlanSnapshot]], repeat: int) -> None:
    """Per rate: the interval's commit and a new leader's read (load + decode) on a server."""
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url, name="bench-plan-snapshot"))
        try:
            kv = await ensure_bucket(bus, "seedance-router-plan")
            for rate, before, after in fleets:
                commit_ms, load_ms, decode_ms = [], [], []
                for run in range(repeat):
                    prefix = f"r{rate}-{run}.plan"
                    opts = {"slots": STORE_SLOTS, "compact_records": STORE_COMPACT_RECORDS}
                    entries = PlanEntries(BIN_S)
                    store = StateStore(kv, prefix, **opts)
                    await store.load()
                    await store.install(entries.entries(before))
                    entries.committed()
                    start = time.perf_counter()
                    await store.commit(entries.changes(after))
                    commit_ms.append(1e3 * (time.perf_counter() - start))
                    await store.close()
                    again = StateStore(kv, prefix, **opts)
                    start = time.perf_counter()
                    await again.load()
                    loaded = time.perf_counter()
                    restored = PlanEntries(BIN_S).restore(again.entries)
                    load_ms.append(1e3 * (loaded - start))
                    decode_ms.append(1e3 * (time.perf_counter() - loaded))
                    if restored is None or restored.models != after.models:
                        raise RuntimeError("the store read back another state than was written")
                print(
                    f"bus: rate={rate} commit_ms={statistics.median(commit_ms):.1f}"
                    f" load_ms={statistics.median(load_ms):.1f}"
                    f" decode_ms={statistics.median(decode_ms):.1f}"
                    f" base_bytes={store.stats.base_bytes}"
                )
        finally:
            await bus.close()
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="100,500,1000,2000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bus", action="store_true", help="also commit and load on a server")
    args = parser.parse_args()
    fleets: list[tuple[int, PlanSnapshot, PlanSnapshot]] = []
    print("rate_req_s  form   save_ms  commit_bytes  fits_1MiB  restore_ms  state_bytes")
    for rate in (int(r) for r in args.rates.split(",")):
        rnd = random.Random(1)
        window = _uniform(rnd, rate * 600, T - 600, 600)
        pending = _uniform(rnd, rate * 30, T, 30)
        before = LoadEstimator()
        before.observe_arrivals(window)
        # One interval later: the first pending bin released, the oldest bin let go.
        after = LoadEstimator()
        after.observe_arrivals([a for a in window if a[0] >= T - 600 + BIN_S])
        after.observe_arrivals([a for a in pending if a[0] < T + BIN_S])
        later = tuple(a for a in pending if a[0] >= T + BIN_S)

        whole_ms, value = [], b""
        for _ in range(args.repeat):
            start = time.perf_counter()
            value = msgspec.msgpack.encode(_snapshot(after, later))
            whole_ms.append(1e3 * (time.perf_counter() - start))
        print(
            f"{rate:>10}  whole  {statistics.median(whole_ms):>7.1f}  {len(value):>12}"
            f"  {len(value) <= LIMIT!s:<9}  {'-':>10}  {len(value):>11}"
        )

        save_ms, restore_ms, size, state_bytes = [], [], 0, 0
        for _ in range(args.repeat):
            entries = PlanEntries(BIN_S)
            stored = entries.entries(_snapshot(before, tuple(pending)))
            entries.committed()
            start = time.perf_counter()
            changes = entries.changes(_snapshot(after, later))
            records = encode_records(0, changes)
            save_ms.append(1e3 * (time.perf_counter() - start))
            size = sum(len(r) for r in records)
            for k, v in changes.items():
                if v is None:
                    stored.pop(k, None)
                else:
                    stored[k] = v
            state_bytes = sum(len(v) for v in stored.values())
            start = time.perf_counter()
            restored = PlanEntries(BIN_S).restore(stored)
            restore_ms.append(1e3 * (time.perf_counter() - start))
            assert restored is not None
            assert restored.models["m"].estimator.arrivals == after.state().arrivals
        print(
            f"{rate:>10}  store  {statistics.median(save_ms):>7.1f}  {size:>12}"
            f"  {max(len(r) for r in records) <= LIMIT!s:<9}"
            f"  {statistics.median(restore_ms):>10.1f}  {state_bytes:>11}"
        )
        if args.bus:
            fleets.append((rate, _snapshot(before, tuple(pending)), _snapshot(after, later)))
    if fleets:
        asyncio.run(_bus_rows(fleets, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
