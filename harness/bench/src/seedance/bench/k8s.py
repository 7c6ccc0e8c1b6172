"""``make bench-k8s``: the Alibaba trace's pods as Pod objects through the Kubernetes path
(test API server -> k8s-bridge -> slicer -> Bindings), against the bus path's replay of the
same pods in the same order on the same fleet slice.

What it measures, in one run on one machine:

- **bus path** (the anchor): a fresh nats-server and slicer process; the bridge's own pure
  core (`seedance.k8s_bridge.core.tracker.Tracker`) turns each Pod manifest into the job event
  the bridge would publish, and the bench publishes it at the fixed arrival rate; it records
  each decision and the latency job event -> decision (``bus_p99_ms``).
- **Kubernetes path**: another fresh nats-server and slicer, the test API server
  (`seedance.testing.kube_api`, a process) and the bridge (a process). The bench creates the
  Node objects, then the Pods over HTTP at the same rate, and watches them: a pod is *bound*
  when the watch shows its ``spec.nodeName``, *reported* when it shows ``PodScheduled=False``.
  ``bind_ms`` is the time from the pod's create request returning to the watch event that
  shows it bound (both on the bench's clock; the Binding is posted a little before, so this
  over-states the bridge's own latency by one watch delivery).

``same_placement_pct``: of the pods the bus path placed, the share the Kubernetes path bound
to the same node with the same GPU indices. ``alloc_pct``: the GPU share (whole GPUs plus
thousandths of shared ones) of the slice that the bound pods hold at the end, over its GPUs.

The fleet slice is the GPU node list in file order, cut where its GPUs reach the pods' demand
divided by ``--oversubscribe`` (default 1.05: the pods ask 5 % more than the slice has, so it
fills up and the rest must be reported unschedulable). Pods never end in this bench.

Last line: ``k8s: pods=<n> bound=<n> unschedulable_reported=<n> bind_p50_ms=<n>
bind_p99_ms=<n> alloc_pct=<n> bus_path_alloc_pct=<n> same_placement_pct=<n> bus_p99_ms=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from seedance.bench.kube_cluster import (
    Kube,
    gpu_node_object,
    kube_api,
    namespace_object,
    start_bridge,
)
from seedance.core import Bus
from seedance.events import decode
from seedance.events.jobs import JobSubmitted
from seedance.events.slicing import JobRejected, Placement, Unschedulable
from seedance.events.subjects import slicing
from seedance.k8s_bridge.core.kube import k8s_time
from seedance.k8s_bridge.core.tracker import Publish, Tracker
from seedance.testing.identities import ADMIN, as_user, password
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, shipped_auth_server
from seedance.testing.waits import wait_inventory_known
from seedance.traces.alibaba import NodeRow, PodRow, read_nodes, read_pods

__all__ = ["Kube", "KubeStack", "PodWatch", "kube_stack", "main", "namespace_object", "watch_pods"]

TENANT = "openb"
NAMESPACE = "openb"
#: GPU memory per model, MiB, for the nodes' ``nvidia.com/gpu.memory`` label. The trace's
#: pods ask for no GPU memory, so these only describe the nodes; G1-G3 are anonymised models.
GPU_MEMORY_MIB = {"T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768, "A10": 24576}
DEFAULT_GPU_MEMORY_MIB = 16384


def log(msg: str) -> None:
    print(f"[bench-k8s] {msg}", file=sys.stderr, flush=True)


# --- the fleet slice and its objects --------------------------------------------------------


def gpu_demand(pods: Iterable[PodRow]) -> float:
    """GPUs the pods ask for: whole GPUs plus thousandths of shared ones."""
    return sum(p.num_gpu * p.gpu_milli for p in pods) / 1000


def fleet_slice(
    nodes: Sequence[NodeRow], pods: Sequence[PodRow], oversubscribe: float
) -> list[NodeRow]:
    """GPU nodes in file order until their GPUs reach the demand / ``oversubscribe``."""
    target = gpu_demand(pods) / oversubscribe
    out: list[NodeRow] = []
    for n in nodes:
        if n.gpu <= 0:
            continue
        out.append(n)
        if sum(x.gpu for x in out) >= target:
            break
    return out


def node_object(row: NodeRow) -> dict[str, Any]:
    """A trace node as a kubelet registers it, with GPU feature discovery's labels."""
    return gpu_node_object(
        row.sn,
        gpus=row.gpu,
        product=row.model,
        gpu_memory_mib=GPU_MEMORY_MIB.get(row.model, DEFAULT_GPU_MEMORY_MIB),
        cpu=f"{row.cpu_milli}m",
        memory=f"{row.memory_mib}Mi",
        pods=1100,
    )


