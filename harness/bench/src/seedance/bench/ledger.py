"""`make bench-ledger`: one cost-ledger replica's events/s through the bus, median of runs.

A seeded fleet's events (seedance.testing.workloads: sample batches, inventory, placements,
releases) are published first, so the merged input stream holds them all; then one replica (the
real ``LedgerService``, in this process, on a local nats-server) consumes them: fetch, decode,
step the core, publish every cost entry / report and wait for the stream's acks, checkpoint to
KV. Timed from the replica's first fetch (after its start: connection, checkpoint restore,
consumer bound) to the moment it has stepped through the last input and its outputs are acked.
Its totals are then compared with the core's order-free ``recompute`` of the events sent, at
the replica's clock (``diff_usd``: must be 0.00).

Two orders of the same events, ``--runs`` runs of each (default 5); every run is a fresh
nats-server, so a backlog run is a fresh merge of the sources:
- live (the goal's figure): published a few ticks at a time, each chunk sourced into the merged
  stream before the next is sent, so that stream follows event time as a live fleet's does;
- backlog: published all at once. The server then sources the slicing and telemetry
  streams at their own paces (one source can run hours of event time ahead of another), which
  is what a replica catching up after an outage reads.

The anchors, measured in each run on the same server and the same merged stream: the bare
nats-py fetch + ack of it (``seedance.bench.anchors``, the ceiling of any consumer on this
machine; measured just before the replica's pass), and the pure step function (decode + core, no
bus) of ``LedgerReplica`` over it, the ceiling of a replica's core.

Last line (rates are medians over the runs; ``ratio`` is the median of each run's replica rate
over its own bare rate): ``ledger_bench: events_per_s=<live> replicas=1
backlog_events_per_s=<n> outputs_per_input=<live> backlog_outputs_per_input=<n>
bare_events_per_s=<live bare> ratio=<live / bare> runs=<n> backlog_bare_events_per_s=<n>
backlog_ratio=<n> diff_usd=<largest |totals - recompute| of any run>``.
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
from seedance.cost_ledger.core.mapping import InputRejected
from seedance.cost_ledger.core.replica import INPUT_TYPES, LedgerReplica, ledger_inputs
from seedance.cost_ledger.service import LedgerService
from seedance.events import Event, decode
from seedance.events.subjects import replica_consumer
from seedance.testing.servers import NatsServer
from seedance.testing.workloads import workload

GOAL = 5_000
CONFIG = core.LedgerConfig(retention_windows=288)

#: One message of the merged stream: (sequence, subject, data, stream timestamp in epoch ms).
Stored = tuple[int, str, bytes, int]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pure_rate(stream: list[Stored]) -> tuple[float, int]:
    """Inputs per second of the step function alone (stepped as the service steps each
    message: its subject and stream timestamp checked), and the outputs it returned."""
    replica = LedgerReplica(core.default_price_book(), CONFIG)
    outputs, t0 = 0, time.perf_counter()
    for seq, subject, data, stream_ms in stream:
        try:
            pubs = replica.step(seq, decode(data, INPUT_TYPES), subject=subject,
                                stream_ms=stream_ms)  # fmt: skip
        except InputRejected:
            continue
        outputs += len(pubs)
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


async def timed_read(bus: Bus, last_seq: int, batch: int) -> tuple[float, list[Stored]]:
    """Wall µs per input of reading the merged stream as a replica does (no step), and it."""
    spec = replica_consumer("ledger-in", "bench-read", start_seq=1)
    await bus.ensure_consumer(spec)
    reader = PullReader(bus.nc, spec.stream, spec.durable, batch=batch)
    await reader.start()
    stream: list[Stored] = []
    seq, t0 = 0, time.perf_counter()
    try:
        async with asyncio.timeout(120):
            while seq < last_seq:
                for msg in await reader.next_batch(timeout_s=1.0):
                    md = msg.metadata  # what the replica reads of each message, too
                    seq = md.sequence.stream
                    stream.append((seq, msg.subject, msg.data, core.epoch_ms(md.timestamp)))
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


async def one_pass(url: str, last_seq: int, batch: int) -> tuple[float, LedgerReplica]:
    """One fresh replica through the whole merged stream: its events/s, and the replica."""
    runtime = ServiceRuntime("cost-ledger", BusSettings(url=url), registry=CollectorRegistry())
    replica = LedgerReplica(core.default_price_book(), CONFIG)
    service = LedgerService.build(
        runtime, replica, name="bench", checkpoint_key="bench", batch=batch, checkpoint_every_s=5.0
    )
    await service.start()
    t0 = time.perf_counter()
    task = asyncio.create_task(service.run())
    async with asyncio.timeout(600):
        while replica.seq < last_seq or not service.durable.consistent:
            await asyncio.sleep(0.01)  # the replica runs in this loop; a poll, bounded above
        await service.durable.settle_acks()  # every output durable on the stream
    dt = time.perf_counter() - t0
    await service.stop()
    await task
    await service.close()
    return last_seq / dt, replica


@dataclass(frozen=True)
class Run:
    """One run of one order: a fresh server, its merge, the anchors and one replica's pass."""

    rate: float
    bare: float
    anchor: float
    outputs_per_input: float
    read_us: float
    diff_micro_usd: int


