"""A k8s-bridge and a slicer for a test: the test API server (real HTTP), a real nats-server,
the bridge through kubernetes_asyncio, a real SlicerService; names unique per test.

Each test gets its own tenant (``t<unique>``, a namespace label), its own node names, its own
slicer pool, and a server of its own (``nats_url``): the slicer and the bridge run under their
shipped NATS users on the catalogue's own durables, as the deployment does, so a test sees only
its own pods and decisions.

``slicer`` and ``bridge`` take ``user``, the shipped user to run as (``shipped(url, user)``; by
default the service's own); tests naming it run on the module's shipped-auth server (``auth_url``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.events import Event, decode
from seedance.events.stores import SLICING_POLICY_KEY
from seedance.events.subjects import CONSUMERS, QUOTA_POLICY_KEY, observed, slicing
from seedance.k8s_bridge.kube import KubeApi, connect
from seedance.k8s_bridge.service import DURABLE, BridgeService
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password

__all__ = [
    "Env",
    "Trail",
    "bridge",
    "fast_forward",
    "gpu_node",
    "shipped",
    "slicer",
]

SLICER_DURABLES = ("slicer-inventory", "slicer-pauses", "slicer-jobs")
#: The lease namespace the bridges elect in.
SYSTEM = "seedance-system"


async def fast_forward(bus: Bus, unique: str) -> None:
    """Create this test's durables (``""``: the catalogue's own, as the services bind them)
    and acknowledge everything already in their streams."""
    names = [(n, f"{n}-{unique}" if unique else n) for n in (*SLICER_DURABLES, DURABLE)]
    for name, durable in names:
        spec = dataclasses.replace(CONSUMERS[name], durable=durable)
        await bus.ensure_consumer(spec)
        sub = await bus.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
        while (pending := (await sub.consumer_info()).num_pending) > 0:
            for m in await sub.fetch(min(pending, 500), timeout=5):
                await m.ack_sync()
        await sub.unsubscribe()


def shipped(url: str, user: str, **kw: Any) -> BusSettings:
    """How ``user`` of deploy/auth connects to the shipped-auth server at ``url``."""
    return BusSettings(
        url=url, user=user, password=shipped_password(user), name=f"test-{user}", **kw
    )


@contextlib.asynccontextmanager
async def slicer(
    nats_url: str, unique: str, user: str | None = None, **kw: Any
) -> AsyncIterator[SlicerService]:
    settings = SlicerSettings(pool=f"p{unique}", replica="s", lease_ttl_s=1.5, batch=100, **kw)
    bus = shipped(nats_url, user) if user else BusSettings(url=nats_url, name="test-slicer")
    runtime = ServiceRuntime("slicer", bus)
    async with serving(SlicerService.build(runtime, WallClock(), settings), 15) as svc:
        yield svc


@contextlib.asynccontextmanager
async def bridge(
    kube: KubeApiServer,
    nats_url: str,
    unique: str,
    tmp_path: Path,
    replica: str = "a",
    user: str | None = None,
    **kw: Any,
) -> AsyncIterator[BridgeService]:
    settings = BridgeSettings(
        replica=f"bridge-{replica}",
        lease_namespace=SYSTEM,
        lease_name=f"bridge-{unique}",
        lease_duration_s=kw.pop("lease_duration_s", 1.5),
        lease_renew_s=kw.pop("lease_renew_s", 0.2),
        backoff_initial_s=0.05,
        backoff_max_s=0.5,
        policy_key=kw.pop("policy_key", QUOTA_POLICY_KEY),
        slicing_key=kw.pop("slicing_key", SLICING_POLICY_KEY),
        **kw,
    )
    bus = (
        shipped(nats_url, user)
        if user
        else BusSettings(url=nats_url, name=f"test-bridge-{replica}")
    )
    runtime = ServiceRuntime("k8s-bridge", bus)
    api = KubeApi(
        await connect(str(kube.kubeconfig(tmp_path / f"kubeconfig-{replica}"))),
        page_size=settings.list_page_size,
        qps=settings.api_qps,
        burst=settings.api_burst,
    )
    try:
        async with serving(BridgeService.build(runtime, WallClock(), settings, api), 15) as svc:
            yield svc
    finally:
        await api.close()


def gpu_node(kube: KubeApiServer, name: str, gpus: int = 8, **labels: str) -> dict[str, Any]:
    return seed.node(
        kube,
        name,
        gpus=gpus,
        labels={
            "nvidia.com/gpu.product": "A100-SXM4-80GB",
            "nvidia.com/gpu.memory": "81920",
            **labels,
        },
    )


class Trail:
    """Every observed job event and slicer decision of the test's tenant, as they come."""

    def __init__(self, subs: list[Any]) -> None:
        self.subs = subs
        self.events: list[Event] = []
        #: Each event's stream sequence, by event id (to wait for a consumer's ack floor).
        self.seqs: dict[str, int] = {}
        self.task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, bus: Bus, *tenants: str) -> Trail:
        subjects = []
        for tenant in tenants:
            observed_all = observed.subject(tenant, "submitted").rsplit(".", 1)[0] + ".*"
            subjects += [slicing.tenant_wildcard(tenant), observed_all]
        return cls([await bus.js.subscribe(s, ordered_consumer=True) for s in subjects])

    async def _read(self) -> None:
        async def one(sub: Any) -> None:
            async for msg in sub.messages:
                event = decode(msg.data)
                self.seqs[event.id] = msg.metadata.sequence.stream
                self.events.append(event)

        await asyncio.gather(*(one(s) for s in self.subs))

    def of(self, kind: type, job: str | None = None, tenant: str | None = None) -> list[Any]:
        return [
            e
            for e in self.events
            if isinstance(e, kind)
            and (job is None or getattr(e, "job_id", None) == job)
            and (tenant is None or getattr(e, "tenant", None) == tenant)
        ]

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        for s in self.subs:
            await s.unsubscribe()


