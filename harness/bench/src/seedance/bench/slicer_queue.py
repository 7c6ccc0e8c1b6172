"""Dynamic queueing replay of an openb pod list: P95 wait and GPU allocation.

Pods arrive as a Poisson process whose rate offers `--load` (95 %) of the cluster's GPU
capacity on average: rate = load × GPUs / (E[GPUs per pod] × E[duration]). Each pod's
duration is drawn from the trace's lifetimes (deletion − creation). Those are heavy-tailed
(mean 25,839 s, max 145 days, p50 540 s): a cluster that starts empty would stay far below
the offered load for the whole replay, because the long pods that carry most of the GPU-time
have not arrived yet. So the replay starts in the stationary state of that arrival process
(as if it had always been running): the pods alive at time 0 are the Poisson population of
an M/G/∞ system, rate × E[duration] of them on average, each with a length-biased lifetime
D and a residual U·D (U uniform). They are submitted at time 0 and are not measured. Then the
pod list arrives once in a shuffled order (`--passes` repeats it).
wait = start − arrival; pods not started when the replay ends (at the last arrival) count
with their wait up to then. GPU allocation is the time average over the replay.

Two schedulers see the same arrivals: Seedance's (`Scheduler` with backfill, reservations
and the Seedance placement policy) and the baseline, FIFO first-fit with head-of-line
blocking. Both are the same event-driven `Scheduler` class the service drives.
"""

from __future__ import annotations

import argparse
import heapq
import sys
import time
from pathlib import Path

import numpy as np

from seedance.bench.openb import TracePod, read_nodes, read_pods, trace_name
from seedance.slicer.core.model import Node
from seedance.slicer.core.policies import FirstFit, Policy, SeedancePolicy
from seedance.slicer.core.queue import Job, JobPlaced
from seedance.slicer.core.queue import PlacementQueue as Scheduler
from seedance.slicer.core.queue import QueueConfig as SchedulerConfig


def build_arrivals(
    pods: list[TracePod], gpus: int, load: float, passes: int, seed: int
) -> tuple[list[tuple[float, Job, float]], int]:
    """(arrival s, job, duration s) in arrival order, and how many of them (first) are the
    stationary population present at time 0."""
    rng = np.random.default_rng(seed)
    lifetimes = np.array([p.lifetime_s for p in pods if p.lifetime_s and p.lifetime_s > 0])
    mean_gpu = float(np.mean([p.request.gpu_milli_total for p in pods])) / 1000
    mean_life_s = float(lifetimes.mean())
    rate_per_s = load * gpus / (mean_gpu * mean_life_s)
    out: list[tuple[float, Job, float]] = []
    n_alive = int(rng.poisson(rate_per_s * mean_life_s))
    biased = rng.choice(lifetimes, size=n_alive, p=lifetimes / lifetimes.sum())
    for k, i in enumerate(rng.integers(len(pods), size=n_alive)):
        job = Job(job_id=f"{pods[i].name}#alive{k}", request=pods[i].request)
        out.append((0.0, job, float(biased[k] * rng.uniform())))
    t = 0.0
    for k in range(passes):
        for i in rng.permutation(len(pods)):
            t += float(rng.exponential(1 / rate_per_s))
            job = Job(job_id=f"{pods[i].name}#{k}", request=pods[i].request)
            out.append((t, job, float(rng.choice(lifetimes))))
    return out, n_alive


