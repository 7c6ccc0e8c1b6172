"""Micro-benchmark of the slicer's per-batch snapshot (`Scheduler.snapshot` / `to_bytes`).

Owns one measurement: a `Scheduler` on the first `--nodes` GPU nodes of the Alibaba GPU trace
v2023 (openb), filled with the trace's pods until about `--running` jobs run, then `--batches`
rounds of "one job ends, one is submitted, snapshot", as the service does after every batch.
It prints the mean time of `snapshot()`, of its msgpack encoding, and of both per batch, and,
as the anchor measured in the same run, `snapshot()` with its kept running records dropped
before each call (every record built afresh, as before they were kept), with the ratio. It
must not change the scheduler's decisions or touch the bus.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from seedance.slicer.core.inputs import GpuSpec, JobSpec, NodeSpec
from seedance.slicer.core.scheduler import Scheduler
from seedance.slicer.core.snapshot import encode_snapshot
from seedance.traces import alibaba

__all__ = ["main"]


def _nodes(path: Path, count: int) -> list[NodeSpec]:
    rows = [r for r in alibaba.read_nodes(path) if r.gpu > 0][:count]
    return [
        NodeSpec(
            name=r.sn,
            cpu_milli=r.cpu_milli,
            memory_mib=r.memory_mib,
            gpus=tuple(GpuSpec(model=r.model or "none") for _ in range(r.gpu)),
        )
        for r in rows
    ]


def _jobs(path: Path) -> list[JobSpec]:
    return [
        JobSpec(
            job_id=p.name,
            tenant="t",
            gpus=p.num_gpu,
            gpu_milli=p.gpu_milli if p.num_gpu else 1000,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
        )
        for p in alibaba.read_pods(path)
        if p.num_gpu <= 8
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--data", type=Path, required=True, help="the Alibaba trace folder (alibaba-gpu-v2023)"
    )
    ap.add_argument("--nodes", type=int, default=260)
    ap.add_argument("--running", type=int, default=1800)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args(argv)
    s = Scheduler()
    for n in _nodes(args.data / "openb_node_list_gpu_node.csv", args.nodes):
        s.upsert_node(n, 0.0)
    jobs = iter(_jobs(args.data / "openb_pod_list_default.csv"))
    now = 0.0
    while len(s.running_jobs) < args.running:
        now += 1.0
        s.submit(next(jobs), now)
    running = list(s.running_jobs)
    snap_s = enc_s = fresh_s = 0.0
    for i in range(args.batches):
        now += 1.0
        tenant, job_id = running[i % len(running)]
        s.finish(tenant, job_id, now)
        s.submit(next(jobs), now)
        t0 = time.perf_counter()
        snap = s.snapshot()
        t1 = time.perf_counter()
        encode_snapshot(snap)
        t2 = time.perf_counter()
        snap_s += t1 - t0
        enc_s += t2 - t1
        s._saved = {}  # the anchor: nothing kept (its snapshot keeps them again)
        t3 = time.perf_counter()
        fresh = s.snapshot()
        fresh_s += time.perf_counter() - t3
        assert fresh == snap
    b = args.batches
    print(
        f"slicer snapshot: {len(s.running_jobs)} running on {len(s.node_names)} nodes, "
        f"{b} batches: snapshot {snap_s / b * 1e3:.2f} ms, encode {enc_s / b * 1e3:.2f} ms, "
        f"to_bytes {(snap_s + enc_s) / b * 1e3:.2f} ms per batch; anchor (nothing kept): "
        f"snapshot {fresh_s / b * 1e3:.2f} ms, {fresh_s / snap_s:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
