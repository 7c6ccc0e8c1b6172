"""`make bench-ledger`: one cost-ledger replica's events/s through the bus.

A seeded fleet's events (seedance.testing.workloads: sample batches, inventory, placements,
releases) are published first, so the merged input stream holds them all; then one replica (the
real ``LedgerService``, in this process, on a local nats-server) consumes them: fetch, decode,
step the core, publish every cost entry / report and wait for the stream's acks, checkpoint to
KV. Timed from the replica's first fetch (after its start: connection, checkpoint restore,
consumer bound) to the moment it has stepped through the last input and its outputs are acked.
Each pass is a fresh replica (its own checkpoint key) re-reading the same stream; its outputs
are then duplicates of the first pass's to the stream, which still costs a publish and an ack.

Two orders of the same events, each on its own server, in one run:
- live (the goal's figure): published a few ticks at a time, each chunk sourced into the merged
  stream before the next is sent, so that stream follows event time as a live fleet's does;
- backlog: published all at once. The server then sources the slicing and telemetry
  streams at their own paces, a placement can land minutes of event time after the samples that
  closed its window, and every such late fact re-opens a window: the replica recomputes it and
  publishes adjustments, several outputs per input (what a replica catching up after an outage
  does; `make chaos-ledger` checks its exactness).

The anchors, measured in the same run on the same events in the merged stream's order: the
pure step function (decode + core, no bus) of ``LedgerReplica``, the ceiling of a replica's
core; and, before each pass on the same server, the bare nats-py fetch + ack of the same stream
(``seedance.bench.anchors``), the ceiling of any consumer on this machine.

Last line: ``ledger_bench: events_per_s=<live> replicas=1 backlog_events_per_s=<n>
outputs_per_input=<live> backlog_outputs_per_input=<n> bare_events_per_s=<live bare>
ratio=<live / bare>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from seedance.bench.anchors import bare_fetch_ack_rate
from seedance.core import Bus, BusSettings, PullReader, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.events import decode
from seedance.events.subjects import replica_consumer
from seedance.testing.servers import NatsServer
from seedance.testing.workloads import workload

GOAL = 5_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pure_rate(stream: list[tuple[int, bytes]]) -> tuple[float, int]:
    """Inputs per second of the step function alone, and the outputs it returned."""
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(retention_windows=288))
    outputs, t0 = 0, time.perf_counter()
    for seq, data in stream:
        outputs += len(replica.step(seq, decode(data, INPUT_TYPES)))
    return len(stream) / (time.perf_counter() - t0), outputs


async def publish_in_event_time_order(bus: Bus, events: list, chunk: int) -> None:
    """Publish ``chunk`` events at a time, each chunk in the merged stream before the next.

    ``chunk`` 0: all at once (a backlog: the sources interleave as the server goes).
    """
    chunk = chunk or len(events)
    for i in range(0, len(events), chunk):
        await bus.publish_many(events[i : i + chunk])
        want = min(i + chunk, len(events))
        async with asyncio.timeout(30):
            while (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages < want:
                await asyncio.sleep(0.001)  # the server sources them in; bounded above
        if i // chunk % 50 == 0:
            log(f"published {want:,}/{len(events):,} events")


async def timed_read(bus: Bus, last_seq: int, batch: int) -> tuple[float, list[tuple[int, bytes]]]:
    """Wall µs per input of reading the merged stream as a replica does (no step), and it."""
    spec = replica_consumer("ledger-in", "bench-read", start_seq=1)
    await bus.ensure_consumer(spec)
    reader = PullReader(bus.nc, spec.stream, spec.durable, batch=batch)
    await reader.start()
    stream: list[tuple[int, bytes]] = []
    seq, t0 = 0, time.perf_counter()
    try:
        async with asyncio.timeout(120):
            while seq < last_seq:
                for msg in await reader.next_batch(timeout_s=1.0):
                    seq = msg.metadata.sequence.stream
                    stream.append((seq, msg.data))
    finally:
        await reader.close()
        await bus.js.delete_consumer(spec.stream, spec.durable)
    return (time.perf_counter() - t0) * 1e6 / last_seq, stream


async def bare_rate(url: str, last_seq: int, i: int, batch: int) -> float:
    """The bare client's fetch + ack rate over the same merged stream, on the same server."""
    bus = await Bus.connect(BusSettings(url=url))
    try:
        return await bare_fetch_ack_rate(
            bus.js, "SEEDANCE_LEDGER_IN", ">", last_seq, f"bare{i}", batch=batch
        )
    finally:
        await bus.close()


