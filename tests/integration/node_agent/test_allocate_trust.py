"""Allocate never trusts what a tenant can write (issue 27): the node agent runs as its shipped
NATS user on the shipped-auth server, the slicer's placements are published under the
slicer's shipped user, pods live in the test API server (over HTTP), and a test kubelet
(``kubelet.DeviceManager``) admits pods through the agent's device plugin over real unix
sockets, records their devices only after Allocate returns, serves pod-resources ``List`` from
those records, and calls PreStartContainer before each container start, as the real one does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from seedance.core import Bus
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import replica_consumer
from seedance.testing.identities import as_user
from seedance.testing.kube_api import seed
from seedance.testing.waits import eventually
from tests.integration.node_agent import test_service
from tests.integration.node_agent.agent import MERGED, merged, slicer_bus
from tests.integration.node_agent.kubelet import DeviceManager
from tests.integration.node_agent.test_allocation import (
    NODE,
    TOKEN,
    UUIDS,
    annotation,
    bound_pod,
    kube_api,
    placement,
    publish,
)
from tests.integration.node_agent.test_deviceplugin import FakeKubelet
from tests.integration.node_agent.test_service import GPU_SOCKET, Agent, agent_on, metric_line

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
plugin_dir = test_service.plugin_dir
kubelet = test_service.kubelet


@contextlib.asynccontextmanager
async def node_under_test(
    auth_url: str, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> AsyncIterator[tuple[Agent, DeviceManager, Bus]]:
    """The agent under its shipped user, the test kubelet's device manager and pod-resources
    socket, and the slicer's bus connection (its shipped user) to publish placements with."""
    sock_dir = tempfile.mkdtemp(prefix="prt-")  # a unix socket path must stay short
    devices = DeviceManager(plugin_dir, os.path.join(sock_dir, "kubelet.sock"))
    await devices.serve()
    try:
        async with slicer_bus(auth_url) as slicer, kube_api(tmp_path) as (api, api_client):
            seed.namespace(api, "team-b")
            async with agent_on(
                api,
                api_client,
                auth_url,
                slicer,
                kubelet,
                plugin_dir,
                tmp_path,
                pod_resources_socket=devices.socket,
                bus_settings=as_user(auth_url, "node-agent"),
            ) as agent:
                yield agent, devices, slicer
    finally:
        await devices.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


async def victim_on_gpu_1(a: Agent, slicer: Bus, auth_url: str) -> tuple[str, Placement]:
    """Pod v of team-a, bound by the bridge with the slicer's placement of GPU 1 (published),
    once the agent's reader was sent that placement."""
    held: dict[str, Placement] = {}

    def claim(uid: str) -> str:
        held["ev"] = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=1, uuid=UUIDS[1])])
        return annotation(uid, held["ev"])

    uid = await bound_pod(a.api, a.api_client, "v", {GPU: "1"}, claim)
    await publish(slicer, held["ev"])
    await sent_to_the_agent(auth_url, held["ev"])
    return uid, held["ev"]


async def sent_to_the_agent(auth_url: str, ev: Placement) -> None:
    """Until the agent's reader of the ledger's merged input (``node-agent-in-<node>``, no acks)
    was sent ``ev``: the server's fact. The agent's count of placements is no such fact: it
    counts every live placement the session's server holds for the node, earlier tests' too
    (this wait was a count of 1, failed whenever one of them had run first); what the agent
    was sent and has not applied yet, an Allocate waits for (``placement_wait_s``)."""
    reader = replica_consumer("node-agent-in", TOKEN.replace(":", "-")).durable
    admin = await Bus.connect(as_user(auth_url, "admin"))
    try:
        seq = await merged(admin.js, ev)

        async def sent() -> bool:
            info = await admin.js.consumer_info(MERGED, reader)
            return bool(info.delivered.stream_seq >= seq)

        await eventually(sent, what=f"placement {ev.id} sent to the agent")
    finally:
        await admin.close()


