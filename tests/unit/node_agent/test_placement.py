"""The placement core: what a pod's claim must agree with before it gets devices."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from seedance.events.jobs import K8S_JOB_PREFIX
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
)
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.placement import (
    ANNOTATION_PLACEMENT,
    LABEL_POD_GROUP,
    AllocationBook,
    Grant,
    NodeDevices,
    PlacementBook,
    PodView,
    Refusal,
    gang_job_id,
    placement_of,
    pod_job_id,
    requested_count,
    verify,
)

T0 = datetime(2026, 12, 2, tzinfo=UTC)
NODE = "gpu-1.example"
UUIDS = {0: "GPU-a", 1: "GPU-b"}
DEVICES = NodeDevices(gpus=UUIDS, mig={("GPU-b", "1g.18gb", 3): "MIG-x"})


def placed(
    job: str,
    kind: PlacementKind,
    gpus: list[GpuAssignment],
    pid: str = "p1",
    node: str = kube_node_token(NODE),
) -> Placement:
    return Placement(id=pid, at=T0, job_id=job, tenant="acme", node=node, kind=kind, gpus=gpus)


def pod(
    uid: str,
    ev: Placement,
    *,
    labels: dict[str, str] | None = None,
    requests: dict[str, int] | None = None,
    **over: Any,
) -> PodView:
    doc: dict[str, Any] = {
        "version": 1,
        "podUid": uid,
        "jobId": ev.job_id,
        "tenant": ev.tenant,
        "node": ev.node,
        "kind": ev.kind.value,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "milli": g.milli,
                "migProfile": g.mig_profile,
                "migStartSlot": g.mig_start_slot,
            }
            for g in ev.gpus
        ],
        "gpuMemoryMib": 0,
        "placementId": ev.id,
    }
    doc.update(over)
    return PodView(
        uid=uid,
        namespace="ns",
        name=uid,
        node_name=NODE,
        annotations={ANNOTATION_PLACEMENT: json.dumps(doc)},
        labels=labels or {},
        requests=requests or {},
    )


def book(*evs: Placement) -> PlacementBook:
    b = PlacementBook(NODE)
    for e in evs:
        b.apply(e)
    return b


WHOLE = placed("u1", PlacementKind.WHOLE, [GpuAssignment(index=0, uuid="GPU-a")])


def test_whole_placement_is_granted_its_uuid() -> None:
    got = verify(pod("u1", WHOLE), book(WHOLE), NODE, DEVICES)
    assert got == Grant(
        "u1", "u1", "whole", {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}, ("GPU-a",), tenant="acme"
    )


def test_a_pods_own_job_is_its_k8s_id_as_the_bridge_submits_it_or_its_bare_uid_before() -> None:
    # The bridge names a lone pod's job k8s:<uid> (no tenant may submit into that space); a pod
    # it bound before that keeps its bare uid (WHOLE above). Either is the pod's whole job.
    assert pod_job_id("u1") == "k8s:u1"
    ev = placed(pod_job_id("u1"), PlacementKind.WHOLE, [GpuAssignment(index=0, uuid="GPU-a")])
    got = verify(pod("u1", ev), book(ev), NODE, DEVICES)
    assert got == Grant(
        "u1", "k8s:u1", "whole", {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}, ("GPU-a",), tenant="acme"
    )
    # a gang bound before: its bare derived id, its members' list, still verifies
    members = ("u5", "u6")
    old_job = gang_job_id("ns", "g", members).removeprefix(K8S_JOB_PREFIX)
    gang = placed(old_job, PlacementKind.WHOLE, [GpuAssignment(index=1, uuid="GPU-b")])
    one = [{"index": 1, "uuid": "GPU-b", "milli": 1000}]
    member = pod("u5", gang, gpus=one, gang={"name": "g", "members": list(members)})
    assert isinstance(verify(member, book(gang), NODE, DEVICES), Grant)


#: A lone pod's placement as the bridge submits its job today (``k8s:<uid>``).
OWN = placed(pod_job_id("u1"), PlacementKind.WHOLE, [GpuAssignment(index=0, uuid="GPU-a")])


@pytest.mark.parametrize(
    ("view", "reason"),
    [
        (PodView(uid="u1", namespace="ns", name="x", node_name=NODE), "no seedance.io/placement"),
        (
            PodView(
                uid="u1",
                namespace="ns",
                name="x",
                node_name=NODE,
                annotations={ANNOTATION_PLACEMENT: "{not json"},
            ),
            "unreadable",
        ),
        # copied from another pod: u2 has no placement of its own, so it is no pod the bridge
        # bound here, whatever its annotation says
        (pod("u2", OWN, podUid="u1"), "no placement of pod u2's job"),
        (pod("u1", OWN, podUid="u2"), "this pod is u1"),
        # a pod with its own placement runs under it, never under another job's it names
        (pod("u1", OWN, jobId="u9", labels={LABEL_POD_GROUP: "g"}), "annotation names job u9"),
        (pod("u1", OWN, node="gpu-2"), "this node is"),
        (pod("u1", OWN, placementId="p0"), "stale placement p0"),
        (pod("u1", OWN, tenant="evil"), "the slicer placed acme/whole"),
        (pod("u1", OWN, gpus=[{"index": 1, "uuid": "GPU-b", "milli": 1000}]), "differ"),
        (pod("u1", OWN, gpuMemoryMib=100), "memory cap 100 MiB"),
    ],
)
def test_claims_that_disagree_are_refused(view: PodView, reason: str) -> None:
    got = verify(view, book(OWN), NODE, DEVICES)
    assert isinstance(got, Refusal)
    assert reason in got.reason


def test_a_preempted_or_released_job_has_no_placement() -> None:
    for ev in (
        Preempted(id="x", at=T0, job_id="u1", tenant="acme", node=kube_node_token(NODE)),
        JobReleased(id="y", at=T0, job_id="u1", tenant="acme", outcome=EndOutcome.FINISHED),
    ):
        b = book(WHOLE)
        assert b.apply(ev) == ("acme", "u1")  # its grants are released
        got = verify(pod("u1", WHOLE), b, NODE, DEVICES)
        assert isinstance(got, Refusal)
        assert "holds no placement" in got.reason


def test_another_nodes_part_of_a_gang_keeps_this_nodes_part() -> None:
    # The slicer places a gang over nodes as one job with a part per node, in any order.
    b = book(WHOLE)
    assert b.apply(placed("u1", PlacementKind.WHOLE, WHOLE.gpus, pid="p2", node="gpu-9")) is None
    assert b.get("acme", "u1") == WHOLE


def test_an_ended_jobs_devices_can_be_granted_again() -> None:
    allocations = AllocationBook()
    first = Grant("pod-1", "u1", "whole", {}, ("GPU-a",), tenant="acme")
    second = Grant("pod-2", "u2", "whole", {}, ("GPU-a",), tenant="acme")
    assert allocations.take(first) == first
    assert isinstance(allocations.take(second), Refusal)
    # Another tenant's job of the same id ending releases nothing of acme's.
    assert allocations.release_job("globex", "u1") == []
    assert allocations.release_job("acme", "u1") == ["pod-1"]
    assert allocations.take(second) == second


def test_a_job_not_the_pods_own_needs_a_gang_it_is_a_member_of_and_a_subset() -> None:
    members = ("u5", "u6")
    job = gang_job_id("ns", "g", members)
    gang = placed(
        job,
        PlacementKind.WHOLE,
        [GpuAssignment(index=0, uuid="GPU-a"), GpuAssignment(index=1, uuid="GPU-b")],
    )
    one = [{"index": 1, "uuid": "GPU-b", "milli": 1000}]
    of_gang = {"name": "g", "members": list(members)}
    lone = verify(pod("u5", gang, gpus=one), book(gang), NODE, DEVICES)
    assert isinstance(lone, Refusal)
    assert "no placement of pod u5's job" in lone.reason
    member = pod("u5", gang, gpus=one, gang=of_gang)
    got = verify(member, book(gang), NODE, DEVICES)
    assert isinstance(got, Grant)
    assert got.uuids == ("GPU-b",)
    # A pod that is no member, or whose list (or namespace) derives another job, is refused,
    # whatever its labels and annotation say.
    for forged, reason in (
        (pod("u7", gang, gpus=one, gang=of_gang), "u7 is not a member of pod group 'g'"),
        (
            pod("u7", gang, gpus=one, gang={"name": "g", "members": ["u5", "u7"]}),
            "pod group ns/g with those members is job",
        ),
        (
            dataclasses.replace(member, namespace="other"),
            "pod group other/g with those members is job",
        ),
    ):
        refused = verify(forged, book(gang), NODE, DEVICES)
        assert isinstance(refused, Refusal)
        assert reason in refused.reason
    # A second member claiming the same GPU of the gang does not get it too.
    allocations = AllocationBook()
    assert allocations.take(got) == got
    twin = verify(pod("u6", gang, gpus=one, gang=of_gang), book(gang), NODE, DEVICES)
    assert isinstance(twin, Grant)
    taken = allocations.take(twin)
    assert isinstance(taken, Refusal)
    assert "already allocated to pod(s) ['u5']" in taken.reason
    allocations.release("u5")
    assert allocations.take(twin) == twin


def test_placements_are_keyed_by_tenant_and_job_and_a_bare_id_is_the_claimed_tenants() -> None:
    # globex's bus job under the bare uid of acme's pod (bound before pods' jobs had a space of
    # their own): the pod runs under its own tenant's placement only, never under globex's.
    theirs = Placement(
        id="p9", at=T0, job_id="u1", tenant="globex", node=kube_node_token(NODE),
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=1, uuid="GPU-b")],
    )  # fmt: skip
    b = book(WHOLE, theirs)
    assert len(b) == 2
    assert (b.get("acme", "u1"), b.get("globex", "u1")) == (WHOLE, theirs)
    got = verify(pod("u1", WHOLE), b, NODE, DEVICES)
    assert isinstance(got, Grant)
    assert (got.tenant, got.uuids) == ("acme", ("GPU-a",))
    # An annotation edited to name globex picks globex's placement only with its id.
    edited = verify(pod("u1", WHOLE, tenant="globex"), b, NODE, DEVICES)
    assert isinstance(edited, Refusal)
    assert "stale placement p1" in edited.reason
    # A pod of today (its annotation names k8s:u1) is never answered by the bare id.
    today = verify(pod("u1", OWN), b, NODE, DEVICES)
    assert isinstance(today, Refusal)
    assert "no placement of pod u1's job" in today.reason
    # globex's job ending leaves acme's placement.
    released = JobReleased(id="r", at=T0, job_id="u1", tenant="globex", outcome=EndOutcome.FAILED)
    assert b.apply(released) == ("globex", "u1")
    assert isinstance(verify(pod("u1", WHOLE), b, NODE, DEVICES), Grant)


def test_shared_and_mig() -> None:
    shared = placed("u3", PlacementKind.SHARED, [GpuAssignment(index=1, uuid="GPU-b", milli=5)])
    got = verify(
        pod("u3", shared, gpuMemoryMib=512, requests={"seedance.io/gpu-memory-mib": 512}),
        book(shared),
        NODE,
        DEVICES,
    )
    assert isinstance(got, Grant)
    assert got.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "1",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=512M",
    }
    assert requested_count("shared", shared.gpus) == 5
    mig = placed(
        "u4",
        PlacementKind.MIG,
        [GpuAssignment(index=1, uuid="GPU-b", mig_profile="1g.18gb", mig_start_slot=3)],
    )
    got = verify(pod("u4", mig), book(mig), NODE, DEVICES)
    assert isinstance(got, Grant)
    assert got.envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-x"}
    # The node's GPU 1 is another GPU than the placement names: refused.
    other = NodeDevices(gpus={0: "GPU-a", 1: "GPU-z"})
    got = verify(pod("u1", WHOLE), book(WHOLE), NODE, other)
    assert isinstance(got, Grant)
    moved = placed("u7", PlacementKind.WHOLE, [GpuAssignment(index=1, uuid="GPU-b")])
    bad = verify(pod("u7", moved), book(moved), NODE, other)
    assert isinstance(bad, Refusal)
    assert "not on this node" in bad.reason


def test_the_claim_format_is_the_bridges() -> None:
    """The document the bridge's core writes parses here (pinned against its exact shape)."""
    text = json.dumps(
        {
            "version": 1,
            "podUid": "u1",
            "jobId": "u1",
            "tenant": "acme",
            "node": kube_node_token(NODE),
            "kind": "whole",
            "gpuModel": "H200",
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-a",
                    "milli": 1000,
                    "migProfile": None,
                    "migStartSlot": None,
                }
            ],
            "gpuMemoryMib": 0,
            "placementId": "p1",
            "boundAt": "2026-12-02T00:00:00.000000Z",
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    view = PodView(
        uid="u1", namespace="ns", name="a", node_name=NODE, annotations={ANNOTATION_PLACEMENT: text}
    )
    assert isinstance(verify(view, book(WHOLE), NODE, DEVICES), Grant)


