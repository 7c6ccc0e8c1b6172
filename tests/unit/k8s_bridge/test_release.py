"""Capacity release (`seedance.k8s_bridge.core.release`): the nodes the slicer's capacity plan
says it holds empty are cordoned and tainted, lifted when it no longer does; never a node of
another cluster, never one someone else cordoned; a marked node stays ready to the slicer."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from seedance.events import decode, new_event_id
from seedance.events.slicing import CapacityPlan
from seedance.events.telemetry import NodeState
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.k8s_bridge.core.release import (
    ANNOTATION_RELEASING,
    TAINT_RELEASING,
    NodeMarks,
    PatchNode,
)
from seedance.testing.kube_api.patch import merge_patch

AT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
MODEL = "NVIDIA-A100-SXM4-80GB"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name: str, *, unschedulable: bool = False, rv: str = "7") -> dict[str, Any]:
    spec: dict[str, Any] = {"taints": [dict(GPU_TAINT)]}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv,
                     "labels": {"nvidia.com/gpu.product": MODEL}},
        "spec": spec,
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def plan(*drained: str, at: datetime = AT, pool: str = "default") -> CapacityPlan:
    return CapacityPlan(
        id=new_event_id(), at=at, pool=pool, gpu_model=MODEL, nodes=4, nodes_busy=2,
        nodes_draining=len(drained), gpus_per_node=8, gpus_in_use=9, gpus_waiting=0.0,
        headroom_gpus=0.0, startup_s=180.0, nodes_needed=2, horizon_s=3600.0,
        nodes_needed_at_horizon=2, releasable_nodes=len(drained), nodes_short=0,
        drained_nodes=list(drained),
    )  # fmt: skip


def applied(n: dict[str, Any], a: PatchNode) -> dict[str, Any]:
    """The Node after the patch, as the API server's JSON merge patch makes it."""
    body = copy.deepcopy(a.body)
    assert body["metadata"].pop("resourceVersion") == n["metadata"]["resourceVersion"]
    return merge_patch(n, body)


def test_a_held_node_is_cordoned_and_tainted_and_the_mark_names_its_cluster() -> None:
    nodes = {"gpu-1": node("gpu-1"), "gpu-2": node("gpu-2")}
    marks = NodeMarks("eu-1")
    (a,) = marks.plan(plan("gpu-2"), nodes, AT)
    assert (a.name, a.mark) == ("gpu-2", True)
    after = applied(nodes["gpu-2"], a)
    assert after["spec"]["unschedulable"] is True
    taints = after["spec"]["taints"]
    assert GPU_TAINT in taints  # others' taints are kept
    assert {"key": TAINT_RELEASING, "value": "eu-1", "effect": "NoSchedule"} in taints
    doc = json.loads(after["metadata"]["annotations"][ANNOTATION_RELEASING])
    assert doc == {"cluster": "eu-1", "pool": "default", "gpuModel": MODEL,
                   "since": "2026-12-01T10:00:00Z"}  # fmt: skip
    # The same plan again (a redelivery) changes nothing.
    assert marks.plan(plan("gpu-2"), {**nodes, "gpu-2": after}, AT) == []


def test_the_mark_is_lifted_when_the_slicer_takes_the_node_back() -> None:
    marks = NodeMarks("eu-1")
    n = node("gpu-2")
    (a,) = marks.plan(plan("gpu-2"), {"gpu-2": n}, AT)
    marked = applied(n, a)
    marked["metadata"]["resourceVersion"] = "8"
    (lift,) = marks.plan(plan(at=AT + timedelta(minutes=10)), {"gpu-2": marked}, AT)
    assert (lift.name, lift.mark) == ("gpu-2", False)
    after = applied(marked, lift)
    assert "unschedulable" not in after["spec"]
    assert after["spec"]["taints"] == [GPU_TAINT]
    assert ANNOTATION_RELEASING not in after["metadata"].get("annotations", {})
    assert marks.marked == {}


def test_a_node_someone_else_cordoned_is_never_touched() -> None:
    marks = NodeMarks("eu-1")
    nodes = {"gpu-2": node("gpu-2", unschedulable=True)}
    assert marks.plan(plan("gpu-2"), nodes, AT) == []
    assert marks.plan(plan(at=AT + timedelta(minutes=1)), nodes, AT) == []  # nor uncordoned


