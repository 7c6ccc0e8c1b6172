"""Answered Allocates against the kubelet's records (``core.confirm``), and the allocator's use
of them: a wrong inference frees the pod it was meant for and stops the holder's start."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.tokens import kube_node_token
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.confirm import Answered, holders, reconcile
from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.core.placement import (
    NodeDevices,
    PlacementBook,
    PodView,
    Refusal,
)
from seedance.node_agent.deviceplugin.devices import AllocationError
from tests.unit.node_agent.test_placement import pod as claimed

T0 = datetime(2026, 12, 2, tzinfo=UTC)
NODE = "gpu-1.example"
GPU = "nvidia.com/gpu"
DEVICES = NodeDevices(gpus={0: "GPU-a", 1: "GPU-b"})


def row(pod: str, *ids: str, resource: str = GPU) -> ContainerDevices:
    return ContainerDevices("ns", pod, "main", resource, tuple(ids))


def answered(pod: str, *ids: str) -> Answered:
    return Answered(GPU, frozenset(ids), f"uid-{pod}", ("ns", pod))


def test_each_answer_is_confirmed_mismatched_or_unseen() -> None:
    rows = [row("v", "d0"), row("r", "d1"), row("x", "d9", resource="seedance.io/gpu-milli")]
    got = reconcile([answered("v", "d0"), answered("v2", "d1"), answered("w", "d2")], rows)
    assert got.confirmed == [answered("v", "d0")]
    assert got.mismatched == [(answered("v2", "d1"), [("ns", "r")])]
    assert got.unseen == [answered("w", "d2")]
    # Another resource's IDs are not these: d9 of gpu-milli is no holder of a GPU.
    assert holders(rows, GPU, ["d9"]) == []
    assert holders(rows, GPU, ["d0", "d1"]) == [("ns", "r"), ("ns", "v")]


class Kubelet:
    """The kubelet's records as its pod-resources List returns them; ``down`` fails it."""

    def __init__(self) -> None:
        self.rows: list[ContainerDevices] = []
        self.down = False
        self.calls = 0

    async def list_pods(self) -> list[ContainerDevices]:
        self.calls += 1
        if self.down:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )
        return list(self.rows)


def placement(uid: str, index: int, pid: str = "") -> Placement:
    return Placement(
        id=pid or f"p-{uid}",
        at=T0,
        job_id=uid,
        tenant="acme",
        node=kube_node_token(NODE),
        kind=PlacementKind.WHOLE,
        gpus=[GpuAssignment(index=index, uuid=DEVICES.gpus[index])],
    )


def view(uid: str, ev: Placement, bound_at: str, **over: str) -> PodView:
    v = claimed(uid, ev, requests={GPU: 1}, **over)
    return PodView(
        uid=uid,
        namespace="ns",
        name=uid,
        node_name=NODE,
        annotations=v.annotations,
        requests=v.requests,
        bound_at=bound_at,
    )


def setup(
    *placed: Placement, warn: Any = None
) -> tuple[PlacementAllocator, list[PodView], Kubelet]:
    book = PlacementBook(NODE)
    for ev in placed:
        book.apply(ev)
    pods: list[PodView] = []
    kubelet = Kubelet()

    async def pending() -> list[PodView]:
        return list(pods)

    alloc = PlacementAllocator(
        node=NODE, book=book, pending=pending, devices=lambda: DEVICES,
        kubelet=kubelet.list_pods, warn=warn,
    )  # fmt: skip
    return alloc, pods, kubelet


async def allocate(alloc: PlacementAllocator, ids: Sequence[str]) -> dict[str, str]:
    return (await alloc.allocate(GPU, ids)).envs


