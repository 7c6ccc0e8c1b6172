"""`make bench-bus`: one replica's publish → consume → ack throughput, and job-event → cost latency.

Throughput: N small job events are published, then consumed by one Seedance ``PullConsumer``
(decode into typed events, a handler, ack; batches of 100), timed from the first fetch to the
last ack. The anchor, measured in the same run on the same messages, is a bare nats-py
fetch(100)+ack loop with no decoding or handling: what the research note calls the client's
ceiling (5,000-13,000 events/s on these machines).

Latency: the slicer and the cost-ledger run as processes; jobs are submitted and finished one at
a time through the SDK, and the latency is from publishing ``job.finished`` to the tenant's cost
report arriving on its stream (slicer → release → ledger → cost stream). Medians and p99 over
the runs.

The ledger bills trusted time only and reports a job once the charge window of its end has
closed: once a collector's sample is past the window's end plus the lateness (300 s + 60 s),
so a bench waiting for that in real time would measure the window, not the pipeline. So the
bench is the replayed fleet's collector (``FleetClock``), as the demo's replay is: the fleet's
clock is virtual, in the past (one window per job, ending before the server's clock, so no input
is ahead of it), and the slicer runs with ``request_clock=replay`` (a tenant's request happens
"now" in the replay). For each job: the fleet's clock is at the start of a window (a node
inventory, which the slicer reads), the job is submitted and its placement awaited, the clock
moves a minute on, then ``job.finished`` is published (the timer starts) followed at once by the
collector's sample past the window's end plus lateness, and the timer stops when the job's
report arrives. What is timed is what a live fleet does when its collector's tick passes the
window: the finish through the slicer, the release and the sample through the ledger's merged
input, the window's close, the report on the tenant's stream.

The latency's anchor, on the same server in the same run: a bare two-hop nats-py relay
(``seedance.bench.anchors``: publish → hop → hop → reader, one process per hop), the same path
with no Seedance code on it.

Last line: ``bus: events_per_s=<n> e2e_p50_ms=<n> e2e_p99_ms=<n> bare_events_per_s=<n>
ratio=<n> relay_p99_ms=<n> latency_ratio=<n>`` (ratio: ours / bare; latency_ratio: our p99 /
the relay's p99).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from seedance.bench.anchors import bare_fetch_ack_rate, relay_latencies
from seedance.core import Bus, BusSettings, Delivery, PullConsumer
from seedance.events import decode, new_event_id
from seedance.events.cost import JobCostReport
from seedance.events.jobs import JobEvent, JobSubmitted, ResourceRequest
from seedance.events.subjects import ConsumerSpec, costs, jobs, telemetry
from seedance.events.telemetry import GpuInfo, GpuSampleBatch, NodeInventory
from seedance.sdk import SeedanceClient
from seedance.testing.paths import REPO
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from seedance.testing.waits import wait_consumer_settled, wait_inventory_known

#: The ledger's charge window and lateness (its defaults, which the bench runs it with).
WINDOW = timedelta(seconds=300)
LATENESS = timedelta(seconds=60)
_NODES = 16


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def publish_events(bus: Bus, tenant: str, n: int) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        (
            jobs.subject(tenant, "submitted"),
            JobSubmitted(
                id=new_event_id(),
                at=at,
                job_id=f"j{i}",
                tenant=tenant,
                request=ResourceRequest(gpus=1),
            ),
        )
        for i in range(n)
    ]
    await bus.publish_many(events, window=1000)


async def seedance_consume(bus: Bus, tenant: str, n: int, durable: str) -> float:
    handled = 0

    async def handler(d: Delivery[Any]) -> None:
        nonlocal handled
        handled += 1

    spec = ConsumerSpec(
        durable=durable,
        # The stream the events were published to: SEEDANCE_JOBS takes its copies later, and
        # timing it would time the server's sourcing too (review L5).
        stream=jobs.STREAM,
        filter_subjects=(jobs.tenant_wildcard(tenant),),
        max_ack_pending=-1,
    )
    c = PullConsumer(spec, service="bench", types=JobEvent, handler=handler, batch=100)
    await c.start(bus)
    t0 = time.perf_counter()
    while handled < n:
        try:
            msgs = await c._sub.fetch(100, timeout=1.0)
        except TimeoutError:
            continue
        await c.process(msgs)
    elapsed = time.perf_counter() - t0
    await c.close()
    return n / elapsed


async def bare(bus: Bus, tenant: str, n: int, durable: str) -> float:
    return await bare_fetch_ack_rate(
        bus.js, jobs.STREAM, jobs.tenant_wildcard(tenant), n, durable, batch=100
    )


async def throughput(url: str, n: int, rounds: int) -> tuple[float, float]:
    bus = await Bus.connect(BusSettings(url=url, name="bench-bus"))
    await bus.ensure_streams()
    ours: list[float] = []
    anchor: list[float] = []
    for r in range(rounds):
        tenant = f"bench{r}"
        await publish_events(bus, tenant, n)
        # Alternate the order so that neither always runs on a warmer server.
        if r % 2:
            anchor.append(await bare(bus, tenant, n, f"raw{r}"))
            ours.append(await seedance_consume(bus, tenant, n, f"ours{r}"))
        else:
            ours.append(await seedance_consume(bus, tenant, n, f"ours{r}"))
            anchor.append(await bare(bus, tenant, n, f"raw{r}"))
        log(
            f"  round {r + 1}/{rounds}: seedance {ours[-1]:8.0f} ev/s   "
            f"bare nats-py {anchor[-1]:8.0f} ev/s"
        )
    await bus.close()
    return statistics.median(ours), statistics.median(anchor)


@dataclass
class FleetClock:
    """The replayed fleet's clock, moved by the bench as the fleet's trusted collector.

    The slicer's clock moves with the inventory it reads (a node of the bench's own with no
    GPUs re-announced, so no job's node changes); the ledger's with the collector's samples (an
    empty batch of that node: it costs nothing and moves the clock, as the demo's closing
    sample does).
    """

    bus: Bus
    clock_node: NodeInventory

    async def slicer_to(self, at: datetime) -> None:
        """Move the slicer's clock to ``at`` and wait until it has read it."""
        inv = msgspec.structs.replace(self.clock_node, id=new_event_id(), at=at)
        ack = await self.bus.publish(telemetry.inventory(inv.node), inv)
        await wait_consumer_settled(self.bus, "SEEDANCE_TELEMETRY", "slicer-inventory", ack.seq)

    async def ledger_to(self, at: datetime) -> None:
        """Publish the collector's sample at ``at`` (not waited for: the ledger's part)."""
        batch = GpuSampleBatch(id=new_event_id(), at=at, node=self.clock_node.node, gpus=[])
        await self.bus.publish(telemetry.sample(batch.node), batch)


