"""Allocate honours the slicer: a kubelet-side client of ours speaks the device-plugin gRPC to
the node agent's plugin over a real unix socket; the pod is found through the test API server
(kubernetes_asyncio over real HTTP) and verified against the slicer's placements read from a
real nats-server (published as the slicer publishes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes_asyncio import client, config

from seedance.events.base import new_event_id
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    ShareChanged,
    ShareChangeReason,
)
from seedance.events.subjects import slicing
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.placement import ANNOTATION_PLACEMENT, NodeDevices
from seedance.node_agent.deviceplugin import DevicePluginServer, PluginDevice, api_pb2, api_pb2_grpc
from seedance.node_agent.deviceplugin.devices import DeviceKind
from seedance.node_agent.kube import NodePods
from seedance.node_agent.placements import PlacementFeed
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.waits import eventually, stop_task

pytestmark = pytest.mark.integration

NODE = "gpu-1.example"
TOKEN = "gpu-1:example"
UUIDS = {i: f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(4)}
MIG_UUID = "MIG-11111111-2222-3333-4444-555555555555"
DEVICES = NodeDevices(gpus=UUIDS, mig={(UUIDS[3], "3g.71gb", 4): MIG_UUID})
T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


@pytest.fixture
def sock_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="na-")  # a unix socket path must fit in 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def kube_api(tmp_path: Path) -> AsyncIterator[tuple[KubeApiServer, client.ApiClient]]:
    """The test API server with the team's namespace and the node, and a client of it."""
    async with KubeApiServer(KubeApiSettings()) as api:
        cfg = client.Configuration()
        await config.load_kube_config(
            config_file=str(api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg
        )
        async with client.ApiClient(configuration=cfg) as api_client:
            seed.namespace(api, "team-a")
            # No nvidia.com/gpu allocatable yet: the kubelet counts a resource's devices once a
            # plugin serving it registered, and the agent under test is that plugin (a count
            # here before it registers is another plugin's: the agent refuses to start).
            seed.node(api, NODE)
            yield api, api_client


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[tuple[KubeApiServer, client.ApiClient]]:
    async with kube_api(tmp_path) as pair:
        yield pair


def placement(job_id: str, kind: PlacementKind, gpus: list[GpuAssignment], **kw: Any) -> Placement:
    return Placement(
        id=new_event_id(),
        at=T0,
        job_id=job_id,
        tenant="acme",
        node=TOKEN,
        kind=kind,
        gpus=gpus,
        **kw,
    )


def annotation(
    uid: str, ev: Placement, *, gpus: list[GpuAssignment] | None = None, mem: int = 0, **over: Any
) -> str:
    """The document the bridge writes (seedance.k8s_bridge.core.kube.placement_annotation)."""
    doc = {
        "version": 1,
        "podUid": uid,
        "jobId": ev.job_id,
        "tenant": ev.tenant,
        "node": ev.node,
        "kind": ev.kind.value,
        "gpuModel": "H200",
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "milli": g.milli,
                "migProfile": g.mig_profile,
                "migStartSlot": g.mig_start_slot,
            }
            for g in (ev.gpus if gpus is None else gpus)
        ],
        "gpuMemoryMib": mem,
        "placementId": ev.id,
        "boundAt": "2026-12-02T01:00:00.000000Z",
    }
    doc.update(over)
    return json.dumps(doc)


async def bound_pod(
    api: KubeApiServer,
    api_client: client.ApiClient,
    name: str,
    resources: dict[str, str],
    annotate: Any,
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> str:
    """A pod created, then bound to NODE with its annotation in the Binding (as the bridge does);
    its one container ``main`` asks for ``resources``, or its containers are ``spec``'s."""
    container = {
        "name": "main",
        "image": "registry.example/job:1",
        "resources": {"limits": resources, "requests": resources},
    }
    pod = seed.pod(
        api,
        "team-a",
        name,
        scheduler_name="seedance",
        labels=labels,
        extra_spec=spec or {"containers": [container]},
    )
    uid = str(pod["metadata"]["uid"])
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "annotations": {ANNOTATION_PLACEMENT: annotate(uid)},
        },
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
    }
    core = client.CoreV1Api(api_client)
    resp = await core.create_namespaced_pod_binding(name, "team-a", body, _preload_content=False)
    assert resp.status == 201
    resp.release()
    return uid


