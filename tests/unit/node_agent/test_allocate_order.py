"""Allocate before the slicer's placement reached the agent (hostile review items 3 and 4):
the kubelet may admit a pod the bridge bound before the agent read the placement it was bound
with. The Allocate waits (within its bound) for that placement, keyed by (tenant, job), and is
never answered with another tenant's devices: a bus tenant's job named after the pod's bare
UID, placed on this node, neither answers the pod nor cuts its wait short."""

from __future__ import annotations

import pytest

from seedance.events.jobs import pod_job_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.tokens import kube_node_token
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.placement import PlacementBook, PodView
from seedance.node_agent.deviceplugin.devices import AllocationError
from tests.unit.node_agent.test_placement import DEVICES, NODE, T0, book, pod

GPU = "nvidia.com/gpu"


def whole(job: str, tenant: str, index: int, pid: str) -> Placement:
    return Placement(
        id=pid, at=T0, job_id=job, tenant=tenant, node=kube_node_token(NODE),
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=index, uuid=DEVICES.gpus[index])],
    )  # fmt: skip


def fed(b: PlacementBook, later: list[Placement], wait_s: float) -> PlacementAllocator:
    """An allocator whose feed applies ``later`` when the Allocate first waits for news."""

    async def news(timeout_s: float) -> bool:
        if not later:
            return False  # the feed had nothing within the bound
        for ev in later:
            b.apply(ev)
        later.clear()
        return True

    async def pending() -> list[PodView]:
        return [view]

    ours = whole(pod_job_id("u1"), "acme", 0, "p-acme")
    view = pod("u1", ours, requests={GPU: 1})
    return PlacementAllocator(
        node=NODE, book=b, pending=pending, devices=lambda: DEVICES, placement_news=news,
        placement_wait_s=wait_s,
    )  # fmt: skip


async def test_an_allocate_waits_for_its_own_placement_past_another_tenants_bare_uid_job() -> None:
    theirs = whole("u1", "globex", 1, "p-globex")  # globex's bus job under the pod's bare uid
    ours = whole(pod_job_id("u1"), "acme", 0, "p-acme")
    b = book(theirs)
    got = await fed(b, [ours], wait_s=5).allocate(GPU, ["d0"])
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": DEVICES.gpus[0]}


async def test_an_allocate_whose_placement_never_comes_is_refused_with_the_reason() -> None:
    b = book(whole("u1", "globex", 1, "p-globex"))
    with pytest.raises(AllocationError, match="holds no placement of pod u1's job"):
        await fed(b, [], wait_s=0.01).allocate(GPU, ["d0"])
