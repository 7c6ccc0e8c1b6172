"""Benchmark: the collector's own CPU time per GPU sample.

Replays the Alibaba fleet (default 1,213 nodes / 6,212 GPUs) as a simulated fleet at ``--hz``
for ``--ticks`` ticks in one process, with placements from a pod list churning every tick, and
measures process CPU time (``time.process_time``) per GPU sample, including building the
``NodeSample`` structs, mapping each to the bus's ``GpuSampleBatch`` and encoding it as the
service publishes it (``seedance.events.encode``, JSON). With ``--nats-url`` it also publishes
every tick through ``Bus.publish_many`` as the service does and reports that CPU separately
(the client's share; the server's CPU is not counted). Where a
GPU and NVML are present it also measures the NVML backend's fast path (and the slow path) per
GPU sample. Ticks run back to back on simulated time: the figure is CPU per sample, which is
what bounds how many GPUs one core can watch at a given rate.

Last line: ``telemetry: gpus=<n> hz=<n> cpu_us_per_gpu_sample=<n> events_per_s=<n>`` where
``events_per_s`` is how many node events per second of CPU the replay can build and encode.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from seedance.events import decode, encode
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuSampleBatch
from seedance.telemetry_collector.fleet import FleetSim, load_node_list
from seedance.telemetry_collector.mapping import sample_batch_event
from seedance.telemetry_collector.sample import NodeSample
from seedance.traces import alibaba

GOAL_US = 50.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_pods(path: Path | None, limit: int) -> list[tuple[int, int]]:
    """(num_gpu, gpu_milli) of GPU pods in the list; a fixed synthetic mix if no list."""
    if path is None or not path.exists():
        rng = random.Random(7)
        return [(1, rng.choice([230, 320, 470, 650, 810, 1000])) for _ in range(limit)]
    pods = [(r.num_gpu, r.gpu_milli) for r in alibaba.read_pods(path)]
    return [(n, milli) for n, milli in pods if n > 0 and milli > 0][:limit]


def fill(sim: FleetSim, pods: list[tuple[int, int]], seed: int, prefix: str) -> list[str]:
    """First-fit pods onto the fleet (setup, untimed); returns the placement ids."""
    rng = random.Random(seed)
    order = list(range(len(sim.nodes)))
    rng.shuffle(order)
    ids = []
    for k, (num_gpu, milli) in enumerate(pods):
        # Memory in proportion to the share, 80 % of a 16 GB board for a whole GPU.
        mem = 0.8 * milli / 1000.0 * 15000
        for ni in order[: 200 + k % 1000]:
            node = sim.nodes[ni]
            free = sim.free_milli(node.name)
            mem_free = sim.free_mem_mib(node.name)
            slots = [g for g, f in enumerate(free) if f >= milli and mem_free[g] >= mem]
            if len(slots) >= num_gpu:
                pid = f"{prefix}-{k}"
                sim.apply_placement(pid, node.name, slots[:num_gpu], milli, mem_mib_per_gpu=mem)
                ids.append(pid)
                break
    return ids


def bench_fleet(args: argparse.Namespace) -> tuple[int, float, float]:
    nodes = load_node_list(args.nodes)
    sim = FleetSim(nodes)
    pods = load_pods(args.pods, args.max_pods)
    ids = fill(sim, pods, seed=1, prefix="pod")
    log(f"fleet: {len(nodes)} nodes, {sim.gpu_count} GPUs, {len(ids)} placements applied")
    per_gpu_us: list[float] = []
    events_per_cpu_s: list[float] = []
    rng = random.Random(3)
    t = 1_700_000_000.0
    nbytes = 0
    for tick in range(args.ticks):
        # Churn outside the timed part: the slicer's placements arrive between ticks.
        gone = set(rng.sample(ids, min(args.churn, len(ids))))
        for pid in gone:
            sim.release(pid)
        ids = [i for i in ids if i not in gone]
        ids += fill(sim, pods[: args.churn], seed=tick + 100, prefix=f"t{tick}")
        t += 1.0 / args.hz
        c0 = time.process_time()
        samples = sim.sample(t)
        at = datetime.fromtimestamp(t, UTC)
        events = [sample_batch_event(s, at) for s in samples]
        payloads = [encode(e) for e in events]
        cpu = time.process_time() - c0
        nbytes = sum(len(p) for p in payloads)
        per_gpu_us.append(cpu * 1e6 / sim.gpu_count)
        events_per_cpu_s.append(len(samples) / cpu if cpu > 0 else float("inf"))
        if tick % 10 == 0:
            log(f"  tick {tick}: {per_gpu_us[-1]:.2f} µs CPU per GPU sample, {nbytes} bytes")
    assert all(s.simulated for s in samples)
    decoded = decode(payloads[0], GpuSampleBatch)
    assert decoded.node == samples[0].node
    assert decoded.simulated
    assert len(decoded.gpus) == len(samples[0].gpus)
    med = statistics.median(per_gpu_us)
    log(
        f"fleet replay: median {med:.2f} µs CPU per GPU sample (p90 "
        f"{statistics.quantiles(per_gpu_us, n=10)[-1]:.2f}), {nbytes / len(samples):.0f} "
        f"bytes per node event; goal {GOAL_US:.0f} µs → ratio {med / GOAL_US:.3f} of the goal"
    )
    return sim.gpu_count, med, statistics.median(events_per_cpu_s)


def bench_nvml(iterations: int) -> None:
    try:
        from seedance.telemetry_collector.nvml import NvmlBackend

        backend = NvmlBackend(socket.gethostname())
        inv = backend.inventory()
    except Exception as exc:  # no driver / no GPU here: say so and go on with the replay
        log(f"nvml: not measured ({type(exc).__name__}: {exc})")
        return
    n = len(inv.gpus)
    encoder = msgspec.msgpack.Encoder()
    fast, slow = [], []
    for i in range(iterations):
        c0 = time.process_time()
        gpus = backend.sample_fast(time.monotonic())  # paced as the Poller paces it
        encoder.encode(NodeSample(node=inv.node, sampled_at_unix_s=time.time(), gpus=gpus))
        fast.append((time.process_time() - c0) * 1e6 / n)
        if i % 10 == 0:
            c0 = time.process_time()
            backend.sample_slow(time.monotonic())
            slow.append((time.process_time() - c0) * 1e6 / n)
    backend.close()
    f_med, s_med = statistics.median(fast), statistics.median(slow)
    log(
        f"nvml: {n} GPU(s) {inv.gpus[0].model}: fast path median {f_med:.1f} µs CPU per GPU "
        f"sample (p90 {statistics.quantiles(fast, n=10)[-1]:.1f}); slow path median "
        f"{s_med:.1f} µs CPU per GPU; goal {GOAL_US:.0f} µs → ratio {f_med / GOAL_US:.3f}; "
        f"8 GPUs at 10 Hz: {f_med * 8 * 10 / 1e4:.3f} % of a core (fast path)"
    )
    print(f"nvml: gpus={n} cpu_us_per_gpu_sample_fast={f_med:.1f} cpu_us_per_gpu_slow={s_med:.1f}")


async def bench_publish(args: argparse.Namespace) -> None:
    """Publish the fleet's ticks through the bus as the service does; client CPU per GPU."""
    from seedance.core import Bus, BusSettings

    sim = FleetSim(load_node_list(args.nodes))
    bus = await Bus.connect(BusSettings(url=args.nats_url, name="bench-telemetry"))
    await bus.ensure_streams()
    subjects = {n.name: telemetry.sample(n.name) for n in sim.nodes}
    cpu_us: list[float] = []
    wall_s: list[float] = []
    t = 1_700_000_000.0
    try:
        for tick in range(args.publish_ticks):
            t += 1.0 / args.hz
            c0, w0 = time.process_time(), time.perf_counter()
            at = datetime.fromtimestamp(t, UTC)
            items = [(subjects[s.node], sample_batch_event(s, at)) for s in sim.sample(t)]
            await bus.publish_many(items)
            cpu_us.append((time.process_time() - c0) * 1e6 / sim.gpu_count)
            wall_s.append(time.perf_counter() - w0)
            log(f"  publish tick {tick}: {cpu_us[-1]:.1f} µs CPU per GPU, {wall_s[-1]:.2f} s wall")
    finally:
        await bus.close()
    log(
        f"publish: {len(sim.nodes)} node events per tick; median {statistics.median(cpu_us):.1f} "
        f"µs client CPU per GPU sample incl. publish_many, median tick wall "
        f"{statistics.median(wall_s):.2f} s; goal {GOAL_US:.0f} µs → ratio "
        f"{statistics.median(cpu_us) / GOAL_US:.2f}"
    )
    print(
        f"publish: gpus={sim.gpu_count} cpu_us_per_gpu_sample="
        f"{statistics.median(cpu_us):.1f} tick_wall_s={statistics.median(wall_s):.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=Path, required=True, help="openb_node_list_gpu_node.csv")
    p.add_argument("--pods", type=Path, default=None, help="openb_pod_list_*.csv (optional)")
    p.add_argument("--hz", type=float, default=1.0)
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--churn", type=int, default=20, help="placements released/added per tick")
    p.add_argument("--max-pods", type=int, default=8000)
    p.add_argument("--nvml-iterations", type=int, default=300)
    p.add_argument("--no-nvml", action="store_true")
    p.add_argument("--nats-url", default=None, help="also publish each tick to this server")
    p.add_argument("--publish-ticks", type=int, default=10)
    args = p.parse_args()
    if not args.no_nvml:
        bench_nvml(args.nvml_iterations)
    if args.nats_url:
        asyncio.run(bench_publish(args))
    gpus, us, eps = bench_fleet(args)
    print(
        f"telemetry: gpus={gpus} hz={args.hz:g} cpu_us_per_gpu_sample={us:.2f} "
        f"events_per_s={eps:.0f}"
    )