async def one_pass(url: str, last_seq: int, i: int, batch: int) -> float:
    runtime = ServiceRuntime("cost-ledger", BusSettings(url=url), registry=CollectorRegistry())
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(retention_windows=288))
    service = LedgerService(
        runtime,
        replica,
        name=f"bench{i}",
        checkpoint_key=f"bench{i}",
        batch=batch,
        checkpoint_every_s=5.0,
    )
    await service.start()
    t0 = time.perf_counter()
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(600):
        while replica.seq < last_seq or not service._consistent:
            await asyncio.sleep(0.01)  # the replica runs in this loop; a poll, bounded above
        await service._settle_acks()  # every output durable on the stream
    dt = time.perf_counter() - t0
    await service.stop()
    await task
    await service.close()
    return last_seq / dt


@dataclass
class Figures:
    """One order's median rate, its pure-step anchor, outputs per input, reading cost."""

    rate: float
    anchor: float
    bare: float
    outputs_per_input: float
    read_us: float


async def measure(args: argparse.Namespace, events: list, chunk: int, label: str) -> Figures:
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url))
        await bus.ensure_streams()
        await publish_in_event_time_order(bus, events, chunk)
        last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
        read_us, stream = await timed_read(bus, last, args.batch)
        await bus.close()
        pure = [pure_rate(stream) for _ in range(2)]
        anchor, outputs = statistics.median(r for r, _ in pure), pure[0][1] / len(stream)
        log(
            f"{label}: {len(stream)} inputs, {outputs:.2f} outputs per input; pure step "
            f"(decode + core, no bus) {anchor:,.0f} events/s; reading alone {read_us:.0f} µs each"
        )
        rates, bare = [], []
        for i in range(args.passes):
            bare.append(await bare_rate(server.url, last, i, args.batch))
            rates.append(await one_pass(server.url, last, i, args.batch))
            log(f"{label} pass {i}: {rates[-1]:,.0f} events/s (consume, step, publish + acks, "
                "checkpoint)")  # fmt: skip
    finally:
        server.stop()
    median, bare_median = statistics.median(rates), statistics.median(bare)
    log(f"{label}: bare nats-py fetch+ack of the same stream {bare_median:,.0f} events/s (median)")
    # Where a pass's time goes: per input, the step, the reading, and the rest (publishing
    # the outputs and settling their acks, checkpoints).
    step_us, pass_us = 1e6 / anchor, 1e6 / median
    log(
        f"{label}: median {median:,.0f} events/s = {median / anchor:.2f} x the pure step; "
        f"per input {pass_us:.0f} µs = step {step_us:.0f} + reading {read_us:.0f} "
        f"+ publishing, acks and checkpoints {pass_us - step_us - read_us:.0f}"
    )
    return Figures(median, anchor, bare_median, outputs, read_us)


async def run(args: argparse.Namespace) -> int:
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    live = await measure(args, wl.events, args.chunk, "live")
    backlog = await measure(args, wl.events, 0, "backlog")
    log(
        f"per replica: {live.rate:,.0f} events/s live = {live.rate / GOAL:.2f} x the 5,000/s "
        f"goal; {backlog.rate:,.0f} events/s catching up on a backlog "
        f"({backlog.outputs_per_input:.2f} outputs per input instead of "
        f"{live.outputs_per_input:.2f})"
    )
    print(
        f"ledger_bench: events_per_s={live.rate:.0f} replicas=1 "
        f"backlog_events_per_s={backlog.rate:.0f} outputs_per_input={live.outputs_per_input:.2f} "
        f"backlog_outputs_per_input={backlog.outputs_per_input:.2f} "
        f"bare_events_per_s={live.bare:.0f} ratio={live.rate / live.bare:.2f}"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument(
        "--chunk",
        type=int,
        default=64,
        help="events per chunk in the live order (64: about two ticks of a 30-node fleet)",
    )
    return asyncio.run(run(p.parse_args()))
