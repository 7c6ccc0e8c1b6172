"""Replicas come only from where they may (issue 27, build item 2): an EndpointSlice becomes a
model's replica in ``seedance-router-replicas`` only in a namespace bound to a tenant (under
that tenant's key) or listed by the operator as the shared pool (under the shared key); a slice
anywhere else, or one the bridge cannot take (an endpoint without ``targetRef``, one naming a
pod of another namespace), is reported once (a log line, a counter, a Warning Event on the
slice) and skipped while the others register; a dotted pod name registers.

Run as the deployment runs: the shipped-auth nats-server (``auth_url``), the bridge under its
shipped user ``k8s-bridge``, the bucket read as ``admin``; slices created over HTTP in the test
API server as the EndpointSlice controller writes them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from seedance.core import Bus
from seedance.core.kv import ensure_bucket, live_entries
from seedance.events import replicas
from seedance.events.replicas import ReplicaRegistration
from seedance.events.subjects import routing
from seedance.k8s_bridge.replica_sync import ReplicaSync
from seedance.k8s_bridge.service import BridgeService
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import SYSTEM, bridge

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def discovery(k8s: client.ApiClient) -> client.DiscoveryV1Api:
    return client.DiscoveryV1Api(k8s)


def endpoint(pod: str | None, ip: str, ns: str | None, kind: str = "Pod") -> dict[str, Any]:
    """An endpoint as the EndpointSlice controller writes it (``pod`` None: no targetRef, as
    a hand-written slice may have)."""
    out: dict[str, Any] = {
        "addresses": [ip],
        "conditions": {"ready": True, "serving": True, "terminating": False},
    }
    if pod is not None:
        out["targetRef"] = {"kind": kind, "name": pod, "namespace": ns}
    return out


async def create_slice(
    discovery: client.DiscoveryV1Api, ns: str, name: str, fleet: str, *endpoints: dict[str, Any]
) -> None:
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/service-name": "triton",
                "seedance.io/model": "echo",
                "seedance.io/router-fleet": fleet,
            },
        },
        "addressType": "IPv4",
        "endpoints": list(endpoints),
        "ports": [{"name": "grpc", "port": 8001, "protocol": "TCP"}],
    }
    resp = await discovery.create_namespaced_endpoint_slice(ns, body, _preload_content=False)
    assert resp.status == 201, await resp.text()


async def bucket(bus: Bus, fleet: str) -> dict[str, ReplicaRegistration]:
    """The fleet's registrations in the bucket now (`live_entries`: never part of them)."""
    kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)
    entries = await live_entries(kv, fleet)
    return {key: replicas.decode(fleet, key, e.value or b"") for key, e in entries.items()}


async def until_keys(bus: Bus, fleet: str, want: set[str], what: str) -> dict[str, Any]:
    """Wait until the fleet's keys are exactly ``want``; the bucket as the check that passed
    read it (a second read could see a later change)."""
    seen: dict[str, ReplicaRegistration] = {}

    async def check() -> bool:
        nonlocal seen
        seen = await bucket(bus, fleet)
        return set(seen) == want

    await eventually(check, 20, what=what, interval_s=0.1)
    return seen


async def slice_warnings(core: client.CoreV1Api, ns: str, name: str) -> list[client.CoreV1Event]:
    events = await core.list_namespaced_event(ns)
    return [
        e
        for e in events.items
        if e.involved_object.kind == "EndpointSlice" and e.involved_object.name == name
    ]


def sync_of(b: BridgeService) -> ReplicaSync:
    assert b.replicas is not None
    return b.replicas


def refused(sync: ReplicaSync, reason: str) -> float:
    return float(sync.slices_refused_total.labels(reason)._value.get())


@contextlib.asynccontextmanager
async def shipped_bridge(
    kube: KubeApiServer, auth_url: str, unique: str, tmp_path: Path, **kw: Any
) -> AsyncIterator[BridgeService]:
    """The bridge under its shipped user, registering replicas (no CRs, no inventory)."""
    with contextlib.suppress(Exception):
        seed.namespace(kube, SYSTEM)
    async with bridge(
        kube, auth_url, unique, tmp_path, user="k8s-bridge", policy_key="",
        publish_inventory=False, **kw,
    ) as b:  # fmt: skip
        yield b