def test_a_pod_the_bridge_binds_is_found_by_its_uid_and_verifies() -> None:
    """Pinned against the bridge's own core: the job id it submits a pod as is the one
    ``pod_job_id`` derives from the UID, and the Binding it writes for the slicer's placement
    verifies here. If the bridge moves pods' job ids (or the annotation), this fails."""
    from seedance.k8s_bridge.core.actions import Bind
    from seedance.k8s_bridge.core.tracker import Publish, Tracker
    from tests.unit.k8s_bridge.pods import pod as api_pod

    bridge = Tracker(instance="bridge-0", id_key=b"k" * 32)
    bridge.bindings = {"team-a": "acme"}
    obj = api_pod("w", limits={"nvidia.com/gpu": 1})
    uid = obj["metadata"]["uid"]
    (submitted,) = [a.event for a in bridge.pod_seen(obj, T0) if isinstance(a, Publish)]
    assert submitted.job_id == pod_job_id(uid)
    ev = Placement(
        id="p7",
        at=T0,
        job_id=submitted.job_id,
        tenant=submitted.tenant,
        node=kube_node_token(NODE),
        kind=PlacementKind.WHOLE,
        gpus=[GpuAssignment(index=1, uuid="GPU-b")],
    )
    (bind,) = [a for a in bridge.decision(ev, T0) if isinstance(a, Bind)]
    view = PodView(
        uid=uid,
        namespace="team-a",
        name="w",
        node_name=bind.node,
        annotations=bind.body["metadata"]["annotations"],
        requests={"nvidia.com/gpu": 1},
    )
    b = book(ev)
    assert placement_of(view, b) == ev
    got = verify(view, b, NODE, DEVICES)
    assert isinstance(got, Grant)
    assert (got.tenant, got.job_id, got.uuids) == ("acme", pod_job_id(uid), ("GPU-b",))
    assert got.job_id == f"k8s:{uid}"