def pod_object(row: PodRow) -> dict[str, Any]:
    """A trace pod as a user would write it for Seedance's scheduler."""
    limits: dict[str, str] = {"cpu": f"{row.cpu_milli}m", "memory": f"{row.memory_mib}Mi"}
    if row.num_gpu and row.gpu_milli >= 1000:
        limits["nvidia.com/gpu"] = str(row.num_gpu)
    elif row.num_gpu:
        limits["seedance.io/gpu-milli"] = str(row.gpu_milli)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": row.name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "seedance",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/openb:1",
                    "resources": {"limits": limits, "requests": limits},
                }
            ],
        },
    }


def gpus_of(row: PodRow) -> int:
    """The pod's GPU share in thousandths."""
    return row.num_gpu * row.gpu_milli


# --- results --------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """Where one pod went: node and GPU indices, or the reason it waits."""

    node: str = ""
    gpus: tuple[int, ...] = ()
    waiting: str = ""
    latency_ms: float | None = None


@dataclass(slots=True)
class PathResult:
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def bound(self) -> dict[str, Outcome]:
        return {k: o for k, o in self.outcomes.items() if o.node}

    def waiting(self) -> dict[str, Outcome]:
        return {k: o for k, o in self.outcomes.items() if not o.node and o.waiting}

    def latencies(self) -> list[float]:
        return sorted(o.latency_ms for o in self.bound().values() if o.latency_ms is not None)


