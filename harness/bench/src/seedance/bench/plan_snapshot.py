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

    nice .venv/bin/python -m tools.bench.bench_plan_snapshot [--rates 100,500,1000,2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import msgspec

from seedance.core.state_store import encode_records
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_observations import MergeState
from seedance.router.plan_state import ModelSnapshot, PlanEntries, PlanSnapshot

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="100,500,1000,2000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