@dataclasses.dataclass
class Env:
    """What a bridge test works with: the API server, a typed client of it (the test's own
    reads and writes, over HTTP), the bus, the tenant's trail, names."""

    kube: KubeApiServer
    core: client.CoreV1Api
    bus: Bus
    trail: Trail
    unique: str
    tenant: str
    ns: str
    tmp_path: Path
    nats_url: str

    async def pod(self, name: str) -> client.V1Pod:
        return await self.core.read_namespaced_pod(name, self.ns)

    async def create_pod(
        self,
        name: str,
        *,
        gpus: int = 1,
        labels: dict[str, str] | None = None,
        priority: int | None = None,
        node_name: str | None = None,
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """A pod of Seedance's scheduler, created over HTTP as a user would."""
        spec: dict[str, Any] = {
            "schedulerName": "seedance",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
                }
            ],
        }
        if priority is not None:
            spec["priority"] = priority
        if node_name:
            spec["nodeName"] = node_name
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": labels or {},
                "annotations": annotations or {},
            },
            "spec": spec,
        }
        resp = await self.core.create_namespaced_pod(self.ns, body, _preload_content=False)
        assert resp.status == 201, await resp.text()
        return dict(await resp.json())

    async def bound(self, name: str, timeout_s: float = 15.0) -> client.V1Pod:
        """The pod as the check saw it bound."""
        seen: list[client.V1Pod] = []

        async def check() -> bool:
            seen[:] = [await self.pod(name)]
            return bool(seen[0].spec.node_name)

        await eventually(check, timeout_s, what=f"pod {name} bound")
        return seen[0]

    async def kube_lease(self, name: str) -> dict[str, Any]:
        rt = self.kube.api.resolve("coordination.k8s.io", "v1", "leases")
        return dict(self.kube.api.get(rt, "seedance-system", name))

    async def events_of(self, name: str) -> list[client.CoreV1Event]:
        events = await self.core.list_namespaced_event(self.ns)
        return [e for e in events.items if e.involved_object.name == name]

    async def reasons(self, name: str) -> list[str]:
        return [e.reason for e in await self.events_of(name)]

    async def finish(self, name: str, phase: str = "Succeeded", exit_code: int = 0) -> None:
        """Report the pod's end as its kubelet would (the status subresource)."""
        pod = await self.pod(name)
        finished = "2026-12-01T10:00:00Z"
        status = {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": exit_code, "finishedAt": finished}},
                }
            ],
        }
        body = {"status": status}
        resp = await self.core.patch_namespaced_pod_status(
            name, self.ns, body, _preload_content=False
        )
        assert resp.status == 200, await resp.text()
        del pod


@contextlib.asynccontextmanager
async def environment(
    kube: KubeApiServer,
    bus: Bus,
    unique: str,
    tmp_path: Path,
    nats_url: str,
    tenant: str | None = None,
    others: tuple[str, ...] = (),
) -> AsyncIterator[Env]:
    """``tenant``: a shipped tenant (``acme``) whose namespace this is, for tests on the
    shipped-auth server (one per module), whose services bind the catalogue's durables: those
    are fast-forwarded past what earlier tests left (a bridge run without a slicer left its
    nodes' inventory, and the next test's slicer placed a pod on a node of that test); default:
    the test's own ``t<unique>``. The trail follows ``others``' subjects too."""
    await fast_forward(bus, "" if tenant else unique)
    tenant, ns = tenant or f"t{unique}", f"ns-{unique}"
    seed.namespace(kube, ns, labels={"seedance.io/tenant": tenant})
    with contextlib.suppress(Exception):
        seed.namespace(kube, SYSTEM)
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(kube.kubeconfig(tmp_path / "kubeconfig-test")), client_configuration=cfg
    )
    trail = await Trail.open(bus, tenant, *others)
    async with client.ApiClient(configuration=cfg) as api_client:
        try:
            yield Env(
                kube=kube,
                core=client.CoreV1Api(api_client),
                bus=bus,
                trail=trail,
                unique=unique,
                tenant=tenant,
                ns=ns,
                tmp_path=tmp_path,
                nats_url=nats_url,
            )
        finally:
            await trail.close()


__all__ += ["environment"]