def percentile(sorted_ms: Sequence[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def alloc_pct(result: PathResult, pods: dict[str, PodRow], gpus: int) -> float:
    held = sum(gpus_of(pods[name]) for name in result.bound())
    return 100.0 * held / (gpus * 1000)


def same_placement_pct(bus: PathResult, kube: PathResult) -> float:
    placed = bus.bound()
    if not placed:
        return float("nan")
    same = sum(
        1
        for name, o in placed.items()
        if (k := kube.outcomes.get(name)) is not None and (k.node, k.gpus) == (o.node, o.gpus)
    )
    return 100.0 * same / len(placed)


# --- the bus path ---------------------------------------------------------------------------


class Paced:
    """Yield once per ``1 / rate`` seconds on the wall clock, catching up when late."""

    def __init__(self, rate: float) -> None:
        self.period = 1.0 / rate
        self.start = time.monotonic()
        self.n = 0

    async def tick(self) -> None:
        due = self.start + self.n * self.period
        self.n += 1
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


@contextlib.asynccontextmanager
async def slicer_stack(
    workdir: Path, name: str, **slicer: str
) -> AsyncIterator[tuple[NatsServer, ServiceProcesses, Bus]]:
    """A fresh nats-server with the streams, and a slicer process on it (``slicer``: settings
    over the bench's): the shipped users and permissions, each service as its own user, the
    bench as the operator."""
    server = shipped_auth_server(password)
    procs = ServiceProcesses(server.url, workdir / f"logs-{name}")
    bus = await Bus.connect(as_user(server.url, ADMIN, name=f"bench-k8s-{name}"))
    try:
        await bus.ensure_streams()
        settings = {"pool": f"bench{name}", "replica": "a", "lease_ttl_s": "3", "batch": "200"}
        procs.start("slicer", **(settings | slicer))
        yield server, procs, bus
    finally:
        await bus.close()
        codes = procs.stop_all()
        server.stop()
        bad = {k: c for k, c in codes.items() if c not in (0, -15)}
        if bad:
            log(f"{name}: services exited with {bad}; logs in {procs.logdir}")


class DecisionLog:
    """The slicer's decisions by job id, with the bench's receive time."""

    def __init__(self) -> None:
        self.by_job: dict[str, tuple[float, Any]] = {}
        self.changed = asyncio.Event()

    async def follow(self, bus: Bus) -> list[Any]:
        subjects = (slicing.PLACEMENTS, f"{slicing.ALL[:-1]}*.unschedulable", slicing.REJECTIONS)
        return [await bus.subscribe(subject, self._on) for subject in subjects]

    async def _on(self, msg: Any) -> None:
        ev = decode(msg.data)
        if isinstance(ev, Placement | Unschedulable | JobRejected):
            prev = self.by_job.get(ev.job_id)
            # A placement wins over an earlier wait; the first decision's time is kept.
            if prev is None or isinstance(ev, Placement):
                self.by_job[ev.job_id] = (time.monotonic(), ev)
            self.changed.set()


async def bus_path(
    workdir: Path, nodes: Sequence[NodeRow], pods: Sequence[PodRow], rate: float, settle_s: float
) -> PathResult:
    """The anchor: the bridge's own events for the same pods, published straight to the bus."""
    async with slicer_stack(workdir, "bus") as (_, _, bus):
        decisions = DecisionLog()
        subs = await decisions.follow(bus)
        tracker = Tracker(instance="bench", id_key=secrets.token_bytes(32))
        tracker.namespace_seen(namespace_object(NAMESPACE, TENANT))
        for node in nodes:
            await _publish(bus, tracker.node_seen(node_object(node), datetime.now(UTC)))
        await wait_inventory_known(bus)  # the slicer knows the slice before the first job
        sent: dict[str, tuple[str, float]] = {}
        pacer = Paced(rate)
        for row in pods:
            await pacer.tick()
            pod = pod_object(row)
            uid = str(uuid.uuid4())
            pod["metadata"] |= {"uid": uid, "creationTimestamp": k8s_time(datetime.now(UTC))}
            for job in await _publish(bus, tracker.pod_seen(pod, datetime.now(UTC))):
                sent[job] = (row.name, time.monotonic())
        await _until_decided(decisions, set(sent), settle_s)
        for sub in subs:
            await sub.unsubscribe()
    return PathResult({name: _outcome(decisions, job, t0) for job, (name, t0) in sent.items()})


async def _publish(bus: Bus, actions: Iterable[Any]) -> list[str]:
    """Publish the tracker's events; the job ids of the job events among them."""
    jobs = []
    for action in actions:
        if isinstance(action, Publish):
            await bus.publish(action.subject, action.event)
            if isinstance(action.event, JobSubmitted):
                jobs.append(action.event.job_id)
    return jobs


def _outcome(decisions: DecisionLog, job: str, t0: float) -> Outcome:
    decided = decisions.by_job.get(job)
    if decided is None:
        return Outcome()
    t, ev = decided
    if isinstance(ev, Placement):
        gpus = tuple(g.index for g in ev.gpus)
        return Outcome(node=ev.node, gpus=gpus, latency_ms=(t - t0) * 1000)
    return Outcome(waiting=str(getattr(ev, "reason", "")))


async def _until_decided(decisions: DecisionLog, jobs: set[str], settle_s: float) -> None:
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and not jobs <= decisions.by_job.keys():
        decisions.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(decisions.changed.wait(), 0.5)


# --- the Kubernetes path --------------------------------------------------------------------


@dataclass(slots=True)
class PodWatch:
    created: dict[str, float] = field(default_factory=dict)
    result: PathResult = field(default_factory=PathResult)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def seen(self, pod: dict[str, Any], t: float) -> None:
        name = pod["metadata"]["name"]
        out = self.result.outcomes.setdefault(name, Outcome())
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node and not out.node:
            doc = json.loads(
                (pod["metadata"].get("annotations") or {}).get("seedance.io/placement", "{}")
            )
            out.node = node
            out.gpus = tuple(int(g["index"]) for g in doc.get("gpus") or [])
            if name in self.created:
                out.latency_ms = (t - self.created[name]) * 1000
            self.changed.set()
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and not out.waiting:
                out.waiting = str(c.get("reason") or "")
                self.changed.set()

    def settled(self, names: set[str]) -> bool:
        o = self.result.outcomes
        return all(n in o and (o[n].node or o[n].waiting) for n in names)


async def watch_pods(kube: Kube, rv: str, watch: PodWatch) -> None:
    path = (
        f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&allowWatchBookmarks=true&resourceVersion={rv}"
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with kube.http.get(kube.url + path, timeout=timeout) as r:
        async for line in r.content:
            if not line.strip():
                continue
            ev = json.loads(line)
            if ev.get("type") in ("ADDED", "MODIFIED"):
                watch.seen(ev["object"], time.monotonic())


@dataclass
class KubeStack:
    """The Kubernetes path's processes, running: the test API server at ``url``, the bench's
    client of it, the slicer and the bridge, the bench's bus (the operator)."""

    url: str
    kube: Kube
    procs: ServiceProcesses
    bus: Bus
    kubeconfig: Path


@contextlib.asynccontextmanager
async def kube_stack(
    workdir: Path,
    nodes: Sequence[dict[str, Any]],
    *,
    slicer: dict[str, str] | None = None,
    bridge: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> AsyncIterator[KubeStack]:
    """The test API server (a process) holding the namespaces and ``nodes`` (Node objects), a
    fresh nats-server and slicer, and the bridge (a process; ``slicer``/``bridge``: settings
    over the bench's); yielded once the slicer knows every node the bridge published."""
    async with (
        kube_api(workdir) as kube,
        slicer_stack(workdir, "kube", **(slicer or {})) as (_, procs, bus),
    ):
        await start_bridge(
            kube,
            procs,
            bus,
            namespaces=[namespace_object(NAMESPACE, TENANT)],
            nodes=nodes,
            replica="bench-a",
            ready_timeout_s=ready_timeout_s,
            **(bridge or {}),
        )
        yield KubeStack(kube.url, kube, procs, bus, kube.kubeconfig)


async def kube_path(
    workdir: Path, nodes: Sequence[NodeRow], pods: Sequence[PodRow], rate: float, settle_s: float
) -> PathResult:
    async with kube_stack(workdir, [node_object(n) for n in nodes]) as ks:
        kube = ks.kube
        watch = PodWatch()
        rv = await kube.list_rv(f"/api/v1/namespaces/{NAMESPACE}/pods")
        watcher = asyncio.create_task(watch_pods(kube, rv, watch))
        pacer = Paced(rate)
        for row in pods:
            await pacer.tick()
            await kube.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod_object(row))
            watch.created[row.name] = time.monotonic()
        names = {p.name for p in pods}
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and not watch.settled(names):
            watch.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.changed.wait(), 0.5)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        return watch.result


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench-k8s", description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=2000, help="pods from the head of the pod list")
    p.add_argument("--rate", type=float, default=50.0, help="pods created per second")
    p.add_argument(
        "--oversubscribe", type=float, default=1.05, help="pods' GPU demand over the slice's GPUs"
    )
    p.add_argument("--pod-list", type=Path, required=True, help="openb_pod_list_default.csv")
    p.add_argument("--node-list", type=Path, required=True, help="openb_node_list_gpu_node.csv")
    p.add_argument(
        "--settle-s",
        type=float,
        default=60.0,
        help="how long to wait after the last pod for every decision",
    )
    return p.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    pods = read_pods(args.pod_list)[: args.pods]
    nodes = fleet_slice(read_nodes(args.node_list), pods, args.oversubscribe)
    gpus = sum(n.gpu for n in nodes)
    log(
        f"{len(pods)} pods asking {gpu_demand(pods):.1f} GPUs on {len(nodes)} nodes "
        f"with {gpus} GPUs, {args.rate:g} pods/s"
    )
    by_name = {p.name: p for p in pods}
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        workdir = Path(tmp)
        t0 = time.monotonic()
        bus = await bus_path(workdir, nodes, pods, args.rate, args.settle_s)
        log(
            f"bus path: {len(bus.bound())} placed, {len(bus.waiting())} waiting "
            f"({time.monotonic() - t0:.1f} s)"
        )
        t0 = time.monotonic()
        kube = await kube_path(workdir, nodes, pods, args.rate, args.settle_s)
        log(
            f"kubernetes path: {len(kube.bound())} bound, {len(kube.waiting())} reported "
            f"({time.monotonic() - t0:.1f} s)"
        )
    bind = kube.latencies()
    bus_ms = bus.latencies()
    fields = {
        "pods": len(pods),
        "bound": len(kube.bound()),
        "unschedulable_reported": len(kube.waiting()),
        "bind_p50_ms": f"{statistics.median(bind):.1f}" if bind else "nan",
        "bind_p99_ms": f"{percentile(bind, 0.99):.1f}",
        "alloc_pct": f"{alloc_pct(kube, by_name, gpus):.1f}",
        "bus_path_alloc_pct": f"{alloc_pct(bus, by_name, gpus):.1f}",
        "same_placement_pct": f"{same_placement_pct(bus, kube):.1f}",
        "bus_p99_ms": f"{percentile(bus_ms, 0.99):.1f}",
    }
    _explain_differences(bus, kube)
    print("k8s: " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)
    accounted = len(kube.bound()) + len(kube.waiting())
    return 0 if accounted == len(pods) else 1


def _explain_differences(bus: PathResult, kube: PathResult, shown: int = 5) -> None:
    """Log the first pods the two paths put in different places (what to look at first)."""
    n = 0
    for name, o in bus.outcomes.items():
        k = kube.outcomes.get(name, Outcome())
        if (k.node, k.gpus) != (o.node, o.gpus) and n < shown:
            log(
                f"differs: {name}: bus {o.node or o.waiting or '-'} {o.gpus} / "
                f"kubernetes {k.node or k.waiting or '-'} {k.gpus}"
            )
            n += 1


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))
