"""`make bench-cli-status`: how long ``seedance jobs status`` takes on a tenant's long history.

``jobs status`` and ``jobs list`` hold no state of their own: each reads the tenant's whole
slicing decisions (``seedance.slicing.<t>.*``) and cost stream (``seedance.costs.<t>.*``)
through consumers of its own (what tenant permissions allow; no job token in the subjects to
filter on), then folds them. So its time grows with the tenant's history, and this measures it:
a fresh server holds ``--jobs`` jobs' placements and releases, ``--entries`` cost entries spread
over them and one report each; ``SeedanceClient.job_statuses(tenant, job_id=...)`` is timed
(median of ``--rounds``), and the whole CLI once as a subprocess (its Python start-up included).

The anchor, on the same messages in the same run: a bare nats-py ordered push consumer per
filter whose callback only counts (no decode, no fold), the client's ceiling for reading a
stream.

Last line: ``cli_status: events=<n> status_s=<s> events_per_s=<n> bare_events_per_s=<n>
ratio=<ours/bare> cli_wall_s=<s>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance.core import Bus, BusSettings
from seedance.events import Event, new_event_id
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
)
from seedance.events.subjects import costs, slicing
from seedance.sdk import SeedanceClient
from seedance.testing.servers import NatsServer

TENANT = "acme"
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def history(jobs: int, entries: int) -> list[tuple[str, Event]]:
    """A tenant's decisions and costs as the slicer and the ledger publish them."""
    out: list[tuple[str, Event]] = []
    for i in range(jobs):
        at = T0 + timedelta(seconds=i)
        out.append((slicing.subject(TENANT, "placement"), Placement(
            id=new_event_id(at=at), at=at, job_id=f"j{i}", tenant=TENANT, node=f"n{i % 50}",
            kind=PlacementKind.WHOLE, gpu_model="T4", gpus=[GpuAssignment(index=i % 8)],
        )))  # fmt: skip
        end = at + timedelta(hours=1)
        out.append((slicing.subject(TENANT, "released"), JobReleased(
            id=new_event_id(at=end), at=end, job_id=f"j{i}", tenant=TENANT,
            outcome=EndOutcome.FINISHED,
        )))  # fmt: skip
    for k in range(entries):
        at = T0 + timedelta(seconds=k)
        out.append((costs.subject(TENANT, "entry"), CostEntry(
            id=new_event_id(at=at), at=at, tenant=TENANT, job_id=f"j{k % jobs}",
            period_start=at, period_end=at + timedelta(minutes=5), cost_micro_usd=1_000,
            gpu_hours_micro=83_333,
        )))  # fmt: skip
    for i in range(jobs):
        at = T0 + timedelta(hours=2, seconds=i)
        out.append((costs.subject(TENANT, "report"), JobCostReport(
            id=new_event_id(at=at), at=at, tenant=TENANT, job_id=f"j{i}", started_at=T0,
            finished_at=at, gpu_hours=1.0, cost_micro_usd=1_000 * (entries // jobs),
        )))  # fmt: skip
    return out


async def bare_read_s(bus: Bus, n: int) -> float:
    """Seconds for bare ordered consumers (a callback that only counts) to read all ``n``
    messages of the two filters."""
    started = time.perf_counter()
    seen = 0
    for subject in (slicing.tenant_wildcard(TENANT), costs.tenant_wildcard(TENANT)):
        done = asyncio.Event()

        async def count(msg: Any, done: asyncio.Event = done) -> None:
            nonlocal seen
            seen += 1
            if msg.metadata.num_pending == 0:
                done.set()

        sub = await bus.js.subscribe(subject, ordered_consumer=True, cb=count)
        try:
            await asyncio.wait_for(done.wait(), timeout=600)
        finally:
            await sub.unsubscribe()
    assert seen == n, (seen, n)
    return time.perf_counter() - started


async def measure(url: str, args: argparse.Namespace) -> tuple[int, float, float]:
    bus = await Bus.connect(BusSettings(url=url))
    try:
        await bus.ensure_streams()
        events = history(args.jobs, args.entries)
        log(f"publishing {len(events):,} events ({args.jobs:,} jobs, {args.entries:,} entries)")
        await bus.publish_many(events, window=1000)
        client = await SeedanceClient.connect(url)
        ours: list[float] = []
        bare: list[float] = []
        async with client:
            for r in range(args.rounds):
                started = time.perf_counter()
                (status,) = await client.job_statuses(TENANT, job_id="j7", timeout_s=600)
                ours.append(time.perf_counter() - started)
                assert status.state == "finished"
                assert status.cost.report is not None
                bare.append(await bare_read_s(bus, len(events)))
                log(f"  round {r + 1}: status {ours[-1]:.2f} s, bare read {bare[-1]:.2f} s")
        return len(events), statistics.median(ours), statistics.median(bare)
    finally:
        await bus.close()


def cli_wall_s(url: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "seedance.sdk.cli", "--nats-url", url, "jobs", "status",
         "--tenant", TENANT, "--job", "j7", "--timeout-s", "600"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "state      finished" in done.stdout, done.stdout
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2_000, help="jobs in the tenant's history")
    p.add_argument("--entries", type=int, default=20_000, help="cost entries over those jobs")
    p.add_argument("--rounds", type=int, default=3, help="timed reads (median)")
    args = p.parse_args(argv)
    server = NatsServer()
    try:
        n, ours, bare = asyncio.run(measure(server.url, args))
        wall = cli_wall_s(server.url)
    finally:
        server.stop()
    print(
        f"jobs status over {n:,} events: {ours:.2f} s ({n / ours:,.0f} events/s, median of "
        f"{args.rounds}); bare nats-py ordered read {bare:.2f} s ({n / bare:,.0f} events/s); "
        f"ratio {bare / ours:.2f}; the CLI as a process {wall:.2f} s"
    )
    print(
        f"cli_status: events={n} status_s={ours:.3f} events_per_s={n / ours:.0f} "
        f"bare_events_per_s={n / bare:.0f} ratio={bare / ours:.2f} cli_wall_s={wall:.2f}"
    )
    return 0
