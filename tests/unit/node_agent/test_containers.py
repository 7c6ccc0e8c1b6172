"""Allocate per container, as the kubelet asks: pods as users write them (GPUs in two app
containers, in a native sidecar and the main container), each container granted its own devices
out of its pod's placement, in the order and with the device IDs the kubelet's device manager
uses, and kept across a restart of the agent between two of a pod's Allocates. GPUs in a regular
init container are refused (the kubelet's pod-resources List never names one, so no answer for
it can be confirmed), and a pod the kubelet gave up on part-way never takes the next pod's
Allocate. The scenarios of the review of this branch are here, each with its kubelet's records
as the kubelet keeps them (each answer recorded before its next Allocate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.core.placement import NodeDevices, PlacementBook, PodView
from seedance.node_agent.deviceplugin.devices import AllocationError
from seedance.node_agent.kube import pod_view
from tests.unit.node_agent.test_placement import DEVICES, NODE, book, placed, pod

GPU = "nvidia.com/gpu"
MILLI, MEM = "seedance.io/gpu-milli", "seedance.io/gpu-memory-mib"
#: The node of test_placement with two more GPUs, for pods side by side.
FOUR = NodeDevices(gpus={**DEVICES.gpus, 2: "GPU-c", 3: "GPU-d"}, mig={})


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
DOWNLOAD_THEN_SIDECAR = {
    "initContainers": [ctr("download", "1"), ctr("proxy", "1", restartPolicy="Always")],
    "containers": [ctr("serve", "1")],
}
BUILD_THEN_SERVE = {"initContainers": [ctr("build-engine", "1")], "containers": [ctr("serve", "1")]}
SINGLE = {"containers": [ctr("main", "1")]}


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


def allocator(
    ev: Placement,
    *views: PodView,
    more: Sequence[Placement] = (),
    rows: list[ContainerDevices] | None = None,
    placements: PlacementBook | None = None,
) -> PlacementAllocator:
    """``rows``: the kubelet's pod-resources records (a test appends to them as the kubelet
    records an answer); None: no kubelet to ask."""

    async def pending() -> list[PodView]:
        return list(views)

    async def kubelet() -> list[ContainerDevices]:
        return list(rows or ())

    return PlacementAllocator(
        node=NODE,
        book=placements or book(ev, *more),
        pending=pending,
        devices=lambda: FOUR,
        kubelet=None if rows is None else kubelet,
    )


def pod_of(
    uid: str, spec: dict[str, Any], gpus: Sequence[int], bound: str
) -> tuple[Placement, PodView]:
    """Pod ``uid`` placed on ``gpus`` (whole), bound at ``bound`` (the API server's second)."""
    ev = placed(
        f"k8s:{uid}",
        PlacementKind.WHOLE,
        [GpuAssignment(index=i, uuid=FOUR.gpus[i]) for i in gpus],
        pid=f"p-{uid}",
    )
    raw = {
        "metadata": {
            "uid": uid,
            "namespace": "ns",
            "name": uid,
            "creationTimestamp": bound,
            "annotations": dict(pod(uid, ev).annotations),
        },
        "spec": {"nodeName": NODE, **spec},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": bound}],
        },
    }
    return ev, pod_view(raw)


def held(uid: str, container: str, *ids: str) -> ContainerDevices:
    return ContainerDevices("ns", uid, container, GPU, ids)


async def visible(alloc: PlacementAllocator, ids: Sequence[str]) -> str:
    return (await alloc.allocate(GPU, ids)).envs["NVIDIA_VISIBLE_DEVICES"]


