"""`make bench-ledger`: one cost-ledger replica's events/s through the bus.

A seeded fleet's events (tools/ledger_workload.py: sample batches, inventory, placements, job
ends) are published first, so the merged input stream holds them all. Then one replica (the
real ``LedgerService``, in this process, on a local nats-server) consumes them: fetch, decode,
step the core, publish every cost entry / report and wait for the stream's acks, checkpoint to
KV. Timed from the replica's first fetch (after its start: connection, checkpoint restore,
consumer bound) to the moment it has stepped through the last input and its outputs are acked. Each pass is a fresh replica (its own
checkpoint key) re-reading the same stream; its outputs are then duplicates of the first pass's
to the stream, which still costs a publish and an ack each.

The anchor, measured in the same run on the same events: the pure step function (decode +
core, no bus) of ``LedgerReplica``: the ceiling of a replica.

Last line: ``ledger_bench: events_per_s=<n> replicas=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, PullReader, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.replica import INPUT_TYPES, LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.events import decode, encode
from seedance.events.subjects import replica_consumer
from tools.ledger_workload import workload
from tools.stack import NatsServer

GOAL = 5_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pure_rate(events: list[bytes]) -> float:
    replica = LedgerReplica(core.default_price_book(), core.LedgerConfig(retention_windows=288))
    t0 = time.perf_counter()
    for seq, data in enumerate(events, 1):
        replica.step(seq, decode(data, INPUT_TYPES))
    return len(events) / (time.perf_counter() - t0)


async def read_cost_us(bus: Bus, last_seq: int, batch: int) -> float:
    """Wall µs per input of reading the merged stream alone, as a replica does (no step)."""
    spec = replica_consumer("ledger-in", "bench-read", start_seq=1)
    await bus.ensure_consumer(spec)
    reader = PullReader(bus.nc, spec.stream, spec.durable, batch=batch)
    await reader.start()
    seq, t0 = 0, time.perf_counter()
    try:
        async with asyncio.timeout(120):
            while seq < last_seq:
                for msg in await reader.next_batch(timeout_s=1.0):
                    seq = msg.metadata.sequence.stream
    finally:
        await reader.close()
        await bus.js.delete_consumer(spec.stream, spec.durable)
    return (time.perf_counter() - t0) * 1e6 / last_seq


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


async def run(args: argparse.Namespace) -> int:
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    n = len(wl.events)
    payloads = [encode(e) for _, e in wl.events]
    anchor = statistics.median(pure_rate(payloads) for _ in range(2))
    log(f"workload: {n} events; pure step (decode + core, no bus): {anchor:,.0f} events/s")
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url))
        await bus.ensure_streams()
        for i in range(0, n, 500):
            await bus.publish_many(wl.events[i : i + 500])
        async with asyncio.timeout(60):
            while (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.messages < n:
                await asyncio.sleep(0.05)  # the server sources them in; bounded above
        last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
        read_us = await read_cost_us(bus, last, args.batch)
        log(f"bus alone: reading an input costs {read_us:.0f} µs (PullReader, metadata)")
        await bus.close()
        rates = []
        for i in range(args.passes):
            rate = await one_pass(server.url, last, i, args.batch)
            rates.append(rate)
            log(f"pass {i}: {rate:,.0f} events/s (consume, step, publish + acks, checkpoint)")
    finally:
        server.stop()
    median = statistics.median(rates)
    log(
        f"median {median:,.0f} events/s per replica = {median / anchor:.2f} x the pure step "
        f"({anchor:,.0f}/s), {median / GOAL:.2f} x the 5,000/s goal"
    )
    # Where a pass's time goes: per input, the step, the reading, and the rest (publishing
    # the outputs and settling their acks, checkpoints).
    step_us, pass_us = 1e6 / anchor, 1e6 / median
    log(
        f"per input: {pass_us:.0f} µs = step {step_us:.0f} + reading {read_us:.0f} "
        f"+ publishing, acks and checkpoints {pass_us - step_us - read_us:.0f}"
    )
    print(f"ledger_bench: events_per_s={median:.0f} replicas=1")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--seed", type=int, default=5)
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