async def test_a_slice_registers_only_in_a_tenants_namespace_under_that_tenants_key(
    kube_api: KubeApiServer,
    admin: Bus,
    auth_url: str,
    unique: str,
    tmp_path: Path,
    k8s: client.ApiClient,
    discovery: client.DiscoveryV1Api,
) -> None:
    fleet = f"f{unique}"
    acme, rogue = f"acme-{unique}", f"rogue-{unique}"
    seed.namespace(kube_api, acme, labels={"seedance.io/tenant": "acme"})
    seed.namespace(kube_api, rogue)  # bound to no tenant, listed nowhere
    core = client.CoreV1Api(k8s)
    async with shipped_bridge(kube_api, auth_url, unique, tmp_path) as b:
        await create_slice(discovery, rogue, "rogue", fleet, endpoint("r-0", "10.6.6.6", rogue))
        await create_slice(discovery, acme, "triton", fleet, endpoint("t-0", "10.0.0.1", acme))
        key = f"{fleet}.acme.echo.{acme}_t-0"
        got = await until_keys(admin, fleet, {key}, "acme's replica registered, the rogue's not")
        assert got[key].owner == "acme"
        assert got[key].address == "10.0.0.1:8001"
        assert got[key] == replicas.decode(fleet, key, replicas.encode(got[key]))

        # The rogue slice: one Warning Event on it, counted once.
        async def warned() -> bool:
            return bool(await slice_warnings(core, rogue, "rogue"))

        await eventually(warned, 20, what="the rogue slice's Warning Event")
        (event,) = await slice_warnings(core, rogue, "rogue")
        assert event.type == "Warning"
        assert event.reason == "ReplicaRefused"
        assert rogue in event.message
        assert "no tenant" in event.message
        assert refused(sync_of(b), "namespace_unbound") == 1

        # The namespace bound to a tenant later: its slice registers then, under that tenant.
        ns = await core.read_namespace(rogue)
        ns.metadata.labels = {"seedance.io/tenant": "globex"}
        await core.replace_namespace(rogue, ns)
        await until_keys(
            admin, fleet, {key, f"{fleet}.globex.echo.{rogue}_r-0"}, "globex's replica"
        )


async def test_the_operators_shared_namespaces_register_into_the_shared_pool(
    kube_api: KubeApiServer,
    admin: Bus,
    auth_url: str,
    unique: str,
    tmp_path: Path,
    discovery: client.DiscoveryV1Api,
) -> None:
    fleet = f"f{unique}"
    shared = f"inference-{unique}"
    seed.namespace(kube_api, shared)
    async with shipped_bridge(
        kube_api, auth_url, unique, tmp_path, shared_namespaces=f"other,{shared}"
    ):
        await create_slice(discovery, shared, "triton", fleet, endpoint("t-0", "10.0.0.1", shared))
        key = f"{fleet}.echo.{shared}_t-0"
        got = await until_keys(admin, fleet, {key}, "the shared replica registered")
        assert got[key].owner == ""
        assert key == routing.replica_key(fleet, "echo", f"{shared}_t-0")


async def test_slices_the_bridge_cannot_take_are_reported_once_and_skipped(
    kube_api: KubeApiServer,
    admin: Bus,
    auth_url: str,
    unique: str,
    tmp_path: Path,
    k8s: client.ApiClient,
    discovery: client.DiscoveryV1Api,
) -> None:
    fleet = f"f{unique}"
    ns = f"acme-{unique}"
    seed.namespace(kube_api, ns, labels={"seedance.io/tenant": "acme"})
    core = client.CoreV1Api(k8s)
    bad = {
        "no-ref": endpoint(None, "10.0.0.3", ns),
        "elsewhere": endpoint("t-9", "10.0.0.4", "kube-system"),
        "not-a-pod": endpoint("triton", "10.0.0.5", ns, kind="Service"),
    }
    async with shipped_bridge(kube_api, auth_url, unique, tmp_path) as b:
        for name, ep in bad.items():
            await create_slice(discovery, ns, name, fleet, ep)
        # A dotted pod name (legal in Kubernetes) registers; so does a plain one beside it.
        await create_slice(
            discovery, ns, "good", fleet,
            endpoint("triton.v2-0", "10.0.0.1", ns), endpoint("t-0", "10.0.0.2", ns),
        )  # fmt: skip
        want = {f"{fleet}.acme.echo.{ns}_triton_v2-0", f"{fleet}.acme.echo.{ns}_t-0"}
        await until_keys(admin, fleet, want, "the good slice's replicas")

        async def all_warned() -> bool:
            return all([await slice_warnings(core, ns, name) for name in bad])

        await eventually(all_warned, 20, what="a Warning Event on each bad slice")
        sync = sync_of(b)
        counts = {r: refused(sync, r) for r in ("no_target", "target_elsewhere", "not_a_pod")}
        assert counts == {"no_target": 1, "target_elsewhere": 1, "not_a_pod": 1}

        # Later passes (another slice comes) report nothing again and retry nothing.
        await create_slice(discovery, ns, "later", fleet, endpoint("t-1", "10.0.0.6", ns))
        await until_keys(admin, fleet, want | {f"{fleet}.acme.echo.{ns}_t-1"}, "the later one")
        assert {r: refused(sync, r) for r in counts} == counts
        for name in bad:
            assert len(await slice_warnings(core, ns, name)) == 1, name
        assert sync.passes_total.labels("retry")._value.get() == 0
        assert sync.writes_total.labels("put", "retry")._value.get() == 0
