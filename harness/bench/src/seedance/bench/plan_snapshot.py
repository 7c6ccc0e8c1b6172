"""The fleet planner's snapshot at high arrival rates (review2 finding 4): what one save costs
the event loop and how many seconds of arrivals the snapshot keeps, for main's halving and for
`fit_snapshot`, on the same synthetic fleet (uniform arrivals over the estimator's 600 s and
two 15 s bins pending; prompt tokens uniform 50..4000; seed 1). Prints one row per rate, each
time the median of --repeat runs (wall clock, this process).

    nice .venv/bin/python -m tools.bench.bench_plan_snapshot [--rates 500,1000,2000,3000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

import msgspec

from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlanState
from seedance.router.plan_leader import ModelSnapshot, PlanSnapshot, fit_snapshot
from seedance.router.plan_observations import MergeState

T = 1_765_000_000.0
LIMIT = (1 << 20) - 4096  # the server's default max_payload, less the headers' room


def _halving(snapshot: PlanSnapshot, limit: int) -> bytes:
    """main's `FleetPlanner._fitting` (251676bd): halve the estimators' arrivals until it fits;
    the pending ones are never trimmed."""
    value = msgspec.msgpack.encode(snapshot)
    while len(value) > limit and any(m.estimator.arrivals for m in snapshot.models.values()):
        models = {
            n: msgspec.structs.replace(
                m,
                estimator=replace(
                    m.estimator, arrivals=m.estimator.arrivals[len(m.estimator.arrivals) // 2 :]
                ),
            )
            for n, m in snapshot.models.items()
        }
        snapshot = msgspec.structs.replace(snapshot, models=models)
        value = msgspec.msgpack.encode(snapshot)
    return value


def _fitted(snapshot: PlanSnapshot, limit: int) -> bytes:
    return fit_snapshot(snapshot, limit)[0]


def _fleet(rate: int) -> tuple[LoadEstimator, tuple[tuple[float, int], ...]]:
    rnd = random.Random(1)
    est = LoadEstimator()
    est.observe_arrivals(
        [(T - 600 + rnd.random() * 600, rnd.randint(50, 4000)) for _ in range(rate * 600)]
    )
    pending = tuple(
        sorted((T + rnd.random() * 30, rnd.randint(50, 4000)) for _ in range(rate * 30))
    )
    return est, pending


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="500,1000,2000,3000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("rate_req_s  algo     save_ms  size_bytes  fits  kept_span_s  pending_kept")
    for rate in (int(r) for r in args.rates.split(",")):
        est, pending = _fleet(rate)
        for name, fit in (("halving", _halving), ("fit", _fitted)):
            times, value = [], b""
            for _ in range(args.repeat):
                start = time.perf_counter()
                snapshot = PlanSnapshot(  # the save path: the estimator's state, then the fit
                    seq=1,
                    models={"m": ModelSnapshot(plan=PlanState(replicas=4), estimator=est.state())},
                    merge=MergeState(pending=(("m", pending),)),
                )
                value = fit(snapshot, LIMIT)
                times.append(time.perf_counter() - start)
            kept = msgspec.msgpack.decode(value, type=PlanSnapshot)
            arrivals = kept.models["m"].estimator.arrivals
            span = T - arrivals[0][0] if arrivals else 0.0
            pend = sum(len(p) for _, p in kept.merge.pending)
            print(
                f"{rate:>10}  {name:<7} {1e3 * statistics.median(times):>8.0f}  {len(value):>10}"
                f"  {len(value) <= LIMIT!s:<5} {span:>11.0f}  {pend:>6}/{len(pending)}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
