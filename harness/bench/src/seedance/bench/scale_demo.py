"""Scaling proof on loopback: a 3-node NATS cluster, service replicas, a node and replicas killed.

Starts three nats-server processes (the pinned binary, random free ports, temp stores, full-mesh
routes) and provisions the catalogue's streams (R3: the Bus sees the cluster peers). Then, on
that cluster:

- **cost-ledger**: two replicas (``replica=a``/``b``, one shared ``state_key``), each reading the
  merged input stream ``SEEDANCE_LEDGER_IN`` through its own consumer ``ledger-in-<replica>``.
  A seeded fleet's placements, releases and samples (seedance.testing.workloads) are published at a
  steady pace; a quarter in, the nats-server leading ``SEEDANCE_LEDGER_IN`` is SIGKILLed; half
  way, replica ``a`` is SIGKILLed; at three quarters both come back (new R3 buckets the other
  services create need three peers). At the end the cost stream
  is read back and compared, as in ``make chaos-ledger``, with a reference replica stepped once
  through the same merged input (its output ids: ``lost`` = missing, ``duplicates`` = an id
  delivered twice) and with the core's offline ``recompute`` over exactly the events sent (the
  dollars must match to the micro-dollar).
- **graph-compiler**: two replicas; a handful of tiny BERT-style models are compiled through the
  SDK's ``compile_model``; after the first result one replica is SIGKILLed. A request the dead
  replica held is retried by the client under the same ``request_id`` (the compiler answers a
  request id once). Every request must get exactly one result on the stream.
- **router**: two gateways (one fleet) in front of two real Triton servers; requests go through
  both gateways, one gateway is SIGKILLed midway and its clients retry on the other. Answered
  must equal sent. Skipped (and said so) when the Triton venv (``make triton-env``) is missing.

Bounded: a few minutes. Loopback only; every process it starts is stopped on exit. Last line:

    scale: nats_nodes=3 replicas=<n> events=<n> lost=<n> duplicates=<n> failover_s=<n>

``events`` counts ledger input events + compile requests + inference requests; ``lost`` and
``duplicates`` add the three parts; ``failover_s`` is the longest publish of one ledger batch
(acks waited for, failures retried) while the NATS node was down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedance.bench.ledger_audit import audit_ledger
from seedance.bench.nats_cluster import (
    Cluster,
    Stalls,
    stream_leader,
    wait_cluster,
    wait_peers_current,
)
from seedance.core import Bus
from seedance.events import decode
from seedance.events.graph import CompileResult
from seedance.sdk import SeedanceClient
from seedance.testing.ports import listen_ports
from seedance.testing.processes import ServiceProcesses
from seedance.testing.workloads import read_stream, wait_checkpointed, workload

STATE_KEY = "scale"
LEDGER_SETTINGS = {
    "state_key": STATE_KEY,
    "checkpoint_every_s": "1",
    "checkpoint_every_events": "3000",
    "batch": "500",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def start_supervised(
    procs: ServiceProcesses,
    service: str,
    instance: str,
    up: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float = 90.0,
    settings: dict[str, str] | None = None,
) -> int:
    """Start a replica and wait until ``up()``; one that exits meanwhile (a JetStream API call
    timing out at start on a busy cluster) is started again, as Kubernetes would. Returns the
    number of such restarts (reported)."""
    key = f"{service}{instance}"
    restarts = 0
    procs.start(service, instance=instance, **(settings or {}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if procs.procs[key].poll() is not None:
            restarts += 1
            log(f"  {key} exited at start ({procs.procs[key].returncode}); starting it again")
            procs.start(service, instance=instance, **(settings or {}))
        else:
            with contextlib.suppress(Exception):
                if await up():
                    return restarts
        await asyncio.sleep(0.5)  # the replica is connecting and binding; bounded
    raise TimeoutError(f"{key} not up in {timeout_s} s")


async def has_consumer(bus: Bus, stream: str, name: str) -> bool:
    await bus.js.consumer_info(stream, name)
    return True


@dataclass
class Part:
    """One service's outcome."""

    name: str
    replicas: int
    events: int
    lost: int
    duplicates: int
    ok: bool
    note: str = ""


