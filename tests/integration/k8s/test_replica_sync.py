"""The bridge registers the router's replicas from EndpointSlices: slices created, changed
(an endpoint added, not ready, terminating, removed) and deleted over HTTP as the EndpointSlice
controller would, and the ``seedance-router-replicas`` bucket follows; a restart re-lists and
prunes; a standby writes nothing; an operator's keys are left alone.

Real nats-server, the test API server over HTTP (EndpointSlices validated against the 1.33
schemas), the bridge through kubernetes_asyncio.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes_asyncio import client

from seedance.core import Bus
from seedance.core.kv import ensure_bucket, live_entries
from seedance.events import replicas
from seedance.events.replicas import ReplicaRegistration
from seedance.events.subjects import routing
from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.kube import USER_AGENT
from seedance.k8s_bridge.replica_sync import ReplicaSync
from seedance.k8s_bridge.service import BridgeService
from seedance.testing.kube_api import seed
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import SYSTEM, Env, bridge

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def discovery(k8s: client.ApiClient) -> client.DiscoveryV1Api:
    return client.DiscoveryV1Api(k8s)


def endpoint(pod: str, ip: str, *, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    # targetRef without a namespace: the slice's own (the controller writes it; the same).
    return {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready, "terminating": terminating},
        "targetRef": {"kind": "Pod", "name": pod},
    }


def slice_body(
    name: str,
    fleet: str,
    endpoints: list[dict[str, Any]],
    *,
    model: str | None = "echo",
    port_name: str = "grpc",
) -> dict[str, Any]:
    """An EndpointSlice as the controller writes it for a Service labelled with the model and
    the fleet (it copies the Service's labels)."""
    labels = {"kubernetes.io/service-name": "triton", "seedance.io/router-fleet": fleet}
    if model is not None:
        labels["seedance.io/model"] = model
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": labels},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": port_name, "port": 8001, "protocol": "TCP"}],
    }  # fmt: skip


async def create(discovery: client.DiscoveryV1Api, ns: str, body: dict[str, Any]) -> None:
    resp = await discovery.create_namespaced_endpoint_slice(ns, body, _preload_content=False)
    assert resp.status == 201, await resp.text()


async def set_endpoints(
    discovery: client.DiscoveryV1Api, ns: str, name: str, endpoints: list[dict[str, Any]]
) -> None:
    resp = await discovery.patch_namespaced_endpoint_slice(
        name, ns, {"endpoints": endpoints}, _preload_content=False,
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert resp.status == 200, await resp.text()


async def delete(discovery: client.DiscoveryV1Api, ns: str, name: str) -> None:
    resp = await discovery.delete_namespaced_endpoint_slice(name, ns, _preload_content=False)
    assert resp.status == 200, await resp.text()


async def bucket(bus: Bus, fleet: str) -> dict[str, ReplicaRegistration]:
    """The fleet's registrations in the bucket now (`live_entries`: never part of them)."""
    kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)
    entries = await live_entries(kv, fleet)
    return {key: replicas.decode(fleet, key, e.value or b"") for key, e in entries.items()}


def pod_of(r: ReplicaRegistration) -> str:
    """The pod of a registration the bridge wrote (``<namespace>_<pod>``); others' as named."""
    return r.replica.split("_", 1)[1] if r.registrar else r.replica


async def until_bucket(
    bus: Bus, fleet: str, want: dict[str, tuple[str, bool]], what: str
) -> dict[str, ReplicaRegistration]:
    """Wait until the fleet's keys are exactly ``want`` (pod -> (address, ready)); the
    registrations the check saw (a second read could differ from it)."""
    seen: dict[str, ReplicaRegistration] = {}

    async def check() -> bool:
        seen.clear()
        seen.update(await bucket(bus, fleet))
        return {pod_of(r): (r.address, r.ready) for r in seen.values()} == want

    await eventually(check, 20, what=what, interval_s=0.1)
    return seen


def sync_of(b: BridgeService) -> ReplicaSync:
    assert b.replicas is not None
    return b.replicas


