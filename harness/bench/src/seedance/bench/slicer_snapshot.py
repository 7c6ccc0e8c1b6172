"""Micro-benchmark of what the slicer writes per batch: the changed entries, not the whole state.

Owns one measurement, in process and without the bus: a `Scheduler` on the Alibaba GPU trace
v2023 (openb) GPU nodes (the list copied `--copies` times), filled with the trace's pods until
about `--running` jobs run, then `--batches` rounds of "`--per-batch` jobs end, as many are
submitted", as the service's batches do. Per batch it times what the service writes now:
`state_changes()` and the deflated journal record (`seedance.core.state_store.encode_records`),
and, as the anchor measured in the same run, what it wrote before: the whole state as one value
(`to_bytes`) deflated. It prints both per batch (mean and p99) with the ratio, and checks that
the entries written reproduce the state. It must not change the scheduler's decisions or touch
the bus.

``--restore-journal N`` also measures the restore's store read (`StateStore.load`) on a fresh
nats-server: the state before the batches written as a base, the first N batches as N journal
records after it (767: the slicer's full journal, `seedance.slicer.durable.COMPACT_RECORDS`
less one), then loaded ``--restore-runs`` times each way, alternated: the journal read one slot
per round trip (the anchor: the store before its read windows) and as the store reads it now.
Printed before the last line: ``restore: journal=<n> base_bytes=<n> one_by_one_s=<median>
windowed_s=<median> ratio=<n>``.

Last line: ``slicer_snapshot: running=<n> nodes=<n> batch_ms_p99=<n> whole_ms_p99=<n>
record_bytes_mean=<n> whole_bytes=<n> ratio=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from seedance.core import Bus, BusSettings, state_store
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import StateStore, encode_records
from seedance.slicer.core.entries import snapshot_of
from seedance.slicer.core.inputs import GpuSpec, JobSpec, NodeSpec
from seedance.slicer.core.scheduler import Scheduler
from seedance.slicer.durable import COMPACT_RECORDS
from seedance.testing.servers import NatsServer
from seedance.traces import alibaba

__all__ = ["main"]


def _nodes(path: Path, count: int, copies: int) -> list[NodeSpec]:
    rows = [r for r in alibaba.read_nodes(path) if r.gpu > 0][:count]
    return [
        NodeSpec(
            name=f"{r.sn}-{c}" if copies > 1 else r.sn,
            cpu_milli=r.cpu_milli,
            memory_mib=r.memory_mib,
            gpus=tuple(GpuSpec(model=r.model or "none") for _ in range(r.gpu)),
        )
        for c in range(copies)
        for r in rows
    ]


def _jobs(path: Path) -> list[JobSpec]:
    pods = [p for p in alibaba.read_pods(path) if p.num_gpu <= 8]
    return [
        JobSpec(
            job_id=f"{p.name}-{i}",
            tenant="t",
            gpus=p.num_gpu,
            gpu_milli=p.gpu_milli if p.num_gpu else 1000,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
        )
        for i in range(1000)
        for p in pods
    ]


async def _restore(
    base: dict[str, bytes], journal: list[dict[str, bytes | None]], runs: int
) -> str:
    """The store read of `base` and `journal` after it, one slot at a time and windowed."""
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url, name="bench-snapshot"))
        try:
            kv = await ensure_bucket(bus, "seedance-slicer-state")
            store = StateStore(kv, "pool.bench", compact_records=COMPACT_RECORDS)
            await store.load()
            await store.install(base)
            for changes in journal:
                await store.commit(changes)
            if store.journal_records != len(journal):
                raise RuntimeError(f"a base was written: {store.journal_records} records left")
            windowed = state_store._WINDOW
            took: dict[int, list[float]] = {1: [], windowed: []}
            for _ in range(runs):
                for window in took:
                    # The anchor: one slot per round trip, as the store read before its windows.
                    state_store._WINDOW = window
                    again = StateStore(kv, "pool.bench", compact_records=COMPACT_RECORDS)
                    t0 = time.perf_counter()
                    await again.load()
                    took[window].append(time.perf_counter() - t0)
                    if again.entries != store.entries:
                        raise RuntimeError("the restore read another state than was written")
            state_store._WINDOW = windowed
        finally:
            await bus.close()
    finally:
        server.stop()
    one, win = statistics.median(took[1]), statistics.median(took[windowed])
    return (
        f"restore: journal={len(journal)} base_bytes={store.stats.base_bytes} "
        f"one_by_one_s={one:.3f} windowed_s={win:.3f} ratio={win / one:.2f}"
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--data", type=Path, required=True, help="the Alibaba trace folder (alibaba-gpu-v2023)"
    )
    ap.add_argument("--nodes", type=int, default=260)
    ap.add_argument("--copies", type=int, default=1)
    ap.add_argument("--running", type=int, default=1800)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--per-batch", type=int, default=20)
    ap.add_argument("--restore-journal", type=int, default=0, help="journal records to restore")
    ap.add_argument("--restore-runs", type=int, default=5)
    args = ap.parse_args(argv)
    if args.restore_journal > args.batches:
        ap.error("--restore-journal needs as many --batches")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    s = Scheduler()
    for n in _nodes(args.data / "openb_node_list_gpu_node.csv", args.nodes, args.copies):
        s.upsert_node(n, 0.0)
    jobs = iter(_jobs(args.data / "openb_pod_list_default.csv"))
    now = 0.0
    while len(s.running_jobs) < args.running:
        now += 1.0
        s.submit(next(jobs), now)
    copy = s.state_entries()
    s.state_changes()
    base, journal = dict(copy), []
    running = list(s.running_jobs)
    batch_s: list[float] = []
    whole_s: list[float] = []
    sizes: list[int] = []
    whole_bytes = 0
    for i in range(args.batches):
        for k in range(args.per_batch):
            now += 1.0
            tenant, job_id = running[(i * args.per_batch + k) % len(running)]
            s.finish(tenant, job_id, now)
            s.submit(next(jobs), now)
        running = list(s.running_jobs) if i % 50 == 49 else running
        t0 = time.perf_counter()
        changes = s.state_changes()
        records = encode_records(i, changes)
        t1 = time.perf_counter()
        if i < args.restore_journal:
            journal.append(changes)
        whole = zlib.compress(s.to_bytes(), 1)
        t2 = time.perf_counter()
        batch_s.append(t1 - t0)
        whole_s.append(t2 - t1)
        sizes.append(sum(len(r) for r in records))
        whole_bytes = len(whole)
        for key, value in changes.items():
            if value is None:
                copy.pop(key, None)
            else:
                copy[key] = value
    assert snapshot_of(copy) == s.snapshot(), "the entries written do not reproduce the state"
    if journal:
        print(asyncio.run(_restore(base, journal, args.restore_runs)), flush=True)
    b_p99 = float(np.percentile(batch_s, 99)) * 1e3
    w_p99 = float(np.percentile(whole_s, 99)) * 1e3
    print(
        f"slicer snapshot: {len(s.running_jobs)} running on {len(s.node_names)} nodes, "
        f"{args.batches} batches of {args.per_batch} ends + {args.per_batch} submits: "
        f"changed entries {np.mean(batch_s) * 1e3:.2f} ms mean / {b_p99:.2f} ms p99, "
        f"{np.mean(sizes) / 1024:.1f} KiB; anchor (whole state, deflated): "
        f"{np.mean(whole_s) * 1e3:.2f} ms mean / {w_p99:.2f} ms p99, {whole_bytes / 1024:.0f} KiB"
    )
    print(
        f"slicer_snapshot: running={len(s.running_jobs)} nodes={len(s.node_names)} "
        f"batch_ms_p99={b_p99:.2f} whole_ms_p99={w_p99:.2f} "
        f"record_bytes_mean={np.mean(sizes):.0f} whole_bytes={whole_bytes} "
        f"ratio={b_p99 / w_p99:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