async def test_a_pod_created_on_the_node_never_starts_on_the_victims_gpu(
    auth_url: str, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> None:
    async with node_under_test(auth_url, kubelet, plugin_dir, tmp_path) as (a, devices, slicer):
        v, ev = await victim_on_gpu_1(a, slicer, auth_url)
        # Team b creates pod r on the node itself (spec.nodeName preset, no Binding: no
        # admission policy in this API server), asking for one GPU, and writes what a tenant
        # can: a gang label and a copy of v's claim under its own UID.
        core = client.CoreV1Api(a.api_client)
        container = {
            "name": "main",
            "image": "registry.example/job:1",
            "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
        }
        body = {
            "metadata": {"name": "r", "labels": {"seedance.io/pod-group": "g"}},
            "spec": {"nodeName": NODE, "schedulerName": "seedance", "containers": [container]},
        }
        created = await core.create_namespaced_pod("team-b", body)
        r = created.metadata.uid
        forged = {
            "metadata": {
                "annotations": {
                    "seedance.io/placement": annotation(
                        r, ev, gang={"name": "g", "members": [r]}, boundAt="1970-01-01T00:00:00Z"
                    )
                }
            }
        }
        await core.patch_namespaced_pod("r", "team-b", forged)

        # The kubelet admits r first. Its Allocate names no pod: whatever it is answered, the
        # kubelet records the IDs as r's only now.
        assert await devices.admit("team-b", "r", GPU_SOCKET, GPU, 1) is None
        # Then v: granted its own GPU, the slicer's placement.
        assert await devices.admit("team-a", "v", GPU_SOCKET, GPU, 1) is None
        assert devices.pods[("team-a", "v")].envs[("main", GPU)] == {
            "NVIDIA_VISIBLE_DEVICES": UUIDS[1]
        }
        # r's container never starts on devices Seedance did not grant it; v's does.
        refused = await devices.start("team-b", "r", GPU_SOCKET, GPU)
        assert refused is not None
        assert "pod team-b/r holds nvidia.com/gpu devices" in refused
        assert "that Seedance did not grant it" in refused
        assert await devices.start("team-a", "v", GPU_SOCKET, GPU) is None

        # r's owner is told why, on r itself: a Warning Event naming the pod it was meant for.
        async def told() -> list[Any]:
            events = await core.list_namespaced_event("team-b")
            return [e for e in events.items if e.reason == "SeedanceDevicesRefused"]

        await eventually(told, what="the refusal's Event on r")
        (event,) = await told()
        assert (event.involved_object.name, event.type) == ("r", "Warning")
        assert "answered for pod team-a/v" in event.message
        for line in (
            'seedance_node_agent_allocation_confirmations_total{outcome="mismatched",'
            f'resource="{GPU}"}} 1.0',
            'seedance_node_agent_allocation_confirmations_total{outcome="confirmed",'
            f'resource="{GPU}"}} 1.0',
            f'seedance_node_agent_container_starts_total{{outcome="refused",resource="{GPU}"}} 1.0',
            f'seedance_node_agent_container_starts_total{{outcome="allowed",resource="{GPU}"}} 1.0',
        ):
            assert await metric_line(a, line), line
        assert v != r


async def test_an_older_pod_with_a_forged_claim_cannot_fail_the_victims_allocate(
    auth_url: str, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> None:
    async with node_under_test(auth_url, kubelet, plugin_dir, tmp_path) as (a, devices, slicer):
        # Pod s, bound before v, claims a placement of its job the slicer has since replaced
        # (a stale placement id), and dates itself 1970 in the annotation's boundAt.
        held: dict[str, Any] = {}

        def stale(uid: str) -> str:
            held["old"] = placement(
                uid, PlacementKind.WHOLE, [GpuAssignment(index=0, uuid=UUIDS[0])]
            )
            return annotation(uid, held["old"], boundAt="1970-01-01T00:00:00.000000Z")

        s = await bound_pod(a.api, a.api_client, "s", {GPU: "1"}, stale)
        await publish(slicer, held["old"])
        newer = placement(s, PlacementKind.WHOLE, [GpuAssignment(index=2, uuid=UUIDS[2])])
        await publish(slicer, newer)
        _v, _ev = await victim_on_gpu_1(a, slicer, auth_url)
        pods = await client.CoreV1Api(a.api_client).list_namespaced_pod("team-a")
        scheduled = {
            p.metadata.name: next(c.last_transition_time for c in p.status.conditions)
            for p in pods.items
        }
        assert scheduled["s"] <= scheduled["v"]  # s is the older by the API server's times
        # The kubelet admits v: its Allocate is not refused for s's broken claim.
        assert await devices.admit("team-a", "v", GPU_SOCKET, GPU, 1) is None
        assert devices.pods[("team-a", "v")].envs[("main", GPU)] == {
            "NVIDIA_VISIBLE_DEVICES": UUIDS[1]
        }
        assert await devices.start("team-a", "v", GPU_SOCKET, GPU) is None
        # s's own Allocate is refused with its reason; it never gets a device.
        refusal = await devices.admit("team-a", "s", GPU_SOCKET, GPU, 1)
        assert refusal is not None
        assert f"stale placement {held['old'].id}" in refusal
        assert json.loads(json.dumps(sorted(devices.pods))) == [["team-a", "v"]]
