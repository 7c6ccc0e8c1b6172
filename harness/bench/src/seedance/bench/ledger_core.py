"""Benchmark of the cost-ledger's pure core on events built from the Alibaba GPU trace.

Builds placements by first-fit of the trace's GPU pods (whole, multi-GPU and GPU-sharing) on
its real node list, plus GPU samples, then measures what one ledger core does per second:
1. apply + advance (the adapter's per-batch work) in event-time order;
2. the snapshot round trip (``to_bytes`` + ``from_bytes``) of the end-of-run state, which is
   what a replica sharing state through one KV key pays per compare-and-set;
3. exactness: the events shuffled with a third delivered twice, restarted from snapshots at
   random points, compared with ``recompute``; and with retention, each fact delayed by up to
   the bound retention promises (``LedgerConfig.late_fact_bound_ms``), no further.

Anchor: the issue's goal of 5,000 events/s per ledger replica (the bus adapter's figure, so
the core must be well above it). Last line:
``ledger_core_bench: events=<n> events_per_s=<n> snapshot_kib=<n> snapshot_roundtrip_ms=<n>
diff_usd=<d> ratio_vs_goal=<r>``.

Usage: bench_ledger_core.py DATA_DIR [--pods N] [--samples N] [--batch N] [--seed N]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from seedance.cost_ledger.core import (
    CostLine,
    GpuAllocation,
    GpuSample,
    JobEnded,
    Ledger,
    LedgerConfig,
    LedgerInput,
    NodeInfo,
    default_price_book,
    recompute,
)
from seedance.traces import alibaba

PricingTier = Literal["on_demand", "reserved", "spot", "on_prem"]
GOAL_EVENTS_PER_S = 5000
TENANTS = ("search", "ads", "llm", "research", "vision")
T0_MS = 1_767_225_600_000  # the trace's second 0 mapped to 2026-01-01T00:00:00Z


@dataclass(frozen=True, slots=True)
class _Pod:
    """A GPU pod of the trace, its times compressed and counted from the first creation."""

    name: str
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str]
    created_s: int
    deleted_s: int


def _gpu_pods(path: Path, pods: int, compress: int) -> list[_Pod]:
    rows = [r for r in alibaba.read_pods(path) if r.num_gpu > 0]
    rows.sort(key=lambda r: (r.creation_time or 0, r.name))
    rows = rows[:pods]
    first = rows[0].creation_time or 0
    return [
        _Pod(
            name=r.name,
            num_gpu=r.num_gpu,
            gpu_milli=r.gpu_milli,
            gpu_spec=frozenset(r.gpu_spec),
            created_s=((r.creation_time or 0) - first) // compress,
            deleted_s=max(0, (r.deletion_time or 0) - first) // compress,
        )
        for r in rows
    ]


def _first_fit(
    nodes: list[tuple[str, str, int]], free: dict[str, list[int]], pod: _Pod
) -> tuple[str, tuple[int, ...], int] | None:
    """The first node (list order) that fits: a shared pod on one GPU with room for its share,
    otherwise whole free GPUs."""
    n_gpu, milli = pod.num_gpu, pod.gpu_milli
    for sn, m, _ in nodes:
        if pod.gpu_spec and m not in pod.gpu_spec:
            continue
        if n_gpu == 1 and milli < 1000:
            g = next((i for i, fr in enumerate(free[sn]) if fr >= milli), None)
            if g is not None:
                return (sn, (g,), milli)
        else:
            whole = [i for i, fr in enumerate(free[sn]) if fr == 1000]
            if len(whole) >= n_gpu:
                return (sn, tuple(whole[:n_gpu]), 1000)
    return None


def _place(
    nodes: list[tuple[str, str, int]], rows: list[_Pod], horizon_s: int
) -> tuple[list[LedgerInput], set[tuple[str, int]], int]:
    """First-fit placements and the job ends inside the horizon, in creation order."""
    free = {sn: [1000] * n for sn, _, n in nodes}
    model_of = {sn: m for sn, m, _ in nodes}
    events: list[LedgerInput] = []
    releases: list[tuple[int, str, tuple[int, ...], int]] = []
    used: set[tuple[str, int]] = set()
    placed = 0
    for r in rows:
        t = r.created_s
        while releases and releases[0][0] <= t:
            _, sn, gpus, milli = heapq.heappop(releases)
            for g in gpus:
                free[sn][g] += milli
        choice = _first_fit(nodes, free, r)
        if choice is None:
            continue  # unschedulable at this moment: the slicer's problem, not the ledger's
        sn, gpus, m = choice
        for g in gpus:
            free[sn][g] -= m
            used.add((sn, g))
        end_s = min(r.deleted_s, horizon_s)
        heapq.heappush(releases, (end_s, sn, gpus, m))
        shared = r.num_gpu == 1 and r.gpu_milli < 1000
        job = r.name
        events.append(
            GpuAllocation(
                event_id=f"place:{job}", job_id=job,
                tenant=TENANTS[zlib.crc32(job.encode()) % len(TENANTS)], node=sn,
                gpu_model=model_of[sn], gpu_indices=gpus, start_ms=T0_MS + t * 1000,
                kind="shared" if shared else "whole", gpu_milli=m,
            )
        )  # fmt: skip
        if r.deleted_s <= horizon_s:
            events.append(JobEnded(event_id=f"end:{job}", job_id=job, end_ms=T0_MS + end_s * 1000))
        placed += 1
    return events, used, placed


def _samples(
    rng: random.Random, gpus_used: list[tuple[str, int]], samples: int, horizon_s: int
) -> list[LedgerInput]:
    per_gpu = max(1, samples // max(1, len(gpus_used)))
    step_s = max(1, horizon_s // per_gpu)
    out: list[LedgerInput] = []
    for sn, g in gpus_used:
        for k in range(per_gpu):
            at_s = k * step_s + rng.randrange(0, step_s)
            out.append(
                GpuSample(
                    event_id=f"sample:{sn}:{g}:{k}", node=sn, gpu_index=g,
                    at_ms=T0_MS + at_s * 1000, activity=round(rng.random(), 3),
                    energy_mj=rng.randrange(0, 300_000) * step_s,
                )
            )  # fmt: skip
    return out


def trace_events(
    data_dir: Path, pods: int, samples: int, seed: int, compress: int = 100
) -> tuple[list, int]:
    """Ledger inputs from the trace: node inventory, first-fit placements, releases, samples.

    The trace's pods arrive over months; time is compressed ``compress``-fold (creation and
    deletion alike) so a few thousand pods fill hours, not months, of charge windows.
    """
    rng = random.Random(seed)
    trace = data_dir / "alibaba-gpu-v2023"
    nodes = [
        (n.sn, n.model, n.gpu) for n in alibaba.read_nodes(trace / "openb_node_list_gpu_node.csv")
    ]
    rows = _gpu_pods(trace / "openb_pod_list_default.csv", pods, compress)
    horizon_s = max(r.created_s for r in rows) + 3600
    tiers: tuple[PricingTier, ...] = ("on_demand", "reserved", "spot", "on_prem")
    events: list[LedgerInput] = [
        NodeInfo(
            event_id=f"node:{sn}", node=sn, gpu_model=m, gpu_count=n, at_ms=T0_MS,
            pricing_tier=tiers[zlib.crc32(sn.encode()) % 4],
        )
        for sn, m, n in nodes
    ]  # fmt: skip
    placements, used, placed = _place(nodes, rows, horizon_s)
    events.extend(placements)
    gpus_used = sorted(used)
    events.extend(_samples(rng, gpus_used, samples, horizon_s))
    print(
        f"trace: {len(rows)} GPU pods, {placed} placed, {len(gpus_used)} GPUs used, "
        f"horizon {horizon_s / 3600:.1f} h (time compressed {compress}x), {len(events)} events",
        file=sys.stderr,
    )
    return events, T0_MS + horizon_s * 1000


def _time(e: LedgerInput) -> int:
    if isinstance(e, GpuAllocation):
        return e.start_ms
    if isinstance(e, JobEnded):
        return e.end_ms
    return e.at_ms


def delayed(events: list[LedgerInput], bound_ms: int, rng: random.Random) -> list[LedgerInput]:
    """``events`` in the order they arrive when each is delayed by 0..``bound_ms`` (uniform)
    after its own time: none arrives more than ``bound_ms`` behind a fact before it."""
    keys = [_time(e) + rng.randint(0, bound_ms) for e in events]
    return [e for _, e in sorted(zip(keys, events, strict=True), key=lambda p: p[0])]


def max_lag_ms(stream: list[LedgerInput]) -> int:
    """How far the latest fact of ``stream`` arrived behind the newest fact before it."""
    newest, lag = 0, 0
    for e in stream:
        t = _time(e)
        lag, newest = max(lag, newest - t), max(newest, t)
    return lag


def run_pass(book, config, events, batch: int) -> tuple[float, Ledger]:
    led = Ledger(book, config)
    t = time.perf_counter()
    now = 0
    for i in range(0, len(events), batch):
        chunk = events[i : i + batch]
        led.apply_many(chunk)
        now = max(now, *(_time(e) for e in chunk))
        led.advance(now)
        led.confirm_published(
            o.entry_id if isinstance(o, CostLine) else o.report_id for o in led.pending_outputs()
        )
    return time.perf_counter() - t, led


def replay(book, config, stream, batch: int, as_of: int, rng: random.Random):
    led = Ledger(book, config)
    now = 0
    for i in range(0, len(stream), batch):
        chunk = stream[i : i + batch]
        led.apply_many(chunk)
        now = max(now, *(_time(e) for e in chunk))
        led.advance(now)
        if rng.random() < 0.05:  # a replica dies; the next resumes from the last snapshot
            led = Ledger.from_bytes(led.to_bytes(), book)
    led.advance(as_of)
    return led.totals()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--samples", type=int, default=40000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--retention", type=int, default=6, help="closed windows kept open")
    args = ap.parse_args()

    book = default_price_book()
    # Six hours of closed windows stay open to late facts; older ones are sealed (bounded state).
    config = LedgerConfig(window_s=3600, lateness_s=300, retention_windows=args.retention)
    events, as_of = trace_events(args.data_dir, args.pods, args.samples, args.seed)
    ordered = sorted(events, key=lambda e: (_time(e), e.event_id))
    n = len(ordered)

    rates = []
    for k in range(args.repeats):
        dt, led = run_pass(book, config, ordered, args.batch)
        rates.append(n / dt)
        print(f"pass {k}: apply+advance {n / dt:,.0f} events/s", file=sys.stderr)
    # A replica sharing state through one KV key pays a snapshot round trip per
    # compare-and-set; measure it on the end-of-run state (the largest).
    blob = led.to_bytes()
    trips = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        Ledger.from_bytes(led.to_bytes(), book)
        trips.append(time.perf_counter() - t)
    snapshot_ms = statistics.median(trips) * 1000
    snapshot_kib = len(blob) / 1024
    print(
        f"snapshot: {snapshot_kib:,.0f} KiB (zlib msgpack), to_bytes+from_bytes "
        f"{snapshot_ms:.0f} ms: a CAS per {args.batch} events caps a replica at "
        f"{args.batch / (snapshot_ms / 1000):,.0f} events/s before network time",
        file=sys.stderr,
    )

    # Exactness 1: everything shuffled (facts up to the whole horizon late) with a third
    # delivered twice and restarts from snapshots: needs unbounded retention.
    exact_cfg = LedgerConfig(window_s=3600, lateness_s=300)
    expected = recompute(events, book, as_of, exact_cfg)
    rng = random.Random(args.seed)
    stream = events + rng.sample(events, n // 3)
    rng.shuffle(stream)
    got = replay(book, exact_cfg, stream, args.batch, as_of, rng)
    diff_micro = abs(got.total.total_usd_micro - expected.total.total_usd_micro)
    # Exactness 2: the benchmark's retention. It promises exactness for facts dated no more
    # than ``late_fact_bound_ms`` behind the clock (6 h 5 min with --retention 6), so each
    # fact is delayed by up to that bound, and a tenth is delivered again at the end, long
    # after its window was sealed (a re-delivery changes nothing), with restarts. (It once
    # shuffled overlapping pairs of batches: a fact stayed in the later half half the time and
    # rode on, so a few arrived up to ~10 h late and, as promised, were not charged:
    # diff_usd=1.87 at 1,000 pods.)
    bound_ms = config.late_fact_bound_ms
    assert bound_ms is not None
    local = delayed(ordered, bound_ms, rng)
    latest_h = max_lag_ms(local) / 3_600_000
    local += rng.sample(ordered, n // 10)
    got_retained = replay(book, config, local, args.batch, as_of, rng)
    expected_retained = recompute(events, book, as_of, config)
    diff_micro += abs(got_retained.total.total_usd_micro - expected_retained.total.total_usd_micro)
    print(
        f"total {expected.total.total_usd_micro / 1e6:,.2f} USD, idle "
        f"{expected.idle.total_usd_micro / 1e6:,.2f} USD; fully shuffled+duplicated+restarted "
        f"replay {'equals' if got == expected else 'DIFFERS FROM'} recompute; delayed up to "
        f"retention's bound ({latest_h:.2f} h behind the clock at most, bound "
        f"{bound_ms / 3_600_000:.2f} h) with retention {args.retention} "
        f"{'equals' if got_retained == expected_retained else 'DIFFERS FROM'} recompute",
        file=sys.stderr,
    )
    median = statistics.median(rates)
    print(
        f"ledger_core_bench: events={n} events_per_s={median:.0f} "
        f"snapshot_kib={snapshot_kib:.0f} snapshot_roundtrip_ms={snapshot_ms:.0f} "
        f"diff_usd={diff_micro / 1e6:.2f} "
        f"ratio_vs_goal={median / GOAL_EVENTS_PER_S:.2f}"
    )