def test_a_gang_the_bridge_binds_verifies_for_its_members_only() -> None:
    """Pinned against the bridge's core: a pod group's job id and the members its Bindings
    list derive here as there."""
    from seedance.k8s_bridge.core.actions import Bind
    from seedance.k8s_bridge.core.tracker import Publish, Tracker
    from tests.unit.k8s_bridge.pods import pod as api_pod

    bridge = Tracker(instance="bridge-0", id_key=b"k" * 32)
    bridge.bindings = {"team-a": "acme"}
    labels = {LABEL_POD_GROUP: "train", "seedance.io/pod-group-size": "2"}
    objs = [api_pod(f"w{i}", limits={"nvidia.com/gpu": 1}, labels=labels) for i in range(2)]
    submitted = [a.event for o in objs for a in bridge.pod_seen(o, T0) if isinstance(a, Publish)]
    (job,) = submitted
    uids = [o["metadata"]["uid"] for o in objs]
    assert job.job_id == gang_job_id("team-a", "train", uids)
    ev = Placement(
        id="p8",
        at=T0,
        job_id=job.job_id,
        tenant="acme",
        node=kube_node_token(NODE),
        kind=PlacementKind.WHOLE,
        gpus=[GpuAssignment(index=0, uuid="GPU-a"), GpuAssignment(index=1, uuid="GPU-b")],
    )
    binds = [a for a in bridge.decision(ev, T0) if isinstance(a, Bind)]
    assert len(binds) == 2
    b = book(ev)
    granted = []
    for bind in binds:
        view = PodView(
            uid=bind.ref.uid,
            namespace="team-a",
            name=bind.ref.name,
            node_name=bind.node,
            annotations=bind.body["metadata"]["annotations"],
            labels=labels,
            requests={"nvidia.com/gpu": 1},
        )
        got = verify(view, b, NODE, DEVICES)
        assert isinstance(got, Grant), got
        granted.append(got.uuids)
    assert sorted(granted) == [("GPU-a",), ("GPU-b",)]
