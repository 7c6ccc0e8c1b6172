"""Allocate per container, as the kubelet asks: pods as users write them (GPUs in two app
containers, only in an init container, in a native sidecar and the main container), each
container granted its own devices out of its pod's placement, in the order and with the device
IDs the kubelet's device manager uses (init containers first; a done init container's IDs
reused by the next containers), and kept across a restart of the agent between two of a pod's
Allocates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.core.placement import PodView
from seedance.node_agent.deviceplugin.devices import AllocationError
from seedance.node_agent.kube import pod_view
from tests.unit.node_agent.test_placement import DEVICES, NODE, book, placed, pod

GPU = "nvidia.com/gpu"


def ctr(name: str, gpus: str | None = None, **over: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}
    if gpus is not None:
        c["resources"] = {"limits": {GPU: gpus}}
    return {**c, **over}


TWO_APPS = {"containers": [ctr("trainer", "1"), ctr("eval", "1")]}
ENGINE_BUILD = {"initContainers": [ctr("build-engine", "1")], "containers": [ctr("serve")]}
SIDECAR = {
    "initContainers": [ctr("proxy", "1", restartPolicy="Always")],
    "containers": [ctr("main", "1")],
}
BUILD_THEN_TWO = {
    "initContainers": [ctr("build-engine", "2")],
    "containers": [ctr("serve", "1"), ctr("eval", "1")],
}


def whole(n: int) -> Placement:
    gpus = [GpuAssignment(index=i, uuid=DEVICES.gpus[i]) for i in range(n)]
    return placed("k8s:u1", PlacementKind.WHOLE, gpus)


def view(spec: dict[str, Any], ev: Placement, phase: str = "Pending", **status: Any) -> PodView:
    raw = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "u1"},
        "spec": {"nodeName": NODE, **spec},
        "status": {"phase": phase, **status},
    }
    # The bridge's annotation for the placement (as test_placement writes it).
    raw["metadata"]["annotations"] = dict(pod("u1", ev).annotations)
    return pod_view(raw)


def allocator(ev: Placement, *views: PodView) -> PlacementAllocator:
    async def pending() -> list[PodView]:
        return list(views)

    return PlacementAllocator(node=NODE, book=book(ev), pending=pending, devices=lambda: DEVICES)


async def visible(alloc: PlacementAllocator, ids: Sequence[str]) -> str:
    return (await alloc.allocate(GPU, ids)).envs["NVIDIA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(
    ("spec", "placed_gpus", "calls", "expected"),
    [
        # One Allocate per container asking for GPUs, with its own count (kubelet's order and
        # IDs; a done init container's IDs are handed to the next container: devicesToReuse).
        # placed_gpus: what the bridge asks the slicer for (request_of), as the kubelet counts.
        (TWO_APPS, 2, [["d0"], ["d1"]], ["GPU-a", "GPU-b"]),
        (ENGINE_BUILD, 1, [["d0"]], ["GPU-a"]),
        (SIDECAR, 2, [["d0"], ["d1"]], ["GPU-a", "GPU-b"]),
        (BUILD_THEN_TWO, 2, [["d0", "d1"], ["d0"], ["d1"]], ["GPU-a,GPU-b", "GPU-a", "GPU-b"]),
    ],
    ids=["two-app-containers", "engine-build-init", "native-sidecar", "init-reused-by-two"],
)
async def test_each_container_is_granted_its_own_devices_of_the_pods_placement(
    spec: dict[str, Any], placed_gpus: int, calls: list[list[str]], expected: list[str]
) -> None:
    ev = whole(placed_gpus)
    alloc = allocator(ev, view(spec, ev))
    assert [await visible(alloc, ids) for ids in calls] == expected
    # The pod holds exactly its placement, and no container of it is left to allocate.
    grant = alloc.allocations.granted("u1")
    assert grant is not None
    assert grant.uuids == tuple(g.uuid for g in ev.gpus)
    with pytest.raises(AllocationError, match="no pending pod"):
        await alloc.allocate(GPU, ["d9"])


async def test_an_init_containers_ids_handed_again_are_reuse_not_a_lost_answer() -> None:
    # download (init) gets d0; the sidecar reuses d0 once download is done; serve runs beside
    # the sidecar and gets a new ID: 2 GPUs in all, as the bridge counts it.
    spec = {
        "initContainers": [ctr("download", "1"), ctr("proxy", "1", restartPolicy="Always")],
        "containers": [ctr("serve", "1")],
    }
    ev = whole(2)
    alloc = allocator(ev, view(spec, ev))
    assert [await visible(alloc, ids) for ids in (["d0"], ["d0"], ["d1"])] == [
        "GPU-a",
        "GPU-a",
        "GPU-b",
    ]
    grant = alloc.allocations.granted("u1")
    assert grant is not None
    assert grant.uuids == ("GPU-a", "GPU-b")


async def test_a_pods_count_unlike_its_placement_is_refused() -> None:
    ev = whole(1)  # the pod asks for 2 in two containers; the placement holds 1
    alloc = allocator(ev, view(TWO_APPS, ev))
    with pytest.raises(
        AllocationError, match=r"asks for 2 nvidia\.com/gpu and the slicer placed 1"
    ):
        await alloc.allocate(GPU, ["d0"])
    assert alloc.allocations.granted("u1") is None


async def test_a_restart_between_a_pods_allocates_keeps_what_was_granted() -> None:
    ev = whole(2)
    first = allocator(ev, view(SIDECAR, ev))
    assert await visible(first, ["d0"]) == "GPU-a"  # the sidecar; then the agent restarts
    # The kubelet recorded the sidecar's IDs; the pod is Pending, no container started.
    rows = [ContainerDevices("ns", "u1", "proxy", GPU, ("d0",))]
    v = view(SIDECAR, ev)
    again = allocator(ev, v)
    (restored,) = again.restore([v], [GPU], rows)
    assert restored.result == first.allocations.granted("u1")
    assert await visible(again, ["d1"]) == "GPU-b"  # the main container: the other GPU
    with pytest.raises(AllocationError, match="no pending pod"):
        await again.allocate(GPU, ["d2"])  # no container of it is left


async def test_containers_sharing_a_gpu_split_the_pods_share() -> None:
    # Two containers with a quarter of a GPU each: the pod holds half of GPU-b (the bridge's
    # count); each container gets that GPU with its own part of the pod's SMs.
    milli = "seedance.io/gpu-milli"
    spec = {
        "containers": [
            {"name": n, "image": "x", "resources": {"limits": {milli: "250"}}} for n in ("a", "b")
        ]
    }
    ev = placed("k8s:u1", PlacementKind.SHARED, [GpuAssignment(index=1, uuid="GPU-b", milli=500)])
    alloc = allocator(ev, view(spec, ev))
    for first in (0, 250):
        envs = (await alloc.allocate(milli, [f"r{first + i}" for i in range(250)])).envs
        assert envs == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-b",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",  # of the pod's 50
        }
