"""Grants rebuilt at start: which pods the API server shows past Allocate, and each pod's
claim checked as Allocate checks it (a gone or stale placement, or a device already held, is
not granted)."""

from __future__ import annotations

from typing import Any

import pytest

from seedance.events.slicing import GpuAssignment, PlacementKind
from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.placement import PodView, Refusal
from seedance.node_agent.kube import holds_devices, pod_view
from tests.unit.node_agent.test_placement import DEVICES, NODE, book, placed, pod

RUNNING = {"running": {"startedAt": "2026-12-02T01:00:00Z"}}
WAITING = {"waiting": {"reason": "ContainerCreating"}}
DONE = {"terminated": {"exitCode": 0}}


def status(phase: str, **statuses: Any) -> dict[str, Any]:
    return {"status": {"phase": phase, **{k: [{"state": s}] for k, s in statuses.items()}}}


@pytest.mark.parametrize(
    ("obj", "holds"),
    [
        (status("Running"), True),
        (status("Pending", containerStatuses=RUNNING), True),
        (status("Pending", initContainerStatuses=DONE, containerStatuses=WAITING), True),
        (status("Pending", initContainerStatuses=RUNNING), True),
        (status("Pending", containerStatuses=WAITING), False),  # may be before Allocate
        (status("Pending"), False),
        (status("Succeeded", containerStatuses=DONE), False),
        (status("Failed", containerStatuses=DONE), False),
        (status("Unknown"), False),
        ({}, False),
    ],
)
def test_which_pods_hold_devices(obj: dict[str, Any], holds: bool) -> None:
    assert holds_devices(obj) is holds


GPU = {"nvidia.com/gpu": 1}


def whole(job: str, index: int, pid: str = "p1") -> Any:
    return placed(
        job, PlacementKind.WHOLE, [GpuAssignment(index=index, uuid=DEVICES.gpus[index])], pid
    )


def allocator(*evs: Any) -> PlacementAllocator:
    async def pending() -> list[PodView]:
        return []

    return PlacementAllocator(node=NODE, book=book(*evs), pending=pending, devices=lambda: DEVICES)


def test_restored_grants_are_held_and_named() -> None:
    ev = whole("a", 0)
    alloc = allocator(ev)
    (r,) = alloc.restore([pod("a", ev, requests=GPU)], ["nvidia.com/gpu"])
    assert r.resource == "nvidia.com/gpu"
    assert not isinstance(r.result, Refusal)
    assert r.result.uuids == ("GPU-a",)
    assert alloc.allocations.granted("a") == r.result
    assert alloc.names_by_uid() == {"a": ("ns", "a")}
    assert alloc.granted_by_pod() == {("ns", "a"): ("GPU-a",)}
    alloc.job_ended("acme", "a")  # the slicer released it: the device is free again
    assert alloc.allocations.granted("a") is None


def test_a_gone_or_stale_placement_is_not_restored() -> None:
    old, newer = whole("s", 0, "p-old"), whole("s", 1, "p-new")
    alloc = allocator(old, newer)
    gone = pod("n", whole("n", 0), requests=GPU)  # the slicer never placed job n
    got = alloc.restore([gone, pod("s", old, requests=GPU)], ["nvidia.com/gpu"])
    reasons = {r.pod.uid: r.result.reason for r in got if isinstance(r.result, Refusal)}
    assert "holds no placement of pod n's job" in reasons["n"]
    assert "stale placement p-old" in reasons["s"]
    assert alloc.allocations.granted("n") is None
    assert alloc.allocations.granted("s") is None
    assert alloc.names_by_uid() == {}


def from_api_server(view: PodView, scheduled_at: str, created_at: str) -> PodView:
    """``view`` as ``kube.pod_view`` reads it from the API server's object for that pod."""
    obj = {
        "metadata": {
            "uid": view.uid,
            "namespace": view.namespace,
            "name": view.name,
            "creationTimestamp": created_at,
            "annotations": dict(view.annotations),
        },
        "spec": {
            "nodeName": view.node_name,
            "containers": [{"name": "c", "resources": {"limits": dict(view.requests)}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Initialized",
                    "status": "True",
                    "lastTransitionTime": "2026-12-02T00:00:00Z",
                },
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at},
            ],
        },
    }
    return pod_view(obj)


def test_of_two_pods_claiming_one_gpu_the_older_keeps_it() -> None:
    a, b = whole("a", 0, "pa"), whole("b", 0, "pb")  # a double booking in the slicer's book
    alloc = allocator(a, b)
    # The annotation's boundAt is the tenant's to edit: pod a claims to be older; the API
    # server's binding time (PodScheduled) says b is.
    older = from_api_server(
        pod("b", b, requests=GPU, boundAt="2026-12-02T03:00:00Z"),
        scheduled_at="2026-12-02T01:00:00Z",
        created_at="2026-12-02T00:59:00Z",
    )
    newer = from_api_server(
        pod("a", a, requests=GPU, boundAt="2026-12-01T00:00:00Z"),
        scheduled_at="2026-12-02T02:00:00Z",
        created_at="2026-12-02T00:58:00Z",
    )
    assert (older.bound_at, newer.bound_at) == ("2026-12-02T01:00:00Z", "2026-12-02T02:00:00Z")
    first, second = alloc.restore([newer, older], ["nvidia.com/gpu"])
    assert first.pod.uid == "b"
    assert not isinstance(first.result, Refusal)
    assert isinstance(second.result, Refusal)
    assert "already allocated to pod(s) ['b']" in second.result.reason


def test_a_pod_asking_for_no_served_resource_was_never_this_agents() -> None:
    ev = whole("a", 0)
    alloc = allocator(ev)
    assert alloc.restore([pod("a", ev, requests={"example.com/fpga": 1})], ["nvidia.com/gpu"]) == []
    assert alloc.allocations.granted("a") is None


def test_pods_bound_in_one_second_go_by_creation_then_uid() -> None:
    a, b, c = whole("a", 0, "pa"), whole("b", 0, "pb"), whole("c", 0, "pc")
    same = "2026-12-02T01:00:00Z"  # the binding's time has whole seconds
    views = [
        from_api_server(pod("a", a, requests=GPU), same, "2026-12-02T00:30:00Z"),
        from_api_server(pod("b", b, requests=GPU), same, "2026-12-02T00:10:00Z"),
        from_api_server(pod("c", c, requests=GPU), same, "2026-12-02T00:10:00Z"),
    ]
    assert [v.uid for v in sorted(views, key=lambda v: v.age_order)] == ["b", "c", "a"]
    unbound = pod_view({"metadata": {"uid": "u", "creationTimestamp": "2026-12-02T00:00:00Z"}})
    assert (unbound.bound_at, unbound.created_at) == ("", "2026-12-02T00:00:00Z")