def _fleet(start: datetime) -> list[NodeInventory]:
    """The bench's nodes and its clock node, announced at ``start``."""
    nodes = [
        NodeInventory(
            id=new_event_id(), at=start, node=f"bench-node-{i}", cpu_milli=64_000,
            memory_mib=262_144,
            gpus=[GpuInfo(index=g, model="V100M32", mem_total_mib=32_768) for g in range(8)],
        )
        for i in range(_NODES)
    ]  # fmt: skip
    clock = NodeInventory(
        id=new_event_id(), at=start, node="bench-clock", cpu_milli=1_000, memory_mib=1_024, gpus=[]
    )
    return [*nodes, clock]


def _virtual_start(windows: int) -> datetime:
    """A window boundary ``windows`` windows and an hour before the server's clock: every input
    of the run is behind it (the ledger refuses one ahead of its stream time)."""
    w = WINDOW.total_seconds()
    ahead = windows * w + 3600
    return datetime.fromtimestamp((time.time() - ahead) // w * w, UTC)


async def _start_services(procs: ServiceProcesses, bus: Bus, start: datetime) -> FleetClock:
    """The slicer and the ledger, the fleet announced, the ledger's clock at ``start``."""
    procs.start("slicer", replica="bench-slicer", request_clock="replay")
    procs.start("cost-ledger", replica="bench-ledger")
    fleet = _fleet(start)
    await bus.ensure_streams()
    await bus.publish_many([(telemetry.inventory(n.node), n) for n in fleet])
    await wait_inventory_known(bus)
    clock = FleetClock(bus, fleet[-1])
    await clock.ledger_to(start)
    await wait_consumer_settled(bus, "SEEDANCE_LEDGER_IN", "ledger-in-bench-ledger")
    return clock


async def _one_job(
    client: SeedanceClient,
    clock: FleetClock,
    reports: asyncio.Queue[tuple[float, JobCostReport]],
    job: str,
    window: datetime,
) -> float:
    """One job in the charge window starting at ``window``: milliseconds from publishing its
    ``job.finished`` to its report."""
    tenant = "latency"
    await clock.slicer_to(window + timedelta(seconds=1))
    await client.submit_job(tenant, job, gpus=1, wait_s=30)
    await clock.slicer_to(window + timedelta(seconds=61))
    t0 = time.perf_counter()
    await client.finish_job(tenant, job)
    await clock.ledger_to(window + WINDOW + LATENESS + timedelta(seconds=1))
    while True:  # the report of this job (earlier jobs' late revisions are skipped)
        t_done, ev = await reports.get()
        if ev.job_id == job:
            return (t_done - t0) * 1000


async def latency(url: str, jobs_n: int, logdir: Path) -> list[float]:
    warm = 5  # the first few warm the processes up
    start = _virtual_start(jobs_n + warm + 2)
    bus = await Bus.connect(BusSettings(url=url, name="bench-bus-e2e"))
    procs = ServiceProcesses(url, logdir)
    client = await SeedanceClient.connect(url)
    try:
        clock = await _start_services(procs, bus, start)
        reports: asyncio.Queue[tuple[float, JobCostReport]] = asyncio.Queue()

        async def on_cost(msg: Any) -> None:
            ev = decode(msg.data)
            if isinstance(ev, JobCostReport) and ev.revision == 0:
                reports.put_nowait((time.perf_counter(), ev))

        await bus.subscribe(costs.subject("latency", "report"), on_cost)
        out: list[float] = []
        async with asyncio.timeout(600):
            for i in range(jobs_n + warm):
                ms = await _one_job(client, clock, reports, f"lat-{i}", start + i * WINDOW)
                if i >= warm:
                    out.append(ms)
                if (i + 1) % 50 == 0:
                    log(f"  latency: {i + 1}/{jobs_n + warm} jobs costed")
        return out
    finally:
        await client.close()
        await bus.close()
        codes = procs.stop_all()
        if any(codes.values()):
            log(f"  services exited with {codes}; logs in {logdir}")


def _p99(sorted_ms: list[float]) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(0.99 * len(sorted_ms)))]


