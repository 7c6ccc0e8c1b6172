"""bench-scale's gangs through Kubernetes: the same 1,024-GPU gangs as its bus path (``--gangs``
of ``--gang-members`` 8-GPU pods), as Pod objects through the test API server, the k8s-bridge
and the slicer, on the same fleet as Node objects; beside each, the test API server's own time
for the same Bindings sent alone.

The stack is bench-k8s's (`seedance.bench.k8s.kube_stack`: the test API server as a process, a
fresh nats-server and slicer under the shipped users, the bridge as a process), with the
fleet's nodes created as GPU feature discovery labels them (``nvidia.com/gpu.product`` in its
dashed form, ``nvidia.com/gpu.memory``, the rack and block labels). Per gang, one after
another into the free fleet (no background work: the bus path measures that):

1. its members are created at once (32 requests in flight), labelled ``seedance.io/pod-group``
   and ``-size``; ``bridge_bound_*_s`` run from the last create's answer (the last member's
   arrival) to the bench's watch showing the last member's ``spec.nodeName``: the bridge sees
   the pods, submits the gang once all are pending, the slicer places it whole, the bridge
   posts the Bindings in parallel (``API_CONCURRENCY`` in flight) under its request rate;
2. **alone**: twins of the members (another scheduler's, so the bridge ignores them) are bound
   to the same nodes by the bridge's own client class (`KubeApi`), as many in flight, with no
   rate limit and no bridge or slicer: ``api_alone_*_s`` is the test API server's own time for
   those requests, and ``bridge_net_max_s`` the slowest gang's time less its gang's alone time;
3. the members are deleted (one ``deletecollection``) and the bench waits for the slicer's
   release of the gang before the next.

The bridge's rate (``--api-qps``/``--api-burst``, its ``SEEDANCE_K8S_BRIDGE_API_QPS``/``_BURST``,
default 50/100 as kube-scheduler's ``clientConnection``) is a token bucket: a gang of more members
than the burst waits ``(members - burst) / qps`` for the rest of its Bindings
(``rate_floor_s``). What a real API server allows is in docs/k8s-bridge.md#request-rate.
Known gap: the bridge's inventory does not carry node labels (`core/nodes.py`), so this path
places gangs without the rack preference the bus path's inventory gives.

Line, before the fleet's ``scale:`` line: ``scale-bridge: nodes=<n> gangs=<n> gang_gpus=<n>
bridge_bound_p50_s=<n> bridge_bound_max_s=<n> api_alone_p50_s=<n> api_alone_max_s=<n>
bridge_net_max_s=<n> api_qps=<n> api_burst=<n> rate_floor_s=<n> bound_vs_alone_p50=<ratio>
rate_waits=<n>`` (the ratio: the medians' through the bridge over alone, the anchor; the last:
the bridge's requests its rate held back over the run, its
``seedance_k8s_bridge_api_rate_wait_seconds`` metric).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seedance.bench.k8s import (
    NAMESPACE,
    TENANT,
    Kube,
    PodWatch,
    kube_stack,
    namespace_object,
    watch_pods,
)
from seedance.bench.scale_fleet import TOPOLOGY_LEVELS, SpotNode, read_fleet
from seedance.events import decode
from seedance.events.slicing import JobReleased
from seedance.events.subjects import slicing
from seedance.k8s_bridge.kube import KubeApi, connect
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.testing.processes import ServiceProcesses

__all__ = ["add_args", "run_fleet", "spot_node_object"]

GANG_GPUS = 8
#: The twins' namespace and scheduler: bound by the bench alone, never seen by the bridge.
ALONE = "alone"
ALONE_SCHEDULER = "bench-alone"
LABEL_GROUP, LABEL_SIZE = "seedance.io/pod-group", "seedance.io/pod-group-size"
_DEFAULTS = BridgeSettings()
_RATE_WAIT = "seedance_k8s_bridge_api_rate_wait_seconds"


def log(msg: str) -> None:
    print(f"[bench-scale] {msg}", file=sys.stderr, flush=True)


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--no-bridge", action="store_true", help="skip the gangs through the k8s-bridge"
    )
    ap.add_argument("--api-qps", type=float, default=_DEFAULTS.api_qps, help="the bridge's")
    ap.add_argument("--api-burst", type=int, default=_DEFAULTS.api_burst, help="the bridge's")


def spot_node_object(node: SpotNode) -> dict[str, Any]:
    """A spot node as its kubelet and GPU feature discovery register it."""
    resources = {
        "cpu": f"{node.cpu_milli}m",
        "memory": f"{node.memory_mib}Mi",
        "pods": "110",
        "nvidia.com/gpu": str(node.gpus),
    }
    labels = {
        "kubernetes.io/hostname": node.name,
        # GFD's label value: NVML's name with its spaces as dashes (a label has no spaces)
        "nvidia.com/gpu.product": node.model.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(node.gpu_memory_mib),
        **dict(node.labels),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def member(name: str, group: str, size: int, scheduler: str = "seedance") -> dict[str, Any]:
    gpus = {"nvidia.com/gpu": str(GANG_GPUS)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_GROUP: group, LABEL_SIZE: str(size)}},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": gpus, "requests": gpus},
                }
            ],
        },
    }


class Releases:
    """The slicer's releases of the tenant's jobs, counted as they come."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()

    async def on(self, msg: Any) -> None:
        if isinstance(decode(msg.data), JobReleased):
            self.count += 1
            self.changed.set()

    async def until(self, count: int, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.count < count:
                self.changed.clear()
                await self.changed.wait()


async def _until_bound(watch: PodWatch, names: Sequence[str], timeout_s: float) -> None:
    outcomes = watch.result.outcomes
    async with asyncio.timeout(timeout_s):
        while not all(n in outcomes and outcomes[n].node for n in names):
            watch.changed.clear()
            await watch.changed.wait()


def _binding(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def alone(kube: Kube, api: KubeApi, placed: dict[str, str], group: str) -> float:
    """The same Bindings (to the same nodes), sent by the bridge's client class with as many
    in flight and no rate limit to the test API server alone: the seconds they took."""
    path = f"/api/v1/namespaces/{ALONE}/pods"
    await kube.create_all(path, [member(n, group, len(placed), ALONE_SCHEDULER) for n in placed])
    gate = asyncio.Semaphore(_DEFAULTS.api_concurrency)

    async def bind(name: str, node: str) -> None:
        async with gate:
            await api.bind(ALONE, name, _binding(name, node))

    t0 = time.monotonic()
    await asyncio.gather(*(bind(n, node) for n, node in placed.items()))
    took = time.monotonic() - t0
    await kube.delete_all(path, f"{LABEL_GROUP}={group}")
    return took


def _bridge_port(procs: ServiceProcesses) -> int:
    """The bridge process's metrics port, from its ``service_started`` log line."""
    for line in procs.log("k8s-bridge").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("event") == "service_started":
                return int(rec["http_port"])
    raise RuntimeError("the k8s-bridge logged no http port")


async def rate_waits(kube: Kube, port: int) -> tuple[int, float]:
    """The bridge's requests held back by its rate so far, and their seconds in all (its
    ``seedance_k8s_bridge_api_rate_wait_seconds{bucket="api"}``)."""
    async with kube.http.get(f"http://127.0.0.1:{port}/metrics") as r:
        text = await r.text()
    found = dict(re.findall(_RATE_WAIT + r'_(count|sum)\{bucket="api"\} (\S+)', text))
    return int(float(found.get("count", 0))), float(found.get("sum", 0.0))


async def _gang(
    kube: Kube, watch: PodWatch, api: KubeApi, i: int, members: int, timeout_s: float
) -> tuple[float, float]:
    group = f"gang{i}"
    names = [f"{group}-m{j}" for j in range(members)]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    last = await kube.create_all(path, [member(n, group, members) for n in names])
    watch.created.update(dict.fromkeys(names, last))
    try:
        await _until_bound(watch, names, timeout_s)
    except TimeoutError:
        raise RuntimeError(f"{group} was not bound through the bridge in {timeout_s} s") from None
    outcomes = watch.result.outcomes
    bound_s = max(outcomes[n].latency_ms or 0.0 for n in names) / 1000
    alone_s = await alone(kube, api, {n: outcomes[n].node for n in names}, group)
    await kube.delete_all(path, f"{LABEL_GROUP}={group}")
    return bound_s, alone_s


async def run_fleet(args: argparse.Namespace, copies: int, workdir: Path) -> str:
    nodes = read_fleet(args.nodes, copies, args.limit_nodes)
    slicer = {"batch": str(args.batch), "topology_levels": ",".join(TOPOLOGY_LEVELS)}
    bridge = {"api_qps": str(args.api_qps), "api_burst": str(args.api_burst)}
    t0 = time.monotonic()
    objs = [spot_node_object(n) for n in nodes]
    stack = kube_stack(workdir, objs, slicer=slicer, bridge=bridge, ready_timeout_s=600)
    async with stack as ks, contextlib.AsyncExitStack() as done:
        log(f"bridge x{copies}: {len(nodes)} Node objects known to the slicer through the bridge "
            f"in {time.monotonic() - t0:.1f} s")  # fmt: skip
        await ks.kube.create("/api/v1/namespaces", namespace_object(ALONE))
        watch = PodWatch()
        rv = await ks.kube.list_rv(f"/api/v1/namespaces/{NAMESPACE}/pods")
        watcher = asyncio.create_task(watch_pods(ks.kube, rv, watch))
        done.push_async_callback(_cancel, watcher)
        releases = Releases()
        sub = await ks.bus.subscribe(slicing.tenant_wildcard(TENANT), releases.on)
        done.push_async_callback(sub.unsubscribe)
        api = KubeApi(await connect(str(ks.kubeconfig)), qps=0)
        done.push_async_callback(api.close)
        port = _bridge_port(ks.procs)
        times: list[tuple[float, float]] = []
        held = await rate_waits(ks.kube, port)
        for i in range(args.gangs):
            bound_s, alone_s = await _gang(
                ks.kube, watch, api, i, args.gang_members, args.gang_timeout_s
            )
            times.append((bound_s, alone_s))
            now = await rate_waits(ks.kube, port)
            log(f"bridge gang{i}: bound in {bound_s:.3f} s; the same Bindings alone "
                f"{alone_s:.3f} s; {now[0] - held[0]} of the bridge's requests held back by "
                f"its rate, {now[1] - held[1]:.2f} s in all")  # fmt: skip
            held = now
            await releases.until(i + 1, args.gang_timeout_s)
        waited = await rate_waits(ks.kube, port)
    return _line(args, len(nodes), times) + f" rate_waits={waited[0]}"


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _line(args: argparse.Namespace, nodes: int, times: list[tuple[float, float]]) -> str:
    bound = [b for b, _ in times]
    lone = [a for _, a in times]
    floor_s = max(0, args.gang_members - args.api_burst) / args.api_qps if args.api_qps > 0 else 0
    return (
        f"scale-bridge: nodes={nodes} gangs={len(times)} "
        f"gang_gpus={args.gang_members * GANG_GPUS} "
        f"bridge_bound_p50_s={statistics.median(bound):.3f} bridge_bound_max_s={max(bound):.3f} "
        f"api_alone_p50_s={statistics.median(lone):.3f} api_alone_max_s={max(lone):.3f} "
        f"bridge_net_max_s={max(b - a for b, a in times):.3f} api_qps={args.api_qps:g} "
        f"api_burst={args.api_burst} rate_floor_s={floor_s:.2f} "
        f"bound_vs_alone_p50={statistics.median(bound) / max(statistics.median(lone), 1e-9):.1f}"
    )