async def _supervise_ledgers(procs: ServiceProcesses, crashes: list[str]) -> None:
    """Like Kubernetes: a replica that exits by itself (not one the demo killed) comes back."""
    while True:
        await asyncio.sleep(0.5)  # poll the children; cancelled at the end of the part
        for r in ("a", "b"):
            proc = procs.procs.get(f"cost-ledger-{r}")
            if proc is not None and proc.poll() is not None:
                crashes.append(f"cost-ledger-{r}: exit {proc.returncode}")
                log(f"  cost-ledger-{r} exited by itself ({proc.returncode}); restarting it")
                procs.start("cost-ledger", instance=f"-{r}", replica=r, **LEDGER_SETTINGS)


@dataclass
class _Faults:
    """Where the ledger part injects its faults: at these event offsets of the publishing."""

    cluster: Cluster
    procs: ServiceProcesses
    stalls: Stalls
    kill_nats_at: int
    kill_replica_at: int
    restart_at: int
    leader: str = "n0"

    async def before(self, bus: Bus, i: int, chunk: int) -> None:
        """The faults due before publishing events ``i .. i + chunk``."""
        if i <= self.kill_nats_at < i + chunk:
            # Most inputs are sample batches: the telemetry stream's leader takes the writes.
            self.leader = await stream_leader(bus, "SEEDANCE_TELEMETRY") or "n0"
            self.stalls.kill_at = time.monotonic()
            self.cluster.kill(self.leader)
            log(f"  SIGKILL nats-server {self.leader} (SEEDANCE_TELEMETRY leader) at event {i}")
        if i <= self.kill_replica_at < i + chunk:
            self.procs.kill("cost-ledger-a")
            log(f"  SIGKILL cost-ledger-a at event {i}")
        if i <= self.restart_at < i + chunk:
            self.procs.start("cost-ledger", instance="-a", replica="a", **LEDGER_SETTINGS)
            # (not waited for: it must catch up from the shared checkpoint under load)
            self.cluster.start(int(self.leader[1:]))
            log(f"  restarted cost-ledger-a and nats-server {self.leader} at event {i}")

    def node_down(self, i: int) -> bool:
        return self.kill_nats_at <= i < self.restart_at


async def _publish_through_faults(
    bus: Bus, events: list[tuple[str, Any]], rate: float, faults: _Faults
) -> None:
    t0 = time.monotonic()
    chunk = 100
    for i in range(0, len(events), chunk):
        await faults.before(bus, i, chunk)
        batch = events[i : i + chunk]
        # A retried batch re-sends ids the stream already has: dropped as duplicates.
        sent_at = time.monotonic()
        await faults.stalls.retry(functools.partial(bus.publish_many, batch), f"events {i}..")
        if faults.node_down(i):
            # The failover shows as one slow batch (acks wait for the new leader) or as retries.
            faults.stalls.longest_after_kill_s = max(
                faults.stalls.longest_after_kill_s, time.monotonic() - sent_at
            )
        await asyncio.sleep(max(0.0, t0 + (i + chunk) / rate - time.monotonic()))
    log(f"ledger: published in {time.monotonic() - t0:.1f} s; waiting for the checkpoint")