@pytest.mark.parametrize(
    ("spec", "placed_gpus", "calls", "expected"),
    [
        # One Allocate per container asking for GPUs, with its own count (kubelet's order and
        # IDs; a done init container's IDs are handed to the next container: devicesToReuse).
        # placed_gpus: what the bridge asks the slicer for (request_of), as the kubelet counts.
        (TWO_APPS, 2, [["d0"], ["d1"]], ["GPU-a", "GPU-b"]),
        (SIDECAR, 2, [["d0"], ["d1"]], ["GPU-a", "GPU-b"]),
    ],
    ids=["two-app-containers", "native-sidecar"],
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


@pytest.mark.parametrize(
    ("spec", "placed_gpus", "ids"),
    [
        (ENGINE_BUILD, 1, ["d0"]),
        (BUILD_THEN_TWO, 2, ["d0", "d1"]),
        (DOWNLOAD_THEN_SIDECAR, 2, ["d0"]),
    ],
    ids=["engine-build-init", "init-then-two-apps", "init-then-sidecar"],
)
async def test_gpus_in_a_regular_init_container_are_refused_naming_why(
    spec: dict[str, Any], placed_gpus: int, ids: list[str]
) -> None:
    # The pod's admission fails at once with the reason (the kubelet shows it on the pod),
    # rather than its init container starting on an answer nothing can confirm, or (after a
    # restart of the agent before it starts) being refused at every start, stuck in Init.
    ev = whole(placed_gpus)
    alloc = allocator(ev, view(spec, ev))
    with pytest.raises(AllocationError) as refused:
        await alloc.allocate(GPU, ids)
    assert "regular init container(s) ['" in str(refused.value)
    assert "never lists regular init containers" in str(refused.value)
    assert "restartPolicy: Always" in str(refused.value)
    assert alloc.allocations.granted("u1") is None


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


async def test_an_init_only_pods_allocate_answered_for_another_pod_never_starts() -> None:
    # Review p1: pods whose only GPU is in a regular init container, bound in one second. The
    # old agent answered each for itself by age (a tie broken by UID: crossed with the
    # kubelet's order) and let both starts through unconfirmed; a later pod then got a GPU
    # still in use. Now an init-only pod is never answered: its Allocate goes to the only other
    # candidate, q, and its start is refused (no record can show whose the IDs are); q's own
    # Allocate gets q its GPU, confirmed.
    ev_a, a = pod_of("ua", ENGINE_BUILD, [0], "2026-12-07T10:00:01Z")
    ev_q, q = pod_of("uq", SINGLE, [1], "2026-12-07T10:00:01Z")
    rows: list[ContainerDevices] = []
    alloc = allocator(ev_a, a, q, more=[ev_q], rows=rows)
    await visible(alloc, ["d0"])  # a's build-engine (the kubelet does not list it)
    with pytest.raises(AllocationError, match="never lists regular init containers"):
        await alloc.pre_start(GPU, ["d0"])
    assert await visible(alloc, ["d1"]) == "GPU-b"  # q's main
    rows.append(held("uq", "main", "d1"))
    await alloc.pre_start(GPU, ["d1"])
    assert alloc.allocations.granted("ua") is None
    grant = alloc.allocations.granted("uq")
    assert grant is not None
    assert grant.uuids == ("GPU-b",)


async def test_a_pod_abandoned_part_way_does_not_take_the_next_pods_allocate() -> None:
    # Review p2: the kubelet answered a's first container, then refused a's admission (e.g. the
    # topology manager, before a's second container's Allocate): it drops a's devices and
    # admits b, whose one GPU matched a's second container. b gets its own GPU and starts.
    ev_a, a = pod_of("ua", TWO_APPS, [0, 1], "2026-12-07T10:00:00Z")
    ev_b, b = pod_of("ub", SINGLE, [2], "2026-12-07T10:00:05Z")
    rows: list[ContainerDevices] = []
    alloc = allocator(ev_a, a, b, more=[ev_b], rows=rows)
    assert await visible(alloc, ["d0"]) == "GPU-a"  # a's trainer; then a is rejected
    assert await visible(alloc, ["d1"]) == "GPU-c"  # b's main
    rows.append(held("ub", "main", "d1"))
    await alloc.pre_start(GPU, ["d1"])
    assert alloc.allocations.granted("ua") is None  # a's GPUs are free again


async def test_a_pod_whose_answer_the_kubelet_asks_for_again_is_not_kept() -> None:
    # Review p2b: as above, and the kubelet hands b the ID it freed of a's: the same IDs asked
    # for again mean a holds nothing (no container reuses an app container's IDs).
    ev_a, a = pod_of("ua", TWO_APPS, [0, 1], "2026-12-07T10:00:00Z")
    ev_b, b = pod_of("ub", SINGLE, [2], "2026-12-07T10:00:05Z")
    alloc = allocator(ev_a, a, b, more=[ev_b], rows=[])
    assert await visible(alloc, ["d0"]) == "GPU-a"
    assert await visible(alloc, ["d0"]) == "GPU-c"
    assert alloc.allocations.granted("ua") is None


async def test_a_pod_being_admitted_keeps_its_next_containers_allocate() -> None:
    # The other side of p2: while the kubelet admits a, its records show a's first answer, and
    # a's second container (as many GPUs as b asks for) is a's, not the older b's (whose
    # placement reached the agent only after a's first Allocate).
    ev_a, a = pod_of("ua", TWO_APPS, [0, 1], "2026-12-07T10:00:05Z")
    ev_b, b = pod_of("ub", SINGLE, [2], "2026-12-07T10:00:00Z")
    rows: list[ContainerDevices] = []
    placements = book(ev_a)
    alloc = allocator(ev_a, a, b, rows=rows, placements=placements)
    assert await visible(alloc, ["d0"]) == "GPU-a"  # a's trainer (b is not placed yet)
    rows.append(held("ua", "trainer", "d0"))
    placements.apply(ev_b)  # the slicer's placement of b arrives
    assert await visible(alloc, ["d1"]) == "GPU-b"  # a's eval
    assert alloc.allocations.granted("ub") is None


async def test_a_restart_after_an_init_only_allocate_gives_no_pod_another_pods_gpu() -> None:
    # Review p4: the agent restarts after p's init container's Allocate. The old agent left a
    # phantom step of p that took q's Allocate (q got p's GPU; both refused at start). p's
    # containers are never granted now; q gets its own GPU and starts.
    ev_p, p = pod_of("up", BUILD_THEN_SERVE, [0], "2026-12-07T10:00:00Z")
    ev_q, q = pod_of("uq", SINGLE, [2], "2026-12-07T10:00:05Z")
    rows: list[ContainerDevices] = []
    first = allocator(ev_p, p, q, more=[ev_q], rows=rows)
    await visible(first, ["d0"])  # p's build-engine: answered for q, the only candidate
    second = allocator(ev_p, p, q, more=[ev_q], rows=rows)
    assert second.restore([], [GPU], rows) == []
    await visible(second, ["d0"])  # p's serve, reusing d0
    rows.append(held("up", "serve", "d0"))
    assert await visible(second, ["d1"]) == "GPU-c"  # q's main
    rows.append(held("uq", "main", "d1"))
    await second.pre_start(GPU, ["d1"])
    with pytest.raises(AllocationError, match="did not grant it"):
        await second.pre_start(GPU, ["d0"])


@pytest.mark.parametrize(
    ("mems", "pod_mib", "expected"),
    [((4096, 4096), 8192, ["0=4096M", "0=4096M"]), ((6144, 2048), 8192, ["0=6144M", "0=2048M"])],
    ids=["even", "uneven"],
)
async def test_containers_sharing_a_gpu_split_the_pods_memory_limit(
    mems: tuple[int, int], pod_mib: int, expected: list[str]
) -> None:
    # Review p3: each container is its own MPS client, capped at its own limit: the pod's
    # limit is split by the containers' own memory requests, never given whole to each.
    spec = {
        "containers": [
            {"name": n, "image": "x", "resources": {"limits": {MILLI: "250", MEM: str(m)}}}
            for n, m in zip("ab", mems, strict=True)
        ]
    }
    ev = placed("k8s:u1", PlacementKind.SHARED, [GpuAssignment(index=1, uuid="GPU-b", milli=500)])
    raw = {
        "metadata": {"uid": "u1", "namespace": "ns", "name": "u1"},
        "spec": {"nodeName": NODE, **spec},
        "status": {"phase": "Pending"},
    }
    raw["metadata"]["annotations"] = dict(pod("u1", ev, gpuMemoryMib=pod_mib).annotations)
    alloc = allocator(ev, pod_view(raw))
    limits = []
    for first in (0, 250):
        envs = (await alloc.allocate(MILLI, [f"r{first + i}" for i in range(250)])).envs
        limits.append(envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
    assert limits == expected