async def test_slices_created_changed_and_deleted_are_the_bucket(
    env: Env, discovery: client.DiscoveryV1Api
) -> None:
    fleet = f"f{env.unique}"
    kv = await ensure_bucket(env.bus, routing.REPLICAS_BUCKET)
    # An operator's registration in the same fleet: not the bridge's to prune.
    manual = ReplicaRegistration(model="echo", replica="manual", address="10.9.9.9:8001")
    await kv.put(routing.replica_key(fleet, "echo", "manual"), replicas.encode(manual))
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b:
        await create(
            discovery,
            env.ns,
            slice_body("triton-a", fleet, [endpoint("t-0", "10.0.0.1"),
                                           endpoint("t-1", "10.0.0.2", ready=False)]),
        )  # fmt: skip
        got = await until_bucket(
            env.bus,
            fleet,
            {"manual": ("10.9.9.9:8001", True), "t-0": ("10.0.0.1:8001", True),
             "t-1": ("10.0.0.2:8001", False)},
            "the slice's endpoints registered, the not-ready one out of traffic",
        )  # fmt: skip
        registrar = f"k8s-bridge/{SYSTEM}/bridge-{env.unique}"
        # the namespace's tenant's own replica
        own = got[routing.replica_key(fleet, "echo", f"{env.ns}_t-0", env.tenant)]
        assert (own.registrar, own.owner) == (registrar, env.tenant)
        assert got[routing.replica_key(fleet, "echo", "manual")].registrar == ""

        # t-1 becomes ready, t-0 starts terminating, a second slice of the Service adds t-2.
        await set_endpoints(
            discovery, env.ns, "triton-a",
            [endpoint("t-0", "10.0.0.1", ready=False, terminating=True),
             endpoint("t-1", "10.0.0.2")],
        )  # fmt: skip
        await create(
            discovery, env.ns, slice_body("triton-b", fleet, [endpoint("t-2", "10.0.0.3")])
        )
        await until_bucket(
            env.bus,
            fleet,
            {"manual": ("10.9.9.9:8001", True), "t-0": ("10.0.0.1:8001", False),
             "t-1": ("10.0.0.2:8001", True), "t-2": ("10.0.0.3:8001", True)},
            "readiness flipped, terminating out of traffic, the second slice added",
        )  # fmt: skip

        # A slice without the model label is not watched; one without the grpc port is refused
        # (counted), and neither disturbs the others.
        await create(
            discovery, env.ns, slice_body("plain", fleet, [endpoint("p", "10.0.1.1")], model=None)
        )
        await create(
            discovery, env.ns,
            slice_body("http-only", fleet, [endpoint("h", "10.0.1.2")], port_name="http"),
        )  # fmt: skip
        sync = sync_of(b)
        await eventually(lambda: sync.slice_problems._value.get() == 1, 10, what="problem counted")

        # t-0 leaves its slice; then the first slice goes altogether.
        await set_endpoints(discovery, env.ns, "triton-a", [endpoint("t-1", "10.0.0.2")])
        await until_bucket(
            env.bus,
            fleet,
            {"manual": ("10.9.9.9:8001", True), "t-1": ("10.0.0.2:8001", True),
             "t-2": ("10.0.0.3:8001", True)},
            "the removed endpoint deleted",
        )  # fmt: skip
        await delete(discovery, env.ns, "triton-a")
        await until_bucket(
            env.bus,
            fleet,
            {"manual": ("10.9.9.9:8001", True), "t-2": ("10.0.0.3:8001", True)},
            "the deleted slice's replicas deleted",
        )  # fmt: skip
        assert sync.writes_total.labels("delete", "ok")._value.get() == 2
    used = env.kube.verbs_used(user_agent=USER_AGENT)
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert used <= declared
    assert {("discovery.k8s.io", "endpointslices", v) for v in ("list", "watch")} <= used


async def test_a_restart_re_lists_and_prunes_what_went_while_no_bridge_ran(
    env: Env, discovery: client.DiscoveryV1Api
) -> None:
    fleet = f"f{env.unique}"
    await create(discovery, env.ns, slice_body("keep", fleet, [endpoint("k", "10.0.0.1")]))
    await create(discovery, env.ns, slice_body("drop", fleet, [endpoint("d", "10.0.0.2")]))
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path):
        await until_bucket(
            env.bus, fleet, {"k": ("10.0.0.1:8001", True), "d": ("10.0.0.2:8001", True)}, "both"
        )
    # No bridge runs: one slice goes, the other's pod moves.
    await delete(discovery, env.ns, "drop")
    await set_endpoints(discovery, env.ns, "keep", [endpoint("k", "10.0.0.7")])
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path, replica="b"):
        await until_bucket(
            env.bus, fleet, {"k": ("10.0.0.7:8001", True)}, "pruned and updated after the restart"
        )


async def test_a_standby_writes_nothing_until_it_leads(
    env: Env, discovery: client.DiscoveryV1Api
) -> None:
    fleet = f"f{env.unique}"
    lease_name = f"bridge-{env.unique}"
    lease = {
        "metadata": {"name": lease_name, "namespace": SYSTEM},
        "spec": {"holderIdentity": "elsewhere", "leaseDurationSeconds": 600,
                 "renewTime": "2026-12-02T00:00:00.000000Z"},
    }  # fmt: skip
    seed.create(env.kube, "coordination.k8s.io", "v1", "leases", lease, SYSTEM)
    await create(discovery, env.ns, slice_body("s", fleet, [endpoint("r", "10.0.0.1")]))
    async with bridge(
        env.kube, env.nats_url, env.unique, env.tmp_path, lease_duration_s=600, lease_renew_s=2
    ) as b:
        sync = sync_of(b)
        # It has seen the slice and would register it, but the Lease is another's.
        await eventually(
            lambda: sync.passes_total.labels("standby")._value.get() >= 1, 10, what="a pass"
        )
        assert [pod_of(r) for r in sync.changes().put.values()] == ["r"]
        assert not b.leading
        assert await bucket(env.bus, fleet) == {}
        # The holder releases the Lease: the bridge takes it and registers at once.
        rt = env.kube.api.resolve("coordination.k8s.io", "v1", "leases")
        held = copy.deepcopy(env.kube.api.get(rt, SYSTEM, lease_name))
        held["spec"]["holderIdentity"] = ""
        env.kube.api.update(rt, SYSTEM, lease_name, held)
        await until_bucket(env.bus, fleet, {"r": ("10.0.0.1:8001", True)}, "registered on leading")
        assert b.leading