async def ledger_part(
    args: argparse.Namespace, bus: Bus, cluster: Cluster, procs: ServiceProcesses, stalls: Stalls
) -> Part:
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    n = len(wl.events)
    start_restarts = 0
    for r in ("a", "b"):
        start_restarts += await start_supervised(
            procs, "cost-ledger", f"-{r}",
            functools.partial(has_consumer, bus, "SEEDANCE_LEDGER_IN", f"ledger-in-{r}"),
            settings={"replica": r, **LEDGER_SETTINGS},
        )  # fmt: skip
    crashes: list[str] = []
    supervisor = asyncio.create_task(_supervise_ledgers(procs, crashes))
    rate = n / args.duration_s
    log(f"ledger: {n} events ({len(wl.tenants)} tenants, {args.nodes} nodes) at ~{rate:.0f}/s")
    faults = _Faults(cluster, procs, stalls, n // 4, n // 2, (3 * n) // 4)
    await _publish_through_faults(bus, wl.events, rate, faults)
    await wait_checkpointed(bus, STATE_KEY, len(wl.events), timeout_s=args.settle_s)
    # New R3 streams (the services' KV buckets and object stores) need all three peers.
    await wait_peers_current(bus, "SEEDANCE_LEDGER_IN", timeout_s=args.settle_s)

    audit = await audit_ledger(bus, wl)
    await asyncio.sleep(1.0)  # one more supervisor round after the CPU-bound reference
    supervisor.cancel()
    alive = [k for k in ("cost-ledger-a", "cost-ledger-b") if procs.procs[k].poll() is None]
    note = (
        f"{audit.cost_events} cost events, {audit.published_micro_usd / 1e6:,.2f} USD on the "
        f"stream vs recompute {audit.recomputed_micro_usd / 1e6:,.2f} USD; unexpected ids "
        f"{audit.extra}; restarts at start {start_restarts}; crashed mid-run and restarted: "
        f"{'; '.join(crashes) or 'none'}; alive at the end: {', '.join(alive)}"
    )
    log(f"ledger: {note}")
    # Exactness is the check; a replica's own crash (see docs/deploy.md) is reported, not hidden.
    lost, duplicates = audit.lost, audit.duplicates
    ok = lost == 0 and duplicates == 0 and audit.extra == 0 and audit.diff_micro_usd == 0
    # A dollar mismatch is counted as a duplicate (or a loss): something was charged wrongly.
    if audit.diff_micro_usd and not (lost or duplicates):
        duplicates += 1
    return Part("cost-ledger", 2, n, lost, duplicates, ok, note)


async def _start_compilers(bus: Bus, procs: ServiceProcesses) -> int:
    """Two graph-compiler replicas bound to the shared durable; returns the restarts it took."""
    restarts = 0
    for i in range(2):
        restarts += await start_supervised(
            procs, "graph-compiler", f"-{i}",
            functools.partial(has_consumer, bus, "SEEDANCE_GRAPH", "compiler-requests"),
        )  # fmt: skip
    await asyncio.sleep(2)  # both bind the shared durable; a crash at start shows below
    for i in range(2):
        if procs.procs[f"graph-compiler-{i}"].poll() is not None:
            restarts += 1
            log(f"  graph-compiler-{i} exited at start; starting it again")
            procs.start("graph-compiler", instance=f"-{i}")
    return restarts


@dataclass
class _Compiles:
    """The compile requests of the graph-compiler part, each retried under its request id; the
    first result lets the killer take replica 0 down."""

    client: SeedanceClient
    timeout_s: float
    killed: asyncio.Event = field(default_factory=asyncio.Event)
    retries: int = 0

    async def one(self, i: int) -> CompileResult:
        from seedance.bench.models import build_bert

        model = build_bert(layers=1, hidden=16, heads=2, ffn=32, vocab=30 + i, seq=4)
        request_id = f"scale-{uuid.uuid4().hex[:12]}"
        for attempt in range(4):
            try:
                result = await self.client.compile_model(
                    "acme", f"tiny-{i}", model.SerializeToString(), request_id=request_id,
                    timeout_s=self.timeout_s,
                )  # fmt: skip
                self.killed.set()
                return result
            except Exception as exc:  # a dead replica held it, or the bus failed over
                self.retries += 1
                log(f"  compile {i} attempt {attempt + 1}: {exc!r:.120}; retry, same request id")
        raise RuntimeError(f"compile {i}: no result after 4 attempts")


async def _results_per_request(bus: Bus) -> Counter[str]:
    on_stream: Counter[str] = Counter()
    for msg in await read_stream(bus, "SEEDANCE_GRAPH"):
        ev = decode(msg.data)
        if isinstance(ev, CompileResult):
            on_stream[ev.request_id] += 1
    return on_stream


async def compile_part(args: argparse.Namespace, bus: Bus, procs: ServiceProcesses) -> Part:
    start_restarts = await _start_compilers(bus, procs)
    client = await SeedanceClient.connect(procs.nats_url)
    compiles = _Compiles(client, args.compile_timeout_s)

    async def killer() -> None:
        await compiles.killed.wait()
        procs.kill("graph-compiler-0")
        log("  SIGKILL graph-compiler-0 after the first result")

    try:
        kill_task = asyncio.create_task(killer())
        results = await asyncio.gather(
            *(compiles.one(i) for i in range(args.compiles)), return_exceptions=True
        )
        kill_task.cancel()
    finally:
        await client.close()
    answered = [r for r in results if isinstance(r, CompileResult)]
    ok_results = [r for r in answered if r.ok]
    for r in results:
        if isinstance(r, BaseException):
            log(f"  compile failed: {r}")
    on_stream = await _results_per_request(bus)
    lost = args.compiles - len(answered) + sum(1 for r in answered if on_stream[r.request_id] == 0)
    duplicates = sum(c - 1 for c in on_stream.values() if c > 1)
    note = (
        f"{len(ok_results)}/{args.compiles} compiled ok, {len(answered)} answered, "
        f"{compiles.retries} client retries, {start_restarts} restarts at start, "
        f"results on the stream per request: "
        f"{sorted(Counter(on_stream.values()).items())}"
    )
    log(f"graph-compiler: {note}")
    ok = lost == 0 and duplicates == 0 and len(ok_results) == args.compiles
    return Part("graph-compiler", 2, args.compiles, lost, duplicates, ok, note)


@dataclass
class _Gateways:
    """Inference requests through two gateways: each request alternates its first gateway and
    tries the other when that one fails (the clients of a killed gateway retry elsewhere)."""

    clients: dict[str, Any]
    answered: int = 0
    retried: int = 0

    async def one(self, i: int) -> bool:
        import numpy as np

        from seedance.testing.triton import echo_request

        inputs, x = echo_request(i, b"scale")
        for g in (str(i % 2), str(1 - i % 2)):
            try:
                res = await self.clients[g].infer("echo", inputs, client_timeout=10)
            except Exception:  # that gateway is gone: the client tries the other
                self.retried += 1
                continue
            if np.array_equal(res.as_numpy("y_fp32"), x):
                self.answered += 1
                return True
        return False

    async def close(self) -> None:
        for c in self.clients.values():
            with contextlib.suppress(Exception):
                await c.close()


async def _start_gateways(procs: ServiceProcesses, backends: str) -> tuple[_Gateways, int]:
    import tritonclient.grpc.aio as grpcclient

    # told, not port 0 and the gateway_started line: a router restarted at start (its log
    # appended to) must come back where its client dials (seedance.testing.ports)
    ports = dict(zip(("0", "1"), listen_ports(2), strict=True))
    gateways = _Gateways(
        {g: grpcclient.InferenceServerClient(f"127.0.0.1:{p}") for g, p in ports.items()}
    )

    async def ready(g: str) -> bool:
        return bool(await gateways.clients[g].is_model_ready("echo"))

    restarts = 0
    for g, port in ports.items():
        restarts += await start_supervised(
            procs, "router", f"-{g}", functools.partial(ready, g), timeout_s=120.0,
            settings={
                "listen_address": f"127.0.0.1:{port}", "rest_address": "", "replicas": backends,
                "models": "echo",
                "forecast_interval_s": "0.5", "forecast": "true" if g == "0" else "false",
            },
        )  # fmt: skip
    return gateways, restarts


async def router_part(args: argparse.Namespace, procs: ServiceProcesses) -> Part:
    from seedance.testing.triton import TritonProcess

    tritons = {n: TritonProcess(n, log_dir=procs.logdir) for n in ("triton-a", "triton-b")}
    for t in tritons.values():
        t.start()
    n = args.requests
    try:
        for t in tritons.values():
            await asyncio.to_thread(t.wait_ready, 180.0)
        backends = ",".join(f"{name}={t.address}" for name, t in tritons.items())
        gateways, start_restarts = await _start_gateways(procs, backends)
        log(f"router: 2 gateways up in front of {backends}")
        for start in range(0, n, 8):
            if start <= n // 2 < start + 8:
                procs.kill("router-1")
                log(f"  SIGKILL router-1 after {start} requests (its clients retry on router-0)")
            await asyncio.gather(*(gateways.one(i) for i in range(start, min(n, start + 8))))
        await gateways.close()
    finally:
        for t in tritons.values():
            t.stop()
    note = (
        f"{gateways.answered}/{n} requests answered, {gateways.retried} retried on the other "
        f"gateway, {start_restarts} restarts at start"
    )
    log(f"router: {note}")
    return Part("router", 2, n, n - gateways.answered, 0, gateways.answered == n, note)


def triton_available() -> bool:
    from seedance.testing.triton import TRITON_PYTHON

    return TRITON_PYTHON.exists()


async def _parts(args: argparse.Namespace, cluster: Cluster, procs: ServiceProcesses,
                 bus: Bus, stalls: Stalls) -> list[Part]:  # fmt: skip
    """The ledger's part, then the graph-compiler's and the router's unless skipped."""
    parts = [await ledger_part(args, bus, cluster, procs, stalls)]
    if args.compiles:
        parts.append(await compile_part(args, bus, procs))
    else:
        log("graph-compiler: skipped (--compiles 0)")
    if not args.requests:
        log("router: skipped (--requests 0)")
    elif not triton_available():
        log("router: skipped: no Triton venv (run `make triton-env`)")
    else:
        parts.append(await router_part(args, procs))
    return parts


async def _r3_bus(cluster: Cluster) -> Bus:
    """A bus on the cluster whose streams are provisioned with three replicas."""
    bus = await wait_cluster(cluster.urls)
    info = await bus.js.stream_info("SEEDANCE_LEDGER_IN")
    if info.config.num_replicas != 3:
        await bus.close()
        raise RuntimeError(f"streams are R{info.config.num_replicas}, not R3")
    leader = await stream_leader(bus, "SEEDANCE_LEDGER_IN")
    log(f"streams are R3; SEEDANCE_LEDGER_IN leader {leader}")
    return bus


def _report(parts: list[Part], stalls: Stalls) -> int:
    for p in parts:
        log(
            f"{p.name}: replicas={p.replicas} events={p.events} lost={p.lost} "
            f"duplicates={p.duplicates} {'OK' if p.ok else 'FAILED'} ({p.note})"
        )
    log("ran: " + ", ".join(p.name for p in parts))
    print(
        f"scale: nats_nodes=3 replicas={sum(p.replicas for p in parts)} "
        f"events={sum(p.events for p in parts)} lost={sum(p.lost for p in parts)} "
        f"duplicates={sum(p.duplicates for p in parts)} "
        f"failover_s={stalls.longest_after_kill_s:.1f}"
    )
    return 0 if parts and all(p.ok for p in parts) else 1


async def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="seedance-scale-"))
    # fixed for the run: the routes name each other and a restarted node comes back on its port
    ports = listen_ports(6)
    cluster = Cluster(root, ports[:3], ports[3:])
    procs = ServiceProcesses(cluster.urls, root / "services")
    stalls = Stalls()
    try:
        for i in range(3):
            cluster.start(i)
        log(f"nats cluster on {cluster.urls}; store {root}")
        bus = await _r3_bus(cluster)
        try:
            parts = await _parts(args, cluster, procs, bus, stalls)
        finally:
            bad = {k: v for k, v in procs.stop_all().items() if v != 0}
            if bad:
                log(f"exit codes on SIGTERM: {bad}")
            with contextlib.suppress(Exception):
                await bus.close()
    finally:
        cluster.stop()
        if args.keep:
            log(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return _report(parts, stalls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=3000, help="ledger input events (about)")
    ap.add_argument("--nodes", type=int, default=10, help="GPU nodes in the ledger workload")
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--duration-s", type=float, default=30.0, help="spread the ledger load")
    ap.add_argument("--settle-s", type=float, default=90.0, help="max wait for the ledger")
    ap.add_argument("--compiles", type=int, default=6, help="compile requests (0: skip)")
    ap.add_argument("--compile-timeout-s", type=float, default=45.0, help="client retry after")
    ap.add_argument("--requests", type=int, default=200, help="inference requests (0: skip)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir with the logs")
    args = ap.parse_args()
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