@dataclass(frozen=True)
class Figures:
    """One order's runs and their medians."""

    runs: list[Run]

    def median(self, field: str) -> float:
        return statistics.median(getattr(r, field) for r in self.runs)

    @property
    def ratio(self) -> float:
        return statistics.median(r.rate / r.bare for r in self.runs)


class Recompute:
    """The core's order-free totals of the events sent, at a clock (cached per clock)."""

    def __init__(self, events: list[Event]) -> None:
        book = core.default_price_book()
        self._book = book
        self._inputs = ledger_inputs(events, book)
        self._at: dict[int, int] = {}

    def total_micro_usd(self, clock_ms: int) -> int:
        if clock_ms not in self._at:
            totals = core.recompute(self._inputs, self._book, clock_ms, CONFIG)
            self._at[clock_ms] = totals.total.total_usd_micro
        return self._at[clock_ms]


async def one_run(
    args: argparse.Namespace, events: list, chunk: int, label: str, recompute: Recompute
) -> Run:
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url))
        await bus.ensure_streams()
        await publish_in_event_time_order(bus, events, chunk)
        last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
        read_us, stream = await timed_read(bus, last, args.batch)
        await bus.close()
        anchor, outputs = pure_rate(stream)
        bare = await bare_rate(server.url, last, 0, args.batch)
        rate, replica = await one_pass(server.url, last, args.batch)
    finally:
        server.stop()
    clock = replica.clock_ms or 0
    diff = abs(replica.totals().total.total_usd_micro - recompute.total_micro_usd(clock))
    run = Run(rate, bare, anchor, outputs / len(stream), read_us, diff)
    log(
        f"{label}: {rate:,.0f} events/s (consume, step, publish + acks, checkpoint); bare "
        f"nats-py fetch+ack {bare:,.0f}/s, ratio {rate / bare:.2f}; pure step {anchor:,.0f}/s; "
        f"{run.outputs_per_input:.2f} outputs per input; diff {diff / 1e6:.2f} USD"
    )
    return run


def where_the_time_goes(label: str, fig: Figures) -> None:
    """Per input, at the medians: the step, the reading, and the rest (publishing the outputs
    and settling their acks, checkpoints, the service's own per-message work)."""
    rate, anchor, read_us = fig.median("rate"), fig.median("anchor"), fig.median("read_us")
    step_us, pass_us = 1e6 / anchor, 1e6 / rate
    log(
        f"{label}: median of {len(fig.runs)} runs {rate:,.0f} events/s, bare nats-py "
        f"{fig.median('bare'):,.0f}/s (ratio {fig.ratio:.2f}), {rate / anchor:.2f} x the pure "
        f"step; per input {pass_us:.0f} µs = step {step_us:.0f} + reading {read_us:.0f} "
        f"+ publishing, acks and checkpoints {pass_us - step_us - read_us:.0f}"
    )


async def run(args: argparse.Namespace) -> int:
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    events = [e for _, e in wl.events]
    recompute = Recompute(events)
    orders = {"live": args.chunk, "backlog": 0}
    figs: dict[str, Figures] = {}
    for label, chunk in orders.items():
        runs = [
            await one_run(args, wl.events, chunk, f"{label} run {i}", recompute)
            for i in range(args.runs)
        ]
        figs[label] = Figures(runs)
        where_the_time_goes(label, figs[label])
    live, backlog = figs["live"], figs["backlog"]
    diff = max(r.diff_micro_usd for f in figs.values() for r in f.runs)
    log(
        f"per replica: {live.median('rate'):,.0f} events/s live = "
        f"{live.median('rate') / GOAL:.2f} x the 5,000/s goal; {backlog.median('rate'):,.0f} "
        f"events/s catching up on a backlog = {backlog.median('rate') / GOAL:.2f} x "
        f"({backlog.median('outputs_per_input'):.2f} outputs per input, live "
        f"{live.median('outputs_per_input'):.2f})"
    )
    print(
        f"ledger_bench: events_per_s={live.median('rate'):.0f} replicas=1 "
        f"backlog_events_per_s={backlog.median('rate'):.0f} "
        f"outputs_per_input={live.median('outputs_per_input'):.2f} "
        f"backlog_outputs_per_input={backlog.median('outputs_per_input'):.2f} "
        f"bare_events_per_s={live.median('bare'):.0f} ratio={live.ratio:.2f} "
        f"runs={args.runs} backlog_bare_events_per_s={backlog.median('bare'):.0f} "
        f"backlog_ratio={backlog.ratio:.2f} diff_usd={diff / 1e6:.2f}"
    )
    return 0 if diff == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--runs", type=int, default=5, help="runs of each order (fresh server each)")
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument(
        "--chunk",
        type=int,
        default=64,
        help="events per chunk in the live order (64: about two ticks of a 30-node fleet)",
    )
    return asyncio.run(run(p.parse_args(argv)))
