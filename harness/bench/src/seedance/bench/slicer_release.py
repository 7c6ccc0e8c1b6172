"""Micro-benchmark of what one tenant's waiting jobs add to another tenant's job end.

Owns one measurement, in process and without the bus (the decision the slicer leader makes on
the event loop for a job end): a `Scheduler` with one node; globex holds a GPU and cycles
`--releases` times (submit the next job, which waits; end the current one: the next is placed),
and each `Scheduler.finish` is timed. First quiet, then with `--floods` flooding tenants each at
its bound on waiting jobs (`--bound`, the default `SEEDANCE_SLICER_MAX_WAITING_PER_TENANT`):

* ``quota_same``: a quota in force (every tenant 1 GPU), the flood's jobs held over quota,
  all of one request shape;
* ``quota_distinct``: the same, every job of its own shape (its GPU memory);
* ``quota_own``: the flooding tenant's own job end (its held shapes re-checked, once each);
* ``capacity_distinct``: no quota, the flood's jobs waiting for capacity, each of its own
  shape (a junk `gpu_models` entry): each release retries the first job of every shape.

Per case it prints the p50 and max of `finish` in ms, the re-checks per release
(`Scheduler.held_rechecked`) and the ratio of the p50 to the quiet p50. It must not change
the scheduler's decisions or touch the bus.

Last line: ``slicer_release: bound=<n> floods=<n> quiet_ms=<p50> worst_ms=<p50> ratio=<n>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from seedance.slicer.core import (
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    QuotaPolicy,
    Scheduler,
    SchedulerConfig,
)

__all__ = ["main"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-slicer-release", description=__doc__)
    p.add_argument("--bound", type=int, default=SchedulerConfig().max_waiting_per_tenant)
    p.add_argument("--floods", type=int, default=1, help="tenants at their bound")
    p.add_argument("--releases", type=int, default=20)
    return p.parse_args(argv)


def _quota(floods: int) -> QuotaPolicy:
    lines = [f"  f{i}: {{quota: {{gpus: 1}}}}" for i in range(floods)]
    return QuotaPolicy.from_yaml(
        "version: 1\ntenants:\n  globex: {quota: {gpus: 1}}\n" + "\n".join(lines) + "\n"
    )


def _pool(bound: int, quota: QuotaPolicy | None, floods: int) -> Scheduler:
    """With a quota (it holds the floods back), a GPU per tenant and one spare; without, the
    one GPU globex holds."""
    s = Scheduler(SchedulerConfig(max_waiting_per_tenant=bound))
    if quota is not None:
        s.set_quota(quota, 0.0)
    gpus = (GpuSpec(model="T4", mem_mib=16_000),) * (floods + 2 if quota is not None else 1)
    s.upsert_node(NodeSpec(name="n1", cpu_milli=64_000, memory_mib=256_000, gpus=gpus), 0.0)
    return s


def _flood(s: Scheduler, tenant: str, bound: int, shape: str, holder: bool) -> None:
    """`tenant` at its bound: `holder` first runs a job (its quota); then `bound` wait."""
    if holder:
        s.submit(JobSpec(job_id="run", tenant=tenant, gpus=1), 1.0)
    for i in range(bound):
        kw: dict[str, object] = {}
        if shape == "mem":
            kw["gpu_mem_mib"] = i + 1
        elif shape == "models":
            kw["gpu_models"] = ("T4", f"x{i}")
        s.submit(JobSpec(job_id=f"w{i}", tenant=tenant, gpus=1, **kw), 2.0)  # type: ignore[arg-type]
    s.submit(JobSpec(job_id="over", tenant=tenant, gpus=1), 2.0)  # refused: at the bound


def _cycle(s: Scheduler, tenant: str, releases: int) -> tuple[list[float], float]:
    """`tenant` ends its running job `releases` times, its next one waiting (at priority 100:
    without a quota, ahead of the flood in the queue): ms per end, and re-checks per end."""
    times: list[float] = []
    s.held_rechecked = 0
    now = 10.0
    for k in range(releases):
        s.submit(JobSpec(job_id=f"g{k + 1}", tenant=tenant, gpus=1, priority=100), now)
        t0 = time.perf_counter()
        effects = s.finish(tenant, f"g{k}", now + 0.5)
        times.append((time.perf_counter() - t0) * 1000)
        if not any(isinstance(e, Placed) and e.job.job_id == f"g{k + 1}" for e in effects):
            raise SystemExit(f"{tenant}'s g{k + 1} was not placed on g{k}'s end")
        now += 1.0
    return times, s.held_rechecked / releases


def _own(s: Scheduler, tenant: str, releases: int) -> tuple[list[float], float]:
    """`tenant` ends its running job `releases` times, its oldest held job admitted and placed
    each time (its other held shapes re-checked): ms per end, and re-checks per end."""
    times: list[float] = []
    s.held_rechecked = 0
    running, now = "run", 10.0
    for _ in range(releases):
        t0 = time.perf_counter()
        effects = s.finish(tenant, running, now)
        times.append((time.perf_counter() - t0) * 1000)
        placed = [e.job.job_id for e in effects if isinstance(e, Placed)]
        if len(placed) != 1:
            raise SystemExit(f"{tenant}'s end of {running} placed {placed}")
        running, now = placed[0], now + 1.0
    return times, s.held_rechecked / releases


def _case(args: argparse.Namespace, name: str) -> tuple[float, float, float]:
    quota = None if name.startswith("capacity") else _quota(args.floods)
    s = _pool(args.bound, quota, args.floods)
    s.submit(JobSpec(job_id="g0", tenant="globex", gpus=1, priority=100), 1.0)
    shape = {"quota_same": "same", "quota_distinct": "mem", "quota_own": "mem"}.get(name, "models")
    if name != "quiet":
        for i in range(args.floods):
            _flood(s, f"f{i}", args.bound, shape, holder=quota is not None)
    if name == "quota_own":
        times, rechecks = _own(s, "f0", args.releases)
    else:
        times, rechecks = _cycle(s, "globex", args.releases)
    return statistics.median(times), max(times), rechecks


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    cases = ["quiet", "quota_same", "quota_distinct", "quota_own", "capacity_distinct"]
    quiet = worst = 0.0
    for name in cases:
        p50, peak, rechecks = _case(args, name)
        quiet = p50 if name == "quiet" else quiet
        worst = max(worst, p50)
        print(
            f"{name:18} p50={p50:9.2f} ms max={peak:9.2f} ms rechecks/release={rechecks:7.1f}"
            f" ratio={p50 / quiet:7.1f}",
            flush=True,
        )
    print(
        f"slicer_release: bound={args.bound} floods={args.floods} quiet_ms={quiet:.2f} "
        f"worst_ms={worst:.2f} ratio={worst / quiet:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
