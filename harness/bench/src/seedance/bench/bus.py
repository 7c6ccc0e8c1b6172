"""`make bench-bus`: one replica's publish → consume → ack throughput, and job-event → cost latency.

Throughput: N small job events are published, then consumed by one Seedance ``PullConsumer``
(decode into typed events, a handler, ack; batches of 100), timed from the first fetch to the
last ack. The anchor, measured in the same run on the same messages, is a bare nats-py
fetch(100)+ack loop with no decoding or handling: what the research note calls the client's
ceiling (5,000-13,000 events/s on these machines).

Latency: the slicer and the cost-ledger run as processes; jobs are submitted and finished one at
a time through the SDK, and the latency is from publishing ``job.finished`` to the tenant's cost
entry arriving on its stream (placement → ledger → cost stream). Medians and p99 over the runs.

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from seedance.bench.anchors import bare_fetch_ack_rate, relay_latencies
from seedance.core import Bus, BusSettings, Delivery, PullConsumer
from seedance.events import decode, new_event_id
from seedance.events.cost import JobCostReport
from seedance.events.jobs import JobEvent, JobSubmitted, ResourceRequest
from seedance.events.subjects import ConsumerSpec, costs, jobs
from seedance.sdk import SeedanceClient
from seedance.testing.paths import REPO
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from seedance.testing.waits import wait_consumer_settled, wait_inventory_known


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
        stream="SEEDANCE_JOBS",
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
        bus.js, "SEEDANCE_JOBS", jobs.tenant_wildcard(tenant), n, durable, batch=100
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


async def latency(url: str, jobs_n: int, logdir: Path) -> list[float]:
    procs = ServiceProcesses(url, logdir)
    procs.start("slicer", replica="bench-slicer")
    procs.start("cost-ledger", replica="bench-ledger")
    nodes = logdir / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"bench-node-{i},64000,262144,8,V100M32\n" for i in range(16))
    )
    procs.start("telemetry-collector", node_csv=str(nodes), tick_s="5")
    bus = await Bus.connect(BusSettings(url=url, name="bench-bus-e2e"))
    await wait_inventory_known(bus)
    await wait_consumer_settled(bus, "SEEDANCE_LEDGER_IN", "ledger-in-bench-ledger")
    client = await SeedanceClient.connect(url)
    try:
        tenant = "latency"
        reports: asyncio.Queue[tuple[float, JobCostReport]] = asyncio.Queue()

        async def on_cost(msg: Any) -> None:
            ev = decode(msg.data)
            if isinstance(ev, JobCostReport) and ev.revision == 0:
                reports.put_nowait((time.perf_counter(), ev))

        await bus.nc.subscribe(costs.subject(tenant, "report"), cb=on_cost)
        # The ledger charges by event time and keeps 24 h of it; the collector's samples carry the
        # wall clock, so the jobs run in the recent past (ten minutes each, an hour ago).
        at = datetime.now(UTC) - timedelta(hours=1)
        out: list[float] = []
        async with asyncio.timeout(300):
            for i in range(jobs_n + 5):
                await client.submit_job(tenant, f"lat-{i}", gpus=1, at=at)
                t0 = time.perf_counter()
                await client.finish_job(tenant, f"lat-{i}", at=at + timedelta(minutes=10))
                while True:  # the report of this job (earlier jobs' late revisions are skipped)
                    t_done, ev = await reports.get()
                    if ev.job_id == f"lat-{i}":
                        break
                if i >= 5:  # the first few warm the processes up
                    out.append((t_done - t0) * 1000)
                if (i + 1) % 50 == 0:
                    log(f"  latency: {i + 1}/{jobs_n + 5} jobs costed")
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
        lat: list[float] = []
        if args.services:
            log(
                f"latency: {args.jobs} jobs, job.finished -> its cost report, "
                "slicer + cost-ledger as processes"
            )
            lat = sorted(await latency(server.url, args.jobs, REPO / "out" / "bench-bus"))
        else:
            log(
                "latency: job.finished -> its cost report is not measured (pass --services): "
                "since the ledger bills on trusted time only, a job's report waits for its "
                "charge window (300 s + 60 s lateness of sample time) to close, and this phase "
                "has to drive the fleet's clock itself before its figure means anything again"
            )
    finally:
        server.stop()
    nan = float("nan")
    p50 = statistics.median(lat) if lat else nan
    p99 = _p99(lat) if lat else nan
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
    p.add_argument(
        "--services",
        action="store_true",
        help="also time job.finished -> its cost report with the services as processes",
    )
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=200)
    return asyncio.run(amain(p.parse_args()))
