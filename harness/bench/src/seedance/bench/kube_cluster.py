"""A bench's Kubernetes side: the test API server as a process, the harness's HTTP client of it,
and the k8s-bridge leading on it: one starter for every bench and chaos stage that goes through
the bridge (`make bench-k8s`, the ``k8s`` stage of `make chaos-tenants`, bench-scale's gangs
through the bridge).

- `kube_api(workdir)`: the test API server (`seedance.testing.kube_api`, spoken to over HTTP
  as a real one is) and a kubeconfig for it as its cluster admin; yields a `Kube`. Enter it
  before the service processes are started and leave it after they are stopped, so the bridge
  never loses its API server while it still runs.
- `start_bridge(kube, procs, bus, ...)`: creates the namespaces (and the bridge's lease
  namespace) and the GPU nodes, starts the k8s-bridge process, and returns once the slicer (the
  caller's) has read the nodes' inventory: the bridge publishes it once it leads.

It must not start the slicer or the nats-server (each caller has its own: shipped or generated
users, pools, quotas), nor judge what the bench measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from seedance.core import Bus
from seedance.testing.kube_api import ADMIN_TOKEN
from seedance.testing.kube_api.process import KubeApiProcess
from seedance.testing.processes import ServiceProcesses
from seedance.testing.waits import wait_inventory_known

__all__ = [
    "SYSTEM",
    "Kube",
    "gpu_node_object",
    "kube_api",
    "kubeconfig",
    "namespace_object",
    "start_bridge",
]

#: The bridge's own namespace: its lease lives there.
SYSTEM = "seedance-system"


class Kube:
    """The harness's HTTP client of the test API server (it plays users, controllers and the
    kubelet), with the admin kubeconfig written for the services."""

    def __init__(self, url: str, http: aiohttp.ClientSession, config: Path) -> None:
        self.url = url
        self.http = http
        self.kubeconfig = config

    async def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(self.url + path, json=obj) as r:
            body: dict[str, Any] = await r.json()
            if r.status >= 300:
                raise RuntimeError(f"POST {path}: {r.status} {body.get('message')}")
            return body

    async def create_all(
        self, path: str, objs: Sequence[dict[str, Any]], concurrency: int = 32
    ) -> float:
        """Create ``objs`` (``concurrency`` requests at a time); when the last one returned."""
        gate = asyncio.Semaphore(concurrency)

        async def one(obj: dict[str, Any]) -> None:
            async with gate:
                await self.create(path, obj)

        await asyncio.gather(*(one(o) for o in objs))
        return time.monotonic()

    async def delete_all(self, path: str, label_selector: str) -> None:
        """``deletecollection`` of the objects under ``path`` that match the selector."""
        async with self.http.delete(self.url + path, params={"labelSelector": label_selector}) as r:
            if r.status >= 300:
                raise RuntimeError(f"DELETE {path}: {r.status} {await r.text()}")

    async def get(self, path: str) -> dict[str, Any] | None:
        async with self.http.get(self.url + path) as r:
            if r.status == 404:
                return None
            body: dict[str, Any] = await r.json()
            if r.status >= 300:
                raise RuntimeError(f"GET {path}: {r.status} {body.get('message')}")
            return body

    async def list_rv(self, path: str) -> str:
        """The resourceVersion of a list: where a watch of it starts."""
        body = await self.get(path)
        if body is None:
            raise RuntimeError(f"GET {path}: 404")
        return str(body["metadata"]["resourceVersion"])

    async def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        return await self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    async def events(self, ns: str) -> list[dict[str, Any]]:
        body = await self.get(f"/api/v1/namespaces/{ns}/events")
        return list((body or {}).get("items") or [])


def kubeconfig(url: str) -> str:
    """A kubeconfig for ``url`` as the test API server's admin (it refuses a token it does not
    know: 401)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {"server": url}}],
            "users": [{"name": "bench", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "current-context": "bench",
        }
    )


def namespace_object(name: str, tenant: str | None = None) -> dict[str, Any]:
    """A Namespace, bound to ``tenant`` by its ``seedance.io/tenant`` label if one is named."""
    labels = {"seedance.io/tenant": tenant} if tenant else {}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def gpu_node_object(
    name: str,
    *,
    gpus: int,
    product: str,
    gpu_memory_mib: int,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
) -> dict[str, Any]:
    """A Ready Node as a kubelet registers it, with GPU feature discovery's labels."""
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": str(gpu_memory_mib),
            },
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


@contextlib.asynccontextmanager
async def kube_api(workdir: Path) -> AsyncIterator[Kube]:
    """The test API server as a process under ``workdir``, and the harness's client of it."""
    # Bookmarks every 5 s: watches of a long bench stay resumable without flooding it.
    api = KubeApiProcess(workdir / "kube-api", bookmark_interval_s=5.0)
    try:
        url = api.start()
        config = workdir / "kubeconfig"
        config.write_text(kubeconfig(url))
        async with aiohttp.ClientSession() as http:
            yield Kube(url, http, config)
    finally:
        api.stop()


async def start_bridge(
    kube: Kube,
    procs: ServiceProcesses,
    bus: Bus,
    *,
    namespaces: Iterable[dict[str, Any]],
    nodes: Iterable[dict[str, Any]],
    replica: str,
    ready_timeout_s: float = 60.0,
    **settings: str,
) -> None:
    """Create ``namespaces`` (and `SYSTEM`) and ``nodes``, start the k8s-bridge as ``replica``
    (``settings``: its other ``SEEDANCE_K8S_BRIDGE_*``), and wait (at most
    ``ready_timeout_s``) until the slicer has every node's inventory."""
    for ns in (namespace_object(SYSTEM), *namespaces):
        await kube.create("/api/v1/namespaces", ns)
    node_objs = list(nodes)
    await kube.create_all("/api/v1/nodes", node_objs)
    # A short lease: a bench or chaos stage should not wait long for the first leader.
    procs.start(
        "k8s-bridge",
        kubeconfig=str(kube.kubeconfig),
        replica=replica,
        lease_namespace=SYSTEM,
        lease_duration_s="6",
        lease_renew_s="1",
        **settings,
    )
    # The bridge leads once it publishes the nodes' inventory; the slicer has read it.
    await wait_inventory_known(bus, ready_timeout_s, nodes=len(node_objs))
