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
import shutil
import signal
import socket
import subprocess
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
from seedance.core import Bus, BusSettings
from seedance.events import decode
from seedance.events.graph import CompileResult
from seedance.sdk import SeedanceClient
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import nats_server_binary
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


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    root: Path
    client_ports: list[int]
    route_ports: list[int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def urls(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def start(self, i: int) -> None:
        name = f"n{i}"
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.route_ports)
        args = [
            nats_server_binary(),
            "-a", "127.0.0.1",
            "-p", str(self.client_ports[i]),
            "-n", name,
            "-js",
            "-sd", str(self.root / name),
            "--cluster_name", "seedance-demo",
            "--cluster", f"nats://127.0.0.1:{self.route_ports[i]}",
            "--routes", routes,
        ]  # fmt: skip
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@dataclass
class Stalls:
    """Retries an operation while the cluster fails over; the longest stall after the kill."""

    kill_at: float | None = None
    longest_after_kill_s: float = 0.0
    failures: int = 0

    async def retry(
        self, op: Callable[[], Awaitable[Any]], what: str, limit_s: float = 60.0
    ) -> Any:
        first_fail: float | None = None
        end = time.monotonic() + limit_s
        while True:
            try:
                result = await op()
                break
            except Exception as exc:  # the cluster is failing over: retry, bounded
                self.failures += 1
                if first_fail is None:
                    first_fail = time.monotonic()
                if time.monotonic() > end:
                    raise RuntimeError(f"{what}: still failing after {limit_s} s") from exc
                await asyncio.sleep(0.1)  # back off between attempts; bounded by limit_s
        if first_fail is not None and self.kill_at is not None and first_fail >= self.kill_at - 1:
            self.longest_after_kill_s = max(
                self.longest_after_kill_s, time.monotonic() - first_fail
            )
        return result


async def wait_cluster(urls: str, timeout_s: float = 60.0) -> Bus:
    deadline = time.monotonic() + timeout_s
    while True:
        bus: Bus | None = None
        try:
            bus = await Bus.connect(BusSettings(url=urls, name="scale-demo"))
            # discovered peers decide R3; wait until both others are known
            for _ in range(100):
                if len(bus.nc.discovered_servers) >= 2:
                    break
                await asyncio.sleep(0.1)  # the INFO with the peers comes after the connect
            await bus.ensure_streams()
            return bus
        except Exception as exc:  # meta leader not elected yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ready in {timeout_s} s: {exc}") from exc
            if bus is not None:
                with contextlib.suppress(Exception):
                    await bus.close()
            await asyncio.sleep(0.5)  # retry the provisioning; bounded by the deadline


async def wait_peers_current(bus: Bus, stream: str, timeout_s: float) -> None:
    """Until the restarted node has caught up: both followers of ``stream`` are current."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            info = await bus.js.stream_info(stream)
            if sum(1 for r in info.cluster.replicas or [] if r.current and not r.offline) == 2:
                return
        await asyncio.sleep(0.5)  # the node is replaying its peers' logs; bounded
    raise TimeoutError(f"{stream}: the restarted nats-server not current in {timeout_s} s")


async def start_supervised(
    procs: ServiceProcesses,
    service: str,
    instance: str,
    up: Callable[[], Awaitable[bool]],
    timeout_s: float = 90.0,
    **settings: str,
) -> int:
    """Start a replica and wait until ``up()``; one that exits meanwhile (a JetStream API call
    timing out at start on a busy cluster) is started again, as Kubernetes would. Returns the
    number of such restarts (reported)."""
    key = f"{service}{instance}"
    restarts = 0
    procs.start(service, instance=instance, **settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if procs.procs[key].poll() is not None:
            restarts += 1
            log(f"  {key} exited at start ({procs.procs[key].returncode}); starting it again")
            procs.start(service, instance=instance, **settings)
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


async def ledger_part(
    args: argparse.Namespace, bus: Bus, cluster: Cluster, procs: ServiceProcesses, stalls: Stalls
) -> Part:
    wl = workload(args.events, nodes=args.nodes, seed=args.seed)
    n = len(wl.events)
    start_restarts = 0
    for r in ("a", "b"):
        start_restarts += await start_supervised(
            procs, "cost-ledger", f"-{r}",
            lambda r=r: has_consumer(bus, "SEEDANCE_LEDGER_IN", f"ledger-in-{r}"),
            replica=r, **LEDGER_SETTINGS,
        )  # fmt: skip
    crashes: list[str] = []

    async def supervise() -> None:
        # Like Kubernetes: a replica that exits by itself (not one the demo killed) comes back.
        while True:
            await asyncio.sleep(0.5)  # poll the children; cancelled at the end of the part
            for r in ("a", "b"):
                proc = procs.procs.get(f"cost-ledger-{r}")
                if proc is not None and proc.poll() is not None:
                    crashes.append(f"cost-ledger-{r}: exit {proc.returncode}")
                    log(f"  cost-ledger-{r} exited by itself ({proc.returncode}); restarting it")
                    procs.start("cost-ledger", instance=f"-{r}", replica=r, **LEDGER_SETTINGS)

    supervisor = asyncio.create_task(supervise())
    rate = n / args.duration_s
    log(f"ledger: {n} events ({len(wl.tenants)} tenants, {args.nodes} nodes) at ~{rate:.0f}/s")
    kill_nats_at, kill_replica_at, restart_at = n // 4, n // 2, (3 * n) // 4
    t0 = time.monotonic()
    chunk = 100
    leader = "n0"
    for i in range(0, n, chunk):
        if i <= kill_nats_at < i + chunk:
            # Most inputs are sample batches: the telemetry stream's leader takes the writes.
            leader = (await bus.js.stream_info("SEEDANCE_TELEMETRY")).cluster.leader or "n0"
            stalls.kill_at = time.monotonic()
            cluster.kill(leader)
            log(f"  SIGKILL nats-server {leader} (SEEDANCE_TELEMETRY leader) at event {i}")
        if i <= kill_replica_at < i + chunk:
            procs.kill("cost-ledger-a")
            log(f"  SIGKILL cost-ledger-a at event {i}")
        if i <= restart_at < i + chunk:
            procs.start("cost-ledger", instance="-a", replica="a", **LEDGER_SETTINGS)
            # (not waited for: it must catch up from the shared checkpoint under load)
            cluster.start(int(leader[1:]))
            log(f"  restarted cost-ledger-a and nats-server {leader} at event {i}")
        batch = wl.events[i : i + chunk]
        # A retried batch re-sends ids the stream already has: dropped as duplicates.
        sent_at = time.monotonic()
        await stalls.retry(lambda b=batch: bus.publish_many(b), f"events {i}..")
        if kill_nats_at <= i < restart_at:
            # The failover shows as one slow batch (acks wait for the new leader) or as retries.
            stalls.longest_after_kill_s = max(
                stalls.longest_after_kill_s, time.monotonic() - sent_at
            )
        await asyncio.sleep(max(0.0, t0 + (i + chunk) / rate - time.monotonic()))
    log(f"ledger: published in {time.monotonic() - t0:.1f} s; waiting for the checkpoint")
    await wait_checkpointed(bus, STATE_KEY, len(wl.events), timeout_s=args.settle_s)
    # New R3 streams (the services' KV buckets and object stores) need all three peers.
    await wait_peers_current(bus, "SEEDANCE_LEDGER_IN", timeout_s=args.settle_s)

    audit = await audit_ledger(bus, wl)
    duplicates, lost, extra = audit.duplicates, audit.lost, audit.extra
    seen_count, published_micro_usd = audit.cost_events, audit.published_micro_usd
    diff_micro_usd = audit.diff_micro_usd
    await asyncio.sleep(1.0)  # one more supervisor round after the CPU-bound reference
    supervisor.cancel()
    alive = [k for k in ("cost-ledger-a", "cost-ledger-b") if procs.procs[k].poll() is None]
    note = (
        f"{seen_count} cost events, {published_micro_usd / 1e6:,.2f} USD on the stream vs "
        f"recompute {audit.recomputed_micro_usd / 1e6:,.2f} USD; unexpected ids {extra}; "
        f"restarts at start {start_restarts}; crashed mid-run and restarted: "
        f"{'; '.join(crashes) or 'none'}; alive at the end: {', '.join(alive)}"
    )
    log(f"ledger: {note}")
    # Exactness is the check; a replica's own crash (see docs/deploy.md) is reported, not hidden.
    ok = lost == 0 and duplicates == 0 and extra == 0 and diff_micro_usd == 0
    # A dollar mismatch is counted as a duplicate (or a loss): something was charged wrongly.
    if diff_micro_usd and not (lost or duplicates):
        duplicates += 1
    return Part("cost-ledger", 2, n, lost, duplicates, ok, note)


async def compile_part(args: argparse.Namespace, bus: Bus, procs: ServiceProcesses) -> Part:
    from seedance.bench.models import build_bert

    start_restarts = 0
    for i in range(2):
        start_restarts += await start_supervised(
            procs, "graph-compiler", f"-{i}",
            lambda: has_consumer(bus, "SEEDANCE_GRAPH", "compiler-requests"),
        )  # fmt: skip
    await asyncio.sleep(2)  # both bind the shared durable; a crash at start shows below
    for i in range(2):
        if procs.procs[f"graph-compiler-{i}"].poll() is not None:
            start_restarts += 1
            log(f"  graph-compiler-{i} exited at start; starting it again")
            procs.start("graph-compiler", instance=f"-{i}")
    client = await SeedanceClient.connect(procs.nats_url)
    tenant = "acme"
    killed = asyncio.Event()
    retries = 0

    async def one(i: int) -> CompileResult:
        nonlocal retries
        model = build_bert(layers=1, hidden=16, heads=2, ffn=32, vocab=30 + i, seq=4)
        request_id = f"scale-{uuid.uuid4().hex[:12]}"
        for attempt in range(4):
            try:
                result = await client.compile_model(
                    tenant, f"tiny-{i}", model.SerializeToString(), request_id=request_id,
                    timeout_s=args.compile_timeout_s,
                )  # fmt: skip
                if not killed.is_set():
                    killed.set()
                return result
            except Exception as exc:  # a dead replica held it, or the bus failed over
                retries += 1
                log(f"  compile {i} attempt {attempt + 1}: {exc!r:.120}; retry, same request id")
        raise RuntimeError(f"compile {i}: no result after 4 attempts")

    async def killer() -> None:
        await killed.wait()
        procs.kill("graph-compiler-0")
        log("  SIGKILL graph-compiler-0 after the first result")

    ids: list[str] = []
    try:
        kill_task = asyncio.create_task(killer())
        results = await asyncio.gather(
            *(one(i) for i in range(args.compiles)), return_exceptions=True
        )
        kill_task.cancel()
    finally:
        await client.close()
    answered = [r for r in results if isinstance(r, CompileResult)]
    ok_results = [r for r in answered if r.ok]
    for r in results:
        if isinstance(r, BaseException):
            log(f"  compile failed: {r}")
    ids = [r.request_id for r in answered]
    on_stream: Counter[str] = Counter()
    for msg in await read_stream(bus, "SEEDANCE_GRAPH"):
        ev = decode(msg.data)
        if isinstance(ev, CompileResult):
            on_stream[ev.request_id] += 1
    lost = args.compiles - len(answered) + sum(1 for i in ids if on_stream[i] == 0)
    duplicates = sum(c - 1 for c in on_stream.values() if c > 1)
    note = (
        f"{len(ok_results)}/{args.compiles} compiled ok, {len(answered)} answered, "
        f"{retries} client retries, {start_restarts} restarts at start, "
        f"results on the stream per request: "
        f"{sorted(Counter(on_stream.values()).items())}"
    )
    log(f"graph-compiler: {note}")
    ok = lost == 0 and duplicates == 0 and len(ok_results) == args.compiles
    return Part("graph-compiler", 2, args.compiles, lost, duplicates, ok, note)


async def router_part(args: argparse.Namespace, procs: ServiceProcesses) -> Part:
    import numpy as np
    import tritonclient.grpc.aio as grpcclient

    from seedance.testing.triton import TritonProcess, echo_request, free_port

    tritons = {n: TritonProcess(n, log_dir=procs.logdir) for n in ("triton-a", "triton-b")}
    for t in tritons.values():
        t.start()
    try:
        for t in tritons.values():
            await asyncio.to_thread(t.wait_ready, 180.0)
        ports = {g: free_port() for g in ("0", "1")}
        backends = ",".join(f"{n}={t.address}" for n, t in tritons.items())
        clients = {g: grpcclient.InferenceServerClient(f"127.0.0.1:{p}") for g, p in ports.items()}

        async def ready(g: str) -> bool:
            return bool(await clients[g].is_model_ready("echo"))

        start_restarts = 0
        for g, port in ports.items():
            start_restarts += await start_supervised(
                procs, "router", f"-{g}", lambda g=g: ready(g), timeout_s=120.0,
                listen_address=f"127.0.0.1:{port}", replicas=backends, models="echo",
                forecast_interval_s="0.5", forecast="true" if g == "0" else "false",
            )  # fmt: skip
        log(f"router: 2 gateways up in front of {backends}")
        answered = retried = 0
        dead: set[str] = set()

        async def one(i: int) -> bool:
            nonlocal answered, retried
            inputs, x = echo_request(i, b"scale")
            order = [str(i % 2), str(1 - i % 2)]  # alternate gateways; the other one on failure
            for g in order:
                if g in dead:
                    continue
                try:
                    res = await clients[g].infer("echo", inputs, client_timeout=10)
                    if np.array_equal(res.as_numpy("y_fp32"), x):
                        answered += 1
                        return True
                except Exception:  # that gateway is gone: the client tries the other
                    retried += 1
            return False

        n = args.requests
        for start in range(0, n, 8):
            if start <= n // 2 < start + 8:
                procs.kill("router-1")
                log(f"  SIGKILL router-1 after {start} requests (its clients retry on router-0)")
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + 8))))
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.close()
    finally:
        for t in tritons.values():
            t.stop()
    note = (
        f"{answered}/{n} requests answered, {retried} retried on the other gateway, "
        f"{start_restarts} restarts at start"
    )
    log(f"router: {note}")
    return Part("router", 2, n, n - answered, 0, answered == n, note)


def triton_available() -> bool:
    from seedance.testing.triton import TRITON_PYTHON

    return TRITON_PYTHON.exists()


async def run(args: argparse.Namespace) -> int:
    root = Path(tempfile.mkdtemp(prefix="seedance-scale-"))
    ports = free_ports(6)
    cluster = Cluster(root, ports[:3], ports[3:])
    procs: ServiceProcesses | None = None
    bus: Bus | None = None
    parts: list[Part] = []
    stalls = Stalls()
    try:
        for i in range(3):
            cluster.start(i)
        log(f"nats cluster on {cluster.urls}; store {root}")
        bus = await wait_cluster(cluster.urls)
        info = await bus.js.stream_info("SEEDANCE_LEDGER_IN")
        if info.config.num_replicas != 3:
            raise RuntimeError(f"streams are R{info.config.num_replicas}, not R3")
        log(f"streams are R3; SEEDANCE_LEDGER_IN leader {info.cluster.leader}")
        procs = ServiceProcesses(cluster.urls, root / "services")
        parts.append(await ledger_part(args, bus, cluster, procs, stalls))
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
    finally:
        if procs is not None:
            codes = procs.stop_all()
            bad = {k: v for k, v in codes.items() if v != 0}
            if bad:
                log(f"exit codes on SIGTERM: {bad}")
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.close()
        cluster.stop()
        if args.keep:
            log(f"logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
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