def test_a_node_not_in_this_clusters_cache_is_not_touched() -> None:
    marks = NodeMarks("eu-1")
    assert marks.plan(plan("gpu-9"), {"gpu-1": node("gpu-1")}, AT) == []


def test_another_clusters_mark_is_not_ours_to_lift() -> None:
    theirs = NodeMarks("us-1")
    n = node("gpu-2")
    (a,) = theirs.plan(plan("gpu-2"), {"gpu-2": n}, AT)
    marked = applied(n, a)
    ours = NodeMarks("eu-1")
    ours.seen([marked])
    assert ours.marked == {}
    assert ours.plan(plan(at=AT + timedelta(minutes=1)), {"gpu-2": marked}, AT) == []


def test_a_new_leader_reads_the_marks_back_from_the_nodes() -> None:
    first = NodeMarks("eu-1")
    n = node("gpu-2")
    (a,) = first.plan(plan("gpu-2"), {"gpu-2": n}, AT)
    marked = applied(n, a)
    second = NodeMarks("eu-1")
    second.seen([marked, node("gpu-1")])
    assert list(second.marked) == ["gpu-2"]
    (lift,) = second.plan(plan(at=AT + timedelta(minutes=1)), {"gpu-2": marked}, AT)
    assert not lift.mark


def test_an_older_plan_redelivered_does_not_mark_again() -> None:
    marks = NodeMarks("eu-1")
    n = node("gpu-2")
    marked = applied(n, marks.plan(plan("gpu-2"), {"gpu-2": n}, AT)[0])
    (lift,) = marks.plan(plan(at=AT + timedelta(minutes=5)), {"gpu-2": marked}, AT)
    lifted = applied(marked, lift)
    # The first plan, redelivered after the newer one: the node stays given back.
    assert marks.plan(plan("gpu-2"), {"gpu-2": lifted}, AT) == []
    assert marks.marked == {}


def test_a_refused_lift_is_tried_again_by_the_next_plan() -> None:
    marks = NodeMarks("eu-1")
    n = node("gpu-2")
    marked = applied(n, marks.plan(plan("gpu-2"), {"gpu-2": n}, AT)[0])
    (lift,) = marks.plan(plan(at=AT + timedelta(minutes=1)), {"gpu-2": marked}, AT)
    marks.refused(lift)  # 409: the Node moved meanwhile
    (again,) = marks.plan(plan(at=AT + timedelta(minutes=2)), {"gpu-2": marked}, AT)
    assert (again.name, again.mark) == ("gpu-2", False)


def test_a_plan_of_another_pool_lifts_nothing_of_this_one() -> None:
    marks = NodeMarks("eu-1")
    n = node("gpu-2")
    marks.plan(plan("gpu-2"), {"gpu-2": n}, AT)
    assert marks.plan(plan(pool="other"), {"gpu-2": n}, AT) == []
    assert list(marks.marked) == ["gpu-2"]


def test_a_node_seedance_marked_stays_ready_to_the_slicer_an_operators_cordon_does_not() -> None:
    marks = NodeMarks("eu-1")
    n = node("gpu-2")
    marked = applied(n, marks.plan(plan("gpu-2"), {"gpu-2": n}, AT)[0])
    # The node lifecycle controller adds its own taint for the cordon.
    marked["spec"]["taints"].append(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    )
    assert node_inventory(marked, AT, key=b"k" * 32).state is NodeState.READY
    assert (
        node_inventory(node("gpu-3", unschedulable=True), AT, key=b"k" * 32).state
        is NodeState.CORDONED
    )


def test_a_deleted_node_is_forgotten() -> None:
    marks = NodeMarks("eu-1")
    marks.plan(plan("gpu-2"), {"gpu-2": node("gpu-2")}, AT)
    marks.node_gone("gpu-2")
    assert marks.marked == {}


def test_the_plan_survives_the_wire_with_its_drained_nodes() -> None:
    p = plan("gpu-2", "gpu:3")
    back = decode(msgspec.json.encode(p))
    assert isinstance(back, CapacityPlan)
    assert back.drained_nodes == ["gpu-2", "gpu:3"]
    # a plan from before the field: no node held
    raw = msgspec.json.decode(msgspec.json.encode(p))
    del raw["drained_nodes"]
    old = decode(msgspec.json.encode(raw))
    assert isinstance(old, CapacityPlan)
    assert old.drained_nodes == []
