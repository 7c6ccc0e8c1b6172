"""The slicer's scheduler alone, in-process, on bench-scale's fleet: what a decision costs the
core, and a digest of every decision, to show that a change to the hot path decides the same.

The fleet (`seedance.bench.scale_fleet`: the spot-GPU list, ``--copies`` times) is loaded node by
node, filled to ``--fill`` of its GPUs with openb shapes (seeded), then ``--pairs`` times one
random running job finishes and one single pod is submitted (bench-scale's rate step without the
bus). Printed: pairs per second, the p50/p99 of a pair, the mean of the submits that refreshed the
target workload, and the digest (sha256, first 16 hex digits) of every effect in order: each
placement's job, node and GPU shares, and the kind and job of every other effect. Two runs of one
seed on code that decides alike print the same digest. ``--profile`` prints, before it, the
costs of the policy's rescans, index and tie-break (`seedance.bench.scale_replay_profile`); the
pairs' rate leaves out the time they take, and the digest is the same. ``--rounds N`` times N
consolidation rounds (`Scheduler.consolidate`, one per `interval_s` of the replay's clock) on
the filled fleet, before the pairs, and prints ``scale_replay_rounds: rounds=<n>
round_ms_median=<n> round_ms_max=<n> moves=<n>`` first: what a round holds the slicer's loop for
(none of bench-scale's jobs says it is movable). ``--cpu-time`` times the
pairs in this process's CPU time instead of the wall clock: on a shared machine another
process's turn on the core is then not counted (the wall clock's p99 is mostly such turns).

Last line: ``scale_replay: nodes=<n> running=<n> pairs=<n> pairs_per_s=<n> pair_p50_ms=<n>
pair_p99_ms=<n> refresh_ms_mean=<n> refreshes=<n> digest=<hex>``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from seedance.bench.scale import TENANT, submit
from seedance.bench.scale_fleet import TOPOLOGY_LEVELS, Shape, inventory, read_fleet, read_shapes
from seedance.bench.scale_replay_profile import Profile
from seedance.slicer.config import scheduler_config
from seedance.slicer.core import Scheduler
from seedance.slicer.core.effects import Effect, Evicted, Placed
from seedance.slicer.mapping import job_spec, node_spec
from seedance.slicer.settings import SlicerSettings

__all__ = ["main"]


class Replay:
    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler
        self.digest = hashlib.sha256()
        self.running: list[str] = []
        self.milli = 0

    def take(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Placed):
                self.running.append(e.job.job_id)
                self.milli += sum(g.milli for g in e.gpus)
                shares = [(g.index, g.milli) for g in e.gpus]
                self.digest.update(f"{e.job.job_id}>{e.node}:{shares};".encode())
            else:
                job = getattr(getattr(e, "job", None), "job_id", "")
                self.digest.update(f"{type(e).__name__}:{job};".encode())


def run(args: argparse.Namespace, profile: Profile | None = None) -> str:
    nodes = read_fleet(args.nodes, args.copies)
    shapes = read_shapes(args.pods)
    # `--waiting` keeps one tenant's 10,000 jobs waiting, past the service's default bound on a
    # tenant's waiting jobs (`SEEDANCE_SLICER_MAX_WAITING_PER_TENANT`): the bound is off here.
    settings = SlicerSettings(topology_levels=",".join(TOPOLOGY_LEVELS), max_waiting_per_tenant=0)
    sched = Scheduler(scheduler_config(settings))
    now = datetime.now(UTC)
    for n in nodes:
        sched.upsert_node(node_spec(inventory(n, now)), 1.0)
    r = Replay(sched)
    rng = random.Random(args.seed)
    cap = sum(n.gpus for n in nodes) * 1000
    clock, k = 2.0, 0
    while r.milli < args.fill * cap:
        k += 1
        clock += 0.001
        _, ev = submit(f"j{k}", rng.choice(shapes))
        r.take(sched.submit(job_spec(ev), clock))  # type: ignore[arg-type]
    running = len(r.running)
    if args.waiting:
        # Jobs that wait for the whole run (a CPU-only pod as large as the largest node: only
        # an emptied node holds one), old enough to reserve nodes: bench-scale's top-up.
        big = Shape(cpu_milli=max(n.cpu_milli for n in nodes), memory_mib=1024, gpus=0, gpu_milli=0)
        for i in range(args.waiting):
            _, ev = submit(f"w{i}", big)
            r.take(sched.submit(job_spec(ev), clock))  # type: ignore[arg-type]
        clock += 2 * sched.config.queue.reserve_after_s
    if profile is not None:
        profile.filled(sched)
    if args.rounds:
        clock = time_rounds(sched, args.rounds, clock)
    singles = [s for s in shapes if s.gpus <= 8]
    lat: list[float] = []
    refresh: list[float] = []
    timer = time.process_time if args.cpu_time else time.perf_counter
    started = timer()
    for _ in range(args.pairs):
        t0 = timer()
        job = r.running.pop(rng.randrange(len(r.running)))
        clock += 0.001
        r.take(sched.finish(TENANT, job, clock))
        k += 1
        _, ev = submit(f"s{k}", rng.choice(singles))
        policy = sched._policy
        r.take(sched.submit(job_spec(ev), clock))  # type: ignore[arg-type]
        lat.append(timer() - t0)
        if sched._policy is not policy:
            refresh.append(lat[-1])
            if profile is not None:
                profile.refreshed(sched, policy)
    elapsed = timer() - started - (profile.spent_s if profile else 0.0)
    lat.sort()
    mean_refresh = sum(refresh) / len(refresh) * 1000 if refresh else float("nan")
    return (
        f"scale_replay: nodes={len(nodes)} running={running} pairs={args.pairs} "
        f"pairs_per_s={args.pairs / elapsed:.0f} pair_p50_ms={lat[len(lat) // 2] * 1000:.3f} "
        f"pair_p99_ms={lat[int(0.99 * len(lat))] * 1000:.2f} refresh_ms_mean={mean_refresh:.2f} "
        f"refreshes={len(refresh)} waiting={sched.waiting_count} "
        f"digest={r.digest.hexdigest()[:16]}"
    )


def time_rounds(sched: Scheduler, rounds: int, clock: float) -> float:
    """Print what each of `rounds` consolidation rounds costs; the clock after them."""
    cfg = sched.config.consolidation
    step = cfg.interval_s if cfg is not None else 60.0
    took: list[float] = []
    moves = 0
    for _ in range(rounds):
        clock += step
        t0 = time.perf_counter()
        out = sched.consolidate(clock)
        took.append((time.perf_counter() - t0) * 1000)
        moves += sum(1 for e in out if isinstance(e, Evicted))
    took.sort()
    print(
        f"scale_replay_rounds: rounds={rounds} round_ms_median={took[len(took) // 2]:.1f} "
        f"round_ms_max={took[-1]:.1f} moves={moves}",
        flush=True,
    )
    return clock


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nodes", type=Path, required=True, help="alibaba-spot-gpu-2026 node list")
    ap.add_argument("--pods", type=Path, required=True, help="openb_pod_list_default.csv")
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--fill", type=float, default=0.8)
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--rounds", type=int, default=0, help="consolidation rounds to time first")
    ap.add_argument("--waiting", type=int, default=0, help="jobs kept waiting throughout")
    ap.add_argument(
        "--profile", action="store_true", help="print the rescans', index's and tie-break's costs"
    )
    ap.add_argument(
        "--cpu-time", action="store_true", help="time the pairs in CPU time, not the wall clock"
    )
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profile = Profile() if args.profile else None
    line = run(args, profile)
    for prof in profile.report() if profile else []:
        print(prof, flush=True)
    print(line, flush=True)
    return 0