async def amain(args: argparse.Namespace) -> int:
    # Each phase gets a fresh server, so the services of the second never see the first's load.
    server = NatsServer()
    try:
        log(f"throughput: {args.events} events x {args.rounds} rounds, one consumer, batch 100")
        ours, anchor = await throughput(server.url, args.events, args.rounds)
    finally:
        server.stop()
    server = NatsServer()
    try:
        log(f"latency anchor: {args.jobs} messages through a bare two-hop nats-py relay")
        relay = sorted(await relay_latencies(server.url, args.jobs))
        log(
            f"latency: {args.jobs} jobs, job.finished -> its cost report, slicer + cost-ledger "
            "as processes, the fleet's clock driven by the bench"
        )
        lat = sorted(await latency(server.url, args.jobs, REPO / "out" / "bench-bus"))
    finally:
        server.stop()
    p50 = statistics.median(lat)
    p99 = _p99(lat)
    relay_p99 = _p99(relay)
    print(
        f"throughput  seedance consumer {ours:,.0f} events/s (median of {args.rounds}); "
        f"bare nats-py fetch+ack {anchor:,.0f} events/s; ratio {ours / anchor:.2f}; goal >= 5,000"
    )
    print(
        f"latency     job.finished -> its cost report: p50 {p50:.1f} ms, p99 {p99:.1f} ms over "
        f"{len(lat)} jobs; goal p99 <= 100 ms"
    )
    print(
        f"anchor      bare two-hop relay (publish -> hop -> hop -> reader, plain nats-py, one "
        f"process per hop): p50 {statistics.median(relay):.1f} ms, p99 {relay_p99:.1f} ms; "
        f"ratio of p99s {p99 / relay_p99:.1f}"
    )
    print(
        f"bus: events_per_s={ours:.0f} e2e_p50_ms={p50:.1f} e2e_p99_ms={p99:.1f} "
        f"bare_events_per_s={anchor:.0f} ratio={ours / anchor:.2f} "
        f"relay_p99_ms={relay_p99:.1f} latency_ratio={p99 / relay_p99:.2f}"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=200)
    return asyncio.run(amain(p.parse_args()))