def replay(
    nodes: list[Node],
    arrivals: list[tuple[float, Job, float]],
    policy: Policy,
    config: SchedulerConfig,
    label: str,
    warmup: int,
    samples: list[tuple[float, float, int]] | None = None,
) -> tuple[list[float], float]:
    """Returns (waits in s of the jobs after the first `warmup`, time-averaged GPU
    allocation in % from time 0 to the last arrival)."""
    sched = Scheduler(nodes, policy, config)
    cap = sched.state.gpu_capacity_milli
    end_s = arrivals[-1][0]
    start_s = 0.0
    duration = {job.job_id: d for _, job, d in arrivals}
    arrived = {job.job_id: t for t, job, _ in arrivals}
    started: dict[str, float] = {}
    events: list[tuple[float, int, str]] = []  # (time, 0 finish / 1 arrival, job id)
    jobs = {job.job_id: job for _, job, _ in arrivals}
    for t, job, _ in arrivals:
        events.append((t, 1, job.job_id))
    heapq.heapify(events)
    alloc_area = 0.0
    last_t = 0.0
    n_done = 0
    t0 = time.perf_counter()
    while events and events[0][0] <= end_s:
        now = events[0][0]
        if now > start_s:
            alloc_area += sched.gpu_allocated_milli() * (now - max(last_t, start_s))
        last_t = now
        while events and events[0][0] == now:
            _, kind, jid = heapq.heappop(events)
            if kind:
                sched.submit(jobs[jid], now)
                n_done += 1
            else:
                sched.finish(jid, now)
        for d in sched.schedule(now):
            if isinstance(d, JobPlaced):
                started[d.job_id] = now
                heapq.heappush(events, (now + duration[d.job_id], 0, d.job_id))
        if samples is not None and n_done % 500 == 0 and kind:
            samples.append((now, sched.gpu_allocated_milli() / cap, len(sched.pending_ids)))
        if n_done % 2000 == 0 and kind:
            print(
                f"[{label}] {n_done}/{len(arrivals)} arrived, t={now:,.0f}s, "
                f"pending={len(sched.pending_ids)}, {time.perf_counter() - t0:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    alloc_area += sched.gpu_allocated_milli() * (end_s - last_t)
    measured = [job.job_id for _, job, _ in arrivals[warmup:]]
    waits = [started.get(j, end_s) - arrived[j] for j in measured]
    return waits, 100.0 * alloc_area / (cap * (end_s - start_s))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=Path, required=True)
    ap.add_argument("--pods", type=Path, required=True)
    ap.add_argument("--load", type=float, default=0.95)
    ap.add_argument("--passes", type=int, default=1, help="times the pod list arrives")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    nodes = read_nodes(args.nodes)
    pods = read_pods(args.pods)
    gpus = sum(n.gpu_count for n in nodes)
    arrivals, n_alive = build_arrivals(pods, gpus, args.load, args.passes, args.seed)
    reqs = [p.request for p in pods]
    runs: dict[str, tuple[Policy, SchedulerConfig]] = {
        "seedance": (SeedancePolicy.for_trace(reqs), SchedulerConfig()),
        "fifo-first-fit": (FirstFit(), SchedulerConfig(backfill=False, preemption=False)),
    }
    res: dict[str, tuple[float, float, float]] = {}
    for label, (policy, cfg) in runs.items():
        waits, alloc = replay(nodes, arrivals, policy, cfg, label, warmup=n_alive)
        w = np.array(waits)
        res[label] = (float(np.percentile(w, 95)), float(np.percentile(w, 50)), alloc)
    print(
        f"trace={trace_name(args.pods)} load={args.load} alive_at_start={n_alive} "
        f"arrivals={len(arrivals) - n_alive} seed={args.seed}"
    )
    print(f"{'scheduler':18s}{'p50_wait_s':>12s}{'p95_wait_s':>12s}{'alloc_pct':>11s}")
    for label, (p95, p50, alloc) in res.items():
        print(f"{label:18s}{p50:12.1f}{p95:12.1f}{alloc:11.2f}")
    ours, base = res["seedance"], res["fifo-first-fit"]
    ratio = ours[0] / base[0] if base[0] > 0 else float("inf")
    print(
        f"slicer_queue: load={args.load} p95_wait_s={ours[0]:.1f} "
        f"baseline_p95_wait_s={base[0]:.1f} ratio={ratio:.3f} "
        f"alloc_pct={ours[2]:.2f} baseline_alloc_pct={base[2]:.2f}"
    )
    return 0