async def test_an_answer_the_kubelet_gave_another_pod_frees_its_pod_and_stops_the_holder() -> None:
    v_placed = placement("v", 1)
    alloc, pods, kubelet = setup(v_placed)
    victim = view("v", v_placed, "2026-12-02T01:00:00Z")
    # Pod r sits on the node with no placement of its own (created with nodeName preset);
    # its annotation copies v's claim. It is older than v by every time it could show.
    rogue = view("r", v_placed, "2026-12-02T00:00:00Z", podUid="r")
    pods += [rogue, victim]

    # The kubelet admits r first: its Allocate is answered for v, the only pod the bridge
    # bound here (r is passed over: the slicer holds no placement of its job).
    assert await allocate(alloc, ["d0"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    assert alloc.allocations.granted("v") is not None
    # The kubelet records d0 as r's (after Allocate returned); v is admitted next.
    kubelet.rows = [row("r", "d0")]
    assert await allocate(alloc, ["d1"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    kubelet.rows.append(row("v", "d1"))
    # r's container does not start on v's GPU; v's does.
    with pytest.raises(AllocationError) as refused:
        await alloc.pre_start(GPU, ["d0"])
    assert "pod ns/r holds nvidia.com/gpu devices ['d0'] that Seedance did not grant it" in str(
        refused.value
    )
    assert "answered for pod ns/v" in str(refused.value)
    await alloc.pre_start(GPU, ["d1"])
    assert alloc.names_by_uid() == {"v": ("ns", "v")}


async def test_the_holder_of_another_pods_answer_is_told_why_once() -> None:
    told: list[tuple[tuple[str, str], str]] = []

    async def warn(pod: tuple[str, str], message: str) -> None:
        told.append((pod, message))

    v_placed = placement("v", 1)
    alloc, pods, kubelet = setup(v_placed, warn=warn)
    pods += [view("v", v_placed, "2026-12-02T01:00:00Z")]
    await allocate(alloc, ["d0"])
    kubelet.rows = [row("r", "d0")]
    with pytest.raises(AllocationError):
        await alloc.pre_start(GPU, ["d0"])
    with pytest.raises(AllocationError):
        await alloc.pre_start(GPU, ["d0"])  # the kubelet retries: refused, not told again
    ((pod, message),) = told
    assert pod == ("ns", "r")
    assert "Seedance refuses to start this pod's containers on nvidia.com/gpu devices" in message
    assert "answered for pod ns/v" in message


async def test_a_pod_whose_claim_fails_is_passed_over_not_the_allocates_end() -> None:
    s_old, s_new, v_placed = (
        placement("s", 0, "p-old"),
        placement("s", 0, "p-new"),
        placement("v", 1),
    )
    alloc, pods, kubelet = setup(s_old, s_new, v_placed)
    # Pod s, older, claims a placement the slicer has replaced (a stale id): the Allocate
    # (which may be v's) is not refused for it.
    pods += [view("s", s_old, "2026-12-02T00:00:00Z"), view("v", v_placed, "2026-12-02T01:00:00Z")]
    assert await allocate(alloc, ["d0"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    assert alloc.allocations.granted("s") is None
    kubelet.rows = [row("v", "d0")]  # the kubelet records its answer before its next Allocate
    # When no pod verifies, the refusal names each one passed over and why.
    with pytest.raises(AllocationError) as none:
        await allocate(alloc, ["d1"])
    assert "no pending pod bound to gpu-1.example with the slicer's placement asks for 1" in str(
        none.value
    )
    assert "ns/s: stale placement p-old" in str(none.value)
    assert kubelet.calls == 1  # the answer for v was reconciled before choosing again


async def test_a_start_the_kubelet_cannot_confirm_is_refused() -> None:
    v_placed = placement("v", 1)
    alloc, pods, kubelet = setup(v_placed)
    pods.append(view("v", v_placed, "2026-12-02T01:00:00Z"))
    await allocate(alloc, ["d0"])
    kubelet.down = True
    with pytest.raises(AllocationError, match="pod-resources List did not answer"):
        await alloc.pre_start(GPU, ["d0"])
    kubelet.down = False
    with pytest.raises(AllocationError, match=r"reports no pod holding nvidia\.com/gpu devices"):
        await alloc.pre_start(GPU, ["d0"])
    kubelet.rows = [row("v", "d0")]
    await alloc.pre_start(GPU, ["d0"])
    # Without a kubelet to ask, nothing can show whose the devices are.
    blind = PlacementAllocator(
        node=NODE, book=PlacementBook(NODE), pending=kubelet.list_pods, devices=lambda: DEVICES
    )
    with pytest.raises(AllocationError, match="did not answer"):
        await blind.pre_start(GPU, ["d0"])


async def test_ids_allocated_again_were_not_kept_by_the_kubelet() -> None:
    a_placed, b_placed = placement("a", 0), placement("b", 1)
    alloc, pods, _kubelet = setup(a_placed, b_placed)
    pods += [
        view("a", a_placed, "2026-12-02T00:00:00Z"),
        view("b", b_placed, "2026-12-02T01:00:00Z"),
    ]
    assert await allocate(alloc, ["d0"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    # The kubelet's Allocate failed on its side and it asks again for the same IDs: the pod
    # the first answer was for holds nothing (the kubelet rejected its admission, for good,
    # though the API server still shows it Pending), so the next pod is answered.
    assert await allocate(alloc, ["d0"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    assert alloc.allocations.granted("a") is None


async def test_a_pod_recreated_under_a_granted_pods_name_inherits_no_grant() -> None:
    # Pod p (uid p-old) is granted GPU-a and starts. It is deleted and re-created under the
    # same name (uid p-new) before the slicer's release of the old one's job reached the agent.
    old, q_placed = placement("p-old", 0), placement("q", 1)
    alloc, pods, kubelet = setup(old, q_placed)
    first = view("p-old", old, "2026-12-02T00:00:00Z")
    pods.append(dataclasses.replace(first, name="p"))
    assert await allocate(alloc, ["d0"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}
    kubelet.rows = [row("p", "d0")]
    await alloc.pre_start(GPU, ["d0"])
    # The new p has no placement yet; the kubelet admits it and its Allocate is answered for
    # q (older, placed): the kubelet records d1 as the new p's.
    renewed = dataclasses.replace(view("p-new", old, "2026-12-02T02:00:00Z"), name="p")
    pods[:] = [view("q", q_placed, "2026-12-02T01:00:00Z"), renewed]
    assert await allocate(alloc, ["d1"]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-b"}
    kubelet.rows = [row("p", "d1")]
    # Its container does not start on q's GPU, though a pod named p holds a grant.
    with pytest.raises(AllocationError, match=r"pod ns/p holds nvidia\.com/gpu devices \['d1'\]"):
        await alloc.pre_start(GPU, ["d1"])
    assert alloc.allocations.granted("p-new") is None


async def test_a_restored_grant_lets_its_own_pods_containers_start_again() -> None:
    v_placed = placement("v", 0)
    alloc, _pods, kubelet = setup(v_placed)
    held = [row("v", "d0")]
    kubelet.rows = held
    (restored,) = alloc.restore([view("v", v_placed, "2026-12-02T00:00:00Z")], [GPU], held)
    assert not isinstance(restored.result, Refusal)
    await alloc.pre_start(GPU, ["d0"])  # a container restart after the agent's own