@contextlib.asynccontextmanager
async def node_agent(
    bus: Any, api_client: client.ApiClient, sock_dir: str, resource: str, count: int
) -> AsyncIterator[tuple[PlacementFeed, api_pb2_grpc.DevicePluginStub]]:
    """The feed, the allocator and one plugin for ``resource`` advertising ``count`` devices;
    yields the feed and a kubelet-side stub dialled over the plugin's unix socket."""
    feed = PlacementFeed(bus, NODE)
    await feed.start()
    task = asyncio.create_task(feed.run())
    allocator = PlacementAllocator(
        node=NODE,
        book=feed.book,
        pending=NodePods(api_client, NODE).pending,
        devices=lambda: DEVICES,
    )
    devices = [
        PluginDevice(id=f"d{i}", kind=DeviceKind.WHOLE_GPU, uuid=f"x{i}", gpu_uuid=f"x{i}")
        for i in range(count)
    ]
    sock = os.path.join(sock_dir, "plugin.sock")
    server = DevicePluginServer(
        resource_name=resource, socket_path=sock, devices=devices, allocate=allocator.allocate
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
            yield feed, api_pb2_grpc.DevicePluginStub(channel)
    finally:
        await server.stop()
        await stop_task(task)  # it reads the bus: one cancel can be lost
        await feed.close()


async def allocate(stub: api_pb2_grpc.DevicePluginStub, n: int, first: int = 0) -> dict[str, str]:
    """One Allocate of ``n`` devices, IDs ``d<first>``...: as the kubelet, which hands out only
    IDs it has not recorded for another container (the same IDs again mean it dropped the
    earlier answer)."""
    resp = await stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(
                    devices_ids=[f"d{i}" for i in range(first, first + n)]
                )
            ]
        ),
        timeout=10.0,
    )
    (container,) = resp.container_responses
    return dict(container.envs)


async def refused(stub: api_pb2_grpc.DevicePluginStub, n: int, first: int = 0) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await allocate(stub, n, first)
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    return str(err.value.details())


async def publish(bus: Any, ev: Placement | JobReleased) -> None:
    await bus.publish(
        slicing.subject(ev.tenant, "placement" if isinstance(ev, Placement) else "released"), ev
    )


async def shared_pod_placed(
    bus: Any, api: KubeApiServer, api_client: client.ApiClient, feed: Any, name: str
) -> Placement:
    """A pod asking a quarter of GPU 2 and 20 GiB, bound with the slicer's shared placement on
    that GPU, the placement published and in the agent's book."""

    def shared(uid: str) -> str:
        held["ev"] = placement(
            uid, PlacementKind.SHARED, [GpuAssignment(index=2, uuid=UUIDS[2], milli=250)]
        )
        return annotation(uid, held["ev"], mem=20480)

    held: dict[str, Placement] = {}
    res = {"seedance.io/gpu-milli": "250", "seedance.io/gpu-memory-mib": "20480"}
    await bound_pod(api, api_client, name, res, shared)
    ev = held["ev"]
    await publish(bus, ev)
    await eventually(lambda: feed.book.get("acme", ev.job_id) is not None)
    return ev


async def test_whole_gpus_get_exactly_the_slicers_uuids_and_a_forged_claim_is_refused(
    bus: Any, kube: tuple[KubeApiServer, client.ApiClient], sock_dir: str
) -> None:
    api, api_client = kube
    pod_uid: dict[str, str] = {}
    # The slicer's placement names the job by the pod's UID (the bridge's identity for a pod).
    async with node_agent(bus, api_client, sock_dir, "nvidia.com/gpu", 4) as (feed, stub):
        # Pod a: placed by the slicer on GPUs 1 and 2.
        holder: dict[str, Placement] = {}

        def claim_a(uid: str) -> str:
            ev = placement(
                uid,
                PlacementKind.WHOLE,
                [GpuAssignment(index=1, uuid=UUIDS[1]), GpuAssignment(index=2, uuid=UUIDS[2])],
            )
            holder["a"] = ev
            return annotation(uid, ev)

        pod_uid["a"] = await bound_pod(api, api_client, "a", {"nvidia.com/gpu": "2"}, claim_a)
        # Before the slicer's placement is on the bus, the claim alone is not honoured.
        assert "holds no placement" in await refused(stub, 2)
        await publish(bus, holder["a"])
        await eventually(
            lambda: feed.book.get("acme", pod_uid["a"]) is not None, what="placement read"
        )
        envs = await allocate(stub, 2)
        assert envs == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[1]},{UUIDS[2]}"}
        assert "no pending pod" in await refused(stub, 2, first=2)  # a is allocated once

        # Pod b forges an annotation naming GPUs 0 and 3 under a placement that is not its own.
        def forged(uid: str) -> str:
            return annotation(uid, holder["a"], jobId=uid)

        await bound_pod(api, api_client, "b", {"nvidia.com/gpu": "2"}, forged)
        assert "holds no placement of pod" in await refused(stub, 2, first=2)


async def test_a_stale_or_altered_placement_is_refused_with_the_reason(
    bus: Any, kube: tuple[KubeApiServer, client.ApiClient], sock_dir: str
) -> None:
    api, api_client = kube
    async with node_agent(bus, api_client, sock_dir, "nvidia.com/gpu", 4) as (feed, stub):
        old: dict[str, Placement] = {}

        def stale(uid: str) -> str:
            old["ev"] = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=0, uuid=UUIDS[0])])
            return annotation(uid, old["ev"])

        uid = await bound_pod(api, api_client, "s", {"nvidia.com/gpu": "1"}, stale)
        # The slicer placed the job again (a newer placement): the pod's annotation is stale.
        newer = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=3, uuid=UUIDS[3])])
        await publish(bus, old["ev"])
        await publish(bus, newer)
        await eventually(lambda: (p := feed.book.get("acme", uid)) is not None and p.id == newer.id)
        assert f"stale placement {old['ev'].id}" in await refused(stub, 1)
        # Released: no placement at all.
        await publish(
            bus,
            JobReleased(
                id=new_event_id(), at=T0, job_id=uid, tenant="acme", outcome=EndOutcome.FINISHED
            ),
        )
        await eventually(lambda: feed.book.get("acme", uid) is None, what="release read")
        assert "holds no placement" in await refused(stub, 1)
    # The kubelet gives up on it; the oldest pending pod is the one Allocate means (HAMi's rule).
    api.api.delete(api.api.resolve("", "v1", "pods"), "team-a", "s")

    async with node_agent(bus, api_client, sock_dir, "nvidia.com/gpu", 4) as (feed, stub):
        held: dict[str, Placement] = {}

        def altered(uid: str) -> str:
            held["ev"] = placement(
                uid, PlacementKind.WHOLE, [GpuAssignment(index=0, uuid=UUIDS[0])]
            )
            # The tenant edits its annotation to a better GPU under the same placement id.
            return annotation(uid, held["ev"], gpus=[GpuAssignment(index=2, uuid=UUIDS[2])])

        await bound_pod(api, api_client, "t", {"nvidia.com/gpu": "1"}, altered)
        await publish(bus, held["ev"])
        # A fresh agent rebuilds its book from the stream (the earlier placements included).
        await eventually(lambda: feed.book.get("acme", held["ev"].job_id) is not None)
        assert "differ from the slicer's" in await refused(stub, 1)


async def test_a_right_sized_memory_limit_is_the_next_allocates_and_a_rollback_restores_it(
    bus: Any, kube: tuple[KubeApiServer, client.ApiClient], sock_dir: str
) -> None:
    """The slicer's right-sizing lowers a shared job's share and memory limit (250 milli, 20 GiB
    asked, to 100 milli and its measured peak plus headroom): an Allocate of the pod after it
    (the kubelet asks for the pod's 250 devices; the same IDs again: it dropped its earlier
    answer) gets both limits; after the rollback, the request's again."""
    api, api_client = kube
    async with node_agent(bus, api_client, sock_dir, "seedance.io/gpu-milli", 1000) as (feed, stub):
        ev = await shared_pod_placed(bus, api, api_client, feed, "rs")

        async def changed(frm: int, to: int, mem: int) -> None:
            reason = ShareChangeReason.RIGHTSIZED if to < frm else ShareChangeReason.ROLLED_BACK
            change = ShareChanged(
                id=new_event_id(), at=T0, job_id=ev.job_id, tenant="acme", node=TOKEN,
                gpu_index=2, from_milli=frm, to_milli=to, reason=reason, mem_limit_mib=mem,
            )  # fmt: skip
            await bus.publish(slicing.subject("acme", "share"), change)
            await eventually(lambda: feed.book.share_of("acme", ev.job_id) == to, what="read")

        await changed(250, 100, 12_390)
        assert await allocate(stub, 250) == {
            "NVIDIA_VISIBLE_DEVICES": UUIDS[2],
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "10",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=12390M",
        }
        await changed(100, 250, 0)
        envs = await allocate(stub, 250)
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"


async def test_shared_gpu_gets_mps_limits_and_mig_gets_the_instance_uuid(
    bus: Any, kube: tuple[KubeApiServer, client.ApiClient], sock_dir: str
) -> None:
    api, api_client = kube
    async with node_agent(bus, api_client, sock_dir, "seedance.io/gpu-milli", 1000) as (feed, stub):
        await shared_pod_placed(bus, api, api_client, feed, "sh")
        assert await allocate(stub, 250) == {
            "NVIDIA_VISIBLE_DEVICES": UUIDS[2],
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20480M",
        }

    held: dict[str, Placement] = {}
    async with node_agent(bus, api_client, sock_dir, "nvidia.com/mig-3g.71gb", 7) as (feed, stub):

        def mig(slot: int) -> Any:
            def claim(uid: str) -> str:
                held[str(slot)] = placement(
                    uid,
                    PlacementKind.MIG,
                    [
                        GpuAssignment(
                            index=3, uuid=UUIDS[3], mig_profile="3g.71gb", mig_start_slot=slot
                        )
                    ],
                )
                return annotation(uid, held[str(slot)])

            return claim

        await bound_pod(api, api_client, "m4", {"nvidia.com/mig-3g.71gb": "1"}, mig(4))
        await publish(bus, held["4"])
        await eventually(lambda: feed.book.get("acme", held["4"].job_id) is not None)
        assert await allocate(stub, 1) == {"NVIDIA_VISIBLE_DEVICES": MIG_UUID}
        # A MIG instance the plan has not created yet: refused, never another instance.
        await bound_pod(api, api_client, "m0", {"nvidia.com/mig-3g.71gb": "1"}, mig(0))
        await publish(bus, held["0"])
        await eventually(lambda: feed.book.get("acme", held["0"].job_id) is not None)
        assert "no MIG instance 3g.71gb at slot 0" in await refused(stub, 1, first=1)
