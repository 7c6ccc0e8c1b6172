"""The tracker: pods in, job events and API writes out; restarts repeat ids, never facts."""

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from seedance.events import new_event_id
from seedance.events.jobs import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobSubmitted,
    is_k8s_job,
    pod_job_id,
)
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobRejected,
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
    RejectionReason,
    Unschedulable,
    UnschedulableReason,
)
from seedance.events.telemetry import NodeInventory, NodeState
from seedance.k8s_bridge.core.adoption import JobRecords
from seedance.k8s_bridge.core.pods import pod_ref
from seedance.k8s_bridge.core.tracker import (
    Action,
    Bind,
    BindOutcome,
    DeletePod,
    PatchStatus,
    PodState,
    PostEvent,
    Publish,
    Tracker,
)
from tests.unit.k8s_bridge.pods import node, pod

T0 = datetime(2026, 12, 1, 10, 0, 1, tzinfo=UTC)


def tracker() -> Tracker:
    t = Tracker(instance="bridge-0", id_key=b"k" * 32)
    t.bindings = {"team-a": "acme"}
    return t


def restarted(*records: tuple[str, str]) -> Tracker:
    """A tracker of a bridge taking the lead, with the job records it read from KV."""
    t = tracker()
    t.records = JobRecords(records)
    return t


def published(actions: list[Action]) -> list[Any]:
    return [a.event for a in actions if isinstance(a, Publish)]


def of(actions: list[Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def placement(
    job_id: str, node_: str = "gpu-1", gpus: tuple[int, ...] = (0,), **kw: Any
) -> Placement:
    return Placement(
        id=kw.pop("id", new_event_id(at=T0)),
        at=kw.pop("at", T0),
        job_id=job_id,
        tenant=kw.pop("tenant", "acme"),
        node=node_,
        kind=PlacementKind.WHOLE,
        gpu_model="A100",
        gpus=[GpuAssignment(index=i, uuid=f"GPU-{i}") for i in gpus],
        cause_id=kw.pop("cause_id", "c1"),
    )


def submit(t: Tracker, p: dict[str, Any]) -> JobSubmitted:
    (ev,) = published(t.pod_seen(p, T0))
    assert isinstance(ev, JobSubmitted)
    return ev


def test_a_pending_pod_is_submitted_once_as_an_observed_job() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    actions = t.pod_seen(p, T0)
    (pub,) = of(actions, Publish)
    assert pub.subject == "seedance.observed.acme.submitted"
    ev = pub.event
    # in the pods' own space, which no tenant may submit into
    assert ev.job_id == pod_job_id(p["metadata"]["uid"]) == f"k8s:{p['metadata']['uid']}"
    assert ev.at == T0
    assert ev.request.gpus == 1
    # an update (our own patch, a label) submits nothing again
    p["metadata"]["resourceVersion"] = "999"
    assert t.pod_seen(p, T0 + timedelta(seconds=5)) == []
    # a restarted bridge derives the same id (JetStream drops it; the slicer ignores a repeat)
    again = submit(tracker(), p)
    assert again.id == ev.id


def test_placement_binds_with_the_annotation_then_reports_scheduled() -> None:
    t = tracker()
    p = pod(name="train", limits={"nvidia.com/gpu": 2})
    job = submit(t, p)
    (bind,) = t.decision(placement(job.job_id, "gpu.node-1", (2, 3)), T0)
    assert isinstance(bind, Bind)
    assert bind.node == "gpu.node-1"  # the subject token's ':' back to the node name's '.'
    assert bind.body["kind"] == "Binding"
    assert bind.body["metadata"]["uid"] == p["metadata"]["uid"]
    assert bind.body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu.node-1"}
    doc = json.loads(bind.body["metadata"]["annotations"]["seedance.io/placement"])
    assert doc["podUid"] == p["metadata"]["uid"]
    assert [g["index"] for g in doc["gpus"]] == [2, 3]
    assert [g["uuid"] for g in doc["gpus"]] == ["GPU-2", "GPU-3"]
    assert t.state_of(p["metadata"]["uid"]) is PodState.BINDING
    # a redelivered placement binds nothing twice
    assert t.decision(placement(job.job_id, "gpu:node-1", (2, 3)), T0) == []
    (ev,) = t.bind_done(pod_ref(p), BindOutcome.BOUND, T0)
    assert isinstance(ev, PostEvent)
    assert ev.body["reason"] == "Scheduled"
    assert "gpu.node-1" in ev.body["message"]
    assert "GPU 2" in ev.body["message"]
    assert t.state_of(p["metadata"]["uid"]) is PodState.BOUND


def _bound(t: Tracker, p: dict[str, Any], at: datetime = T0) -> str:
    """Submit, place and bind ``p``; its job id."""
    job = submit(t, p)
    (bind,) = t.decision(placement(job.job_id), at)
    t.bind_done(pod_ref(p), BindOutcome.BOUND, at)
    p["spec"]["nodeName"] = bind.node
    p["metadata"]["annotations"].update(bind.body["metadata"]["annotations"])
    return job.job_id


def _terminated(p: dict[str, Any], phase: str, finished: str, code: int = 0) -> None:
    p["status"] = {
        "phase": phase,
        "containerStatuses": [
            {
                "name": "main",
                "state": {
                    "terminated": {"finishedAt": finished, "exitCode": code, "reason": "Error"}
                },
            }
        ],
    }


def test_success_is_billed_at_the_kubelets_finish_within_the_bridges_bounds() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    _bound(t, p, T0)
    _terminated(p, "Succeeded", "2026-12-01T10:05:00Z")
    seen = T0 + timedelta(minutes=10)
    (pub,) = of(t.pod_seen(p, seen), Publish)
    assert pub.subject == "seedance.observed.acme.finished"
    assert isinstance(pub.event, JobFinished)
    assert pub.event.at == datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    # the deletion that follows reports nothing more
    assert t.pod_seen(p, seen, deleted=True) == []


def test_a_kubelet_clock_ahead_is_bounded_by_observation_and_behind_by_the_bind() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    _bound(t, p, T0)
    _terminated(p, "Failed", "2027-01-01T00:00:00Z", code=137)
    seen = T0 + timedelta(minutes=1)
    (ev,) = published(t.pod_seen(p, seen))
    assert isinstance(ev, JobFailed)
    assert ev.at == seen
    assert "exit code 137" in ev.reason
    t2 = tracker()
    q = pod(limits={"nvidia.com/gpu": 1})
    _bound(t2, q, T0)
    _terminated(q, "Succeeded", "2026-01-01T00:00:00Z")
    (ev,) = published(t2.pod_seen(q, seen))
    assert ev.at == T0  # never before the bind


def test_a_restarted_bridge_adopts_its_bound_pods_and_reports_their_end_once() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    _bound(t, p, T0)
    _terminated(p, "Succeeded", "2026-12-01T10:05:00Z")
    (first,) = published(t.pod_seen(p, T0 + timedelta(minutes=6)))
    fresh = restarted(("acme", pod_job_id(p["metadata"]["uid"])))
    (again,) = published(fresh.pod_seen(p, T0 + timedelta(minutes=7)))
    assert again.id == first.id  # the same end, a duplicate downstream
    assert fresh.state_of(p["metadata"]["uid"]) is PodState.ENDED


def test_a_forged_placement_annotation_adopts_nothing_after_a_restart() -> None:
    # A tenant can write annotations on its own pods: after a hand-over, a bound pod whose
    # annotation names another tenant or another job must not take that job over (its deletion
    # would end the victim's job on a trusted subject and stop the victim's bill).
    # Nor may it take its own uid's job, which the bridge never submitted (it was created
    # bound), nor, as a pod group's member, its group's: only a recorded job is taken over.
    victim = pod(limits={"nvidia.com/gpu": 1})
    _bound(tracker(), victim, T0)
    victim_doc = json.loads(victim["metadata"]["annotations"]["seedance.io/placement"])
    group = {"seedance.io/pod-group": "g", "seedance.io/pod-group-size": "2"}
    for labels, forged in (
        ({}, {"jobId": victim_doc["jobId"]}),
        ({}, {"tenant": "globex"}),
        ({}, {"jobId": "own"}),
        (group, {"gang": {"name": "g", "members": ["self", victim["metadata"]["uid"]]}}),
    ):
        sneaky = pod(node_name="gpu-1", labels=labels, limits={"nvidia.com/gpu": 1})
        uid = sneaky["metadata"]["uid"]
        doc = {**victim_doc, "podUid": uid, "node": "gpu-1", **forged}
        doc = json.loads(json.dumps(doc).replace('"own"', f'"k8s:{uid}"').replace("self", uid))
        sneaky["metadata"]["annotations"]["seedance.io/placement"] = json.dumps(doc)
        fresh = restarted(("acme", victim_doc["jobId"]))
        fresh.pod_seen(victim, T0 + timedelta(minutes=1))
        refusal = fresh.pod_seen(sneaky, T0 + timedelta(minutes=1))
        assert (
            "not_adopted" in of(refusal, PatchStatus)[0].body["status"]["conditions"][0]["message"]
        ), forged
        assert fresh.state_of(uid) is PodState.REFUSED
        ended = published(fresh.pod_seen(sneaky, T0 + timedelta(minutes=2), deleted=True))
        assert ended == [], forged
        assert fresh.state_of(victim["metadata"]["uid"]) is PodState.BOUND


def test_preset_node_name_is_refused_never_bound() -> None:
    t = tracker()
    p = pod(node_name="gpu-1", limits={"nvidia.com/gpu": 1})
    actions = t.pod_seen(p, T0)
    assert published(actions) == []
    (patch,) = of(actions, PatchStatus)
    cond = patch.body["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodScheduled",
        "False",
        "SeedanceRefused",
    )
    assert "node_name_preset" in cond["message"]
    (event,) = of(actions, PostEvent)
    assert event.body["type"] == "Warning"
    assert t.state_of(p["metadata"]["uid"]) is PodState.REFUSED
    assert t.decision(placement(pod_job_id(p["metadata"]["uid"])), T0) == []


def test_a_pod_deleted_before_binding_is_cancelled() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    job = submit(t, p)
    (pub,) = of(t.pod_seen(p, T0, deleted=True), Publish)
    assert isinstance(pub.event, JobCancelled)
    assert pub.subject == "seedance.observed.acme.cancelled"
    assert t.decision(placement(job.job_id), T0) == []
    # deleted while the Binding was in flight: the 404 cancels it
    q = pod(limits={"nvidia.com/gpu": 1})
    job = submit(t, q)
    t.decision(placement(job.job_id), T0)
    (ev,) = published(t.bind_done(pod_ref(q), BindOutcome.GONE, T0))
    assert isinstance(ev, JobCancelled)
    assert t.pod_seen(q, T0, deleted=True) == []


def test_unschedulable_and_rejected_become_the_condition_and_an_event() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 8})
    job = submit(t, p)
    why = Unschedulable(
        id=new_event_id(), at=T0, job_id=job.job_id, tenant="acme",
        reason=UnschedulableReason.NO_CAPACITY, detail="8 GPUs free on no node",
    )  # fmt: skip
    actions = t.decision(why, T0)
    cond = of(actions, PatchStatus)[0].body["status"]["conditions"][0]
    assert cond["reason"] == "Unschedulable"
    assert cond["message"] == "no_capacity: 8 GPUs free on no node"
    assert of(actions, PostEvent)[0].body["reason"] == "FailedScheduling"
    rejected = JobRejected(
        id=new_event_id(), at=T0, job_id=job.job_id, tenant="acme",
        reason=RejectionReason.INVALID_REQUEST, detail="bad", cause_type="job.submitted.v1",
    )  # fmt: skip
    assert of(t.decision(rejected, T0), PatchStatus)
    end_answer = JobRejected(
        id=new_event_id(), at=T0, job_id=job.job_id, tenant="acme",
        reason=RejectionReason.JOB_ENDED, cause_type="job.finished.v1",
    )  # fmt: skip
    assert t.decision(end_answer, T0) == []


def test_preemption_deletes_the_victim_with_an_event_and_its_deletion_ends_the_job() -> None:
    t = tracker()
    p = pod(limits={"nvidia.com/gpu": 1})
    job_id = _bound(t, p, T0)
    pre = Preempted(
        id=new_event_id(), at=T0, job_id=job_id, tenant="acme",
        node="gpu-1", by_job_id="other", reason="priority",
    )  # fmt: skip
    actions = t.decision(pre, T0)
    (delete,) = of(actions, DeletePod)
    assert delete.ref.uid == p["metadata"]["uid"]
    assert of(actions, PostEvent)[0].body["reason"] == "Preempted"
    (ev,) = published(t.pod_seen(p, T0 + timedelta(seconds=1), deleted=True))
    assert isinstance(ev, JobCancelled)


def _gang(n: int, size: int | None = None, **kw: Any) -> list[dict[str, Any]]:
    labels = {"seedance.io/pod-group": "g1", "seedance.io/pod-group-size": str(size or n)}
    return [pod(name=f"w-{i}", labels=labels, limits={"nvidia.com/gpu": 1}, **kw) for i in range(n)]


def test_a_gang_is_submitted_once_complete_and_bound_only_when_every_member_is_placed() -> None:
    t = tracker()
    members = _gang(3)
    assert t.pod_seen(members[0], T0) == []
    assert t.pod_seen(members[1], T0) == []
    (job,) = published(t.pod_seen(members[2], T0))
    assert job.request.gang_size == 3
    assert job.request.gpus == 1
    assert job.job_id not in {pod_job_id(m["metadata"]["uid"]) for m in members}
    assert is_k8s_job(job.job_id)
    part0 = placement(job.job_id, "gpu-1", (0, 1), cause_id=job.id)
    assert t.decision(part0, T0) == []  # two of three placed: nothing bound yet
    binds = t.decision(placement(job.job_id, "gpu-2", (5,), cause_id=job.id), T0)
    assert len(binds) == 3
    assert all(isinstance(b, Bind) for b in binds)
    assert sorted(b.node for b in binds) == ["gpu-1", "gpu-1", "gpu-2"]
    # each member its own GPU of the part
    gpus = sorted(
        (
            b.node,
            json.loads(b.body["metadata"]["annotations"]["seedance.io/placement"])["gpus"][0][
                "index"
            ],
        )
        for b in binds
    )
    assert gpus == [("gpu-1", 0), ("gpu-1", 1), ("gpu-2", 5)]


def test_a_member_that_fails_to_bind_deletes_the_gang_and_cancels_its_job() -> None:
    t = tracker()
    members = _gang(2)
    for m in members:
        actions = t.pod_seen(m, T0)
    (job,) = published(actions)
    binds = t.decision(placement(job.job_id, "gpu-1", (0, 1), cause_id=job.id), T0)
    first, second = (b.ref for b in binds)
    assert t.bind_done(first, BindOutcome.BOUND, T0)
    actions = t.bind_done(second, BindOutcome.FAILED, T0, "422 Unprocessable")
    assert sorted(d.ref.uid for d in of(actions, DeletePod)) == sorted([first.uid, second.uid])
    assert {e.body["reason"] for e in of(actions, PostEvent)} == {"GangBindFailed"}
    (end,) = published(actions)
    assert isinstance(end, JobCancelled)
    assert end.job_id == job.job_id
    # the controller re-creates the pods: a new gang, a new job
    for m in members:
        t.pod_seen(m, T0, deleted=True)
    again = _gang(2)
    for m in again:
        actions = t.pod_seen(m, T0)
    (job2,) = published(actions)
    assert job2.job_id != job.job_id


def test_gang_members_asking_for_different_resources_are_refused() -> None:
    t = tracker()
    a, b = _gang(2)
    b["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 2}
    t.pod_seen(a, T0)
    actions = t.pod_seen(b, T0)
    assert published(actions) == []
    assert len(of(actions, PatchStatus)) == 2


def test_a_gang_finishes_when_every_member_succeeded() -> None:
    t = tracker()
    members = _gang(2)
    for m in members:
        actions = t.pod_seen(m, T0)
    (job,) = published(actions)
    binds = t.decision(placement(job.job_id, "gpu-1", (0, 1), cause_id=job.id), T0)
    for b in binds:
        t.bind_done(b.ref, BindOutcome.BOUND, T0)
    for m in members:
        m["spec"]["nodeName"] = "gpu-1"
    _terminated(members[0], "Succeeded", "2026-12-01T10:05:00Z")
    assert published(t.pod_seen(members[0], T0 + timedelta(minutes=6))) == []
    _terminated(members[1], "Succeeded", "2026-12-01T10:05:30Z")
    (end,) = published(t.pod_seen(members[1], T0 + timedelta(minutes=6)))
    assert isinstance(end, JobFinished)
    assert end.job_id == job.job_id


def test_nodes_become_inventory_published_when_they_change() -> None:
    t = tracker()
    n = node("gpu.node-1", gpus=4, product="H200", memory_mib=143771)
    (pub,) = t.node_seen(n, T0)
    inv = pub.event
    assert isinstance(inv, NodeInventory)
    assert pub.subject == "seedance.telemetry.gpu:node-1.inventory"
    assert [g.model for g in inv.gpus] == ["H200"] * 4
    assert inv.gpus[0].mem_total_mib == 143771
    assert inv.cpu_milli == 64_000
    assert inv.memory_mib == 512 * 1024
    assert t.node_seen(n, T0 + timedelta(seconds=10)) == []
    assert inv.state == NodeState.READY
    # Cordoned: nothing new lands there, its shape stays (the jobs there hold its GPUs).
    n["spec"]["unschedulable"] = True
    (pub,) = t.node_seen(n, T0 + timedelta(seconds=20))
    assert pub.event.state == NodeState.CORDONED
    assert len(pub.event.gpus) == 4
    n["spec"]["unschedulable"] = False
    (pub,) = t.node_seen(n, T0 + timedelta(seconds=25))
    assert (pub.event.state, len(pub.event.gpus)) == (NodeState.READY, 4)
    # The taint an autoscaler puts on a node it is about to delete cordons it too; a GPU
    # pool's own taint does not.
    n["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert t.node_seen(n, T0 + timedelta(seconds=26)) == []
    for taint in ("ToBeDeletedByClusterAutoscaler", "karpenter.sh/disrupted"):
        n["spec"]["taints"] = [{"key": taint, "effect": "NoSchedule"}]
        (pub,) = t.node_seen(n, T0 + timedelta(seconds=27))
        assert pub.event.state == NodeState.CORDONED, taint
        n["spec"]["taints"] = []
        (pub,) = t.node_seen(n, T0 + timedelta(seconds=28))
        assert pub.event.state == NodeState.READY
    (pub,) = t.node_seen(n, T0 + timedelta(seconds=30), deleted=True)
    assert pub.event.state == NodeState.REMOVED
    assert pub.event.gpus == []
    assert pub.event.cpu_milli == 0


# --- (tenant, job): a decision reaches a pod only under the pod's tenant -------------------


def _decisions(job_id: str, tenant: str) -> list[Any]:
    """Every kind of decision the slicer makes about ``job_id`` of ``tenant``."""
    return [
        placement(job_id, tenant=tenant),
        Unschedulable(
            id=new_event_id(), at=T0, job_id=job_id, tenant=tenant,
            reason=UnschedulableReason.NO_CAPACITY, detail="none",
        ),
        JobRejected(
            id=new_event_id(), at=T0, job_id=job_id, tenant=tenant,
            reason=RejectionReason.DUPLICATE_JOB, cause_type="job.submitted.v1",
        ),
        Preempted(
            id=new_event_id(), at=T0, job_id=job_id, tenant=tenant, node="gpu-1",
            reason="priority",
        ),
        JobReleased(
            id=new_event_id(), at=T0, job_id=job_id, tenant=tenant,
            outcome=EndOutcome.CANCELLED, was_placed=False,
        ),
    ]  # fmt: skip


def test_another_tenants_decision_about_a_pods_job_reaches_no_pod() -> None:
    # globex's decisions (the answers to jobs it submitted under acme's pods' ids) are refused:
    # nothing bound, deleted, patched or told; the pod's own decisions still act.
    t = tracker()
    waiting = pod(limits={"nvidia.com/gpu": 1})
    waiting_job = submit(t, waiting).job_id
    bound = pod(limits={"nvidia.com/gpu": 1})
    bound_job = _bound(t, bound)
    for job_id in (waiting_job, bound_job):
        for ev in _decisions(job_id, "globex"):
            assert t.decision(ev, T0) == [], ev
            assert t.foreign(ev)
            assert not t.holds(ev)
        # the pod's uid alone (its id before pods had a space of their own) is no pod's job
        for ev in _decisions(job_id.removeprefix("k8s:"), "globex"):
            assert t.decision(ev, T0) == []
            assert not t.foreign(ev)
    assert t.state_of(waiting["metadata"]["uid"]) is PodState.WAITING
    assert t.state_of(bound["metadata"]["uid"]) is PodState.BOUND
    # acme's own decisions do act
    assert of(t.decision(_decisions(waiting_job, "acme")[0], T0), Bind)
    assert of(t.decision(_decisions(bound_job, "acme")[3], T0), DeletePod)
    assert not t.foreign(_decisions(bound_job, "acme")[3])


def test_another_tenants_placement_of_a_gangs_job_is_neither_bound_nor_held() -> None:
    t = tracker()
    for m in _gang(2):
        actions = t.pod_seen(m, T0)
    (job,) = published(actions)
    part = placement(job.job_id, "gpu-1", (0, 1), cause_id=job.id, tenant="globex")
    assert t.decision(part, T0) == []
    assert t.foreign(part)
    assert not t.holds(part)  # acked at once: never the gang's to wait for
    pre = _decisions(job.job_id, "globex")[3]
    assert t.decision(pre, T0) == []
    ours = placement(job.job_id, "gpu-1", (0,), cause_id=job.id)
    assert t.decision(ours, T0) == []
    assert t.holds(ours)  # half the gang placed: held until the rest comes


def test_a_pod_bound_before_pod_jobs_had_their_own_space_keeps_its_job_until_it_ends() -> None:
    # Bound by the bridge before the upgrade: its annotation names its bare uid as the job.
    old = pod(limits={"nvidia.com/gpu": 1})
    _bound(tracker(), old)
    doc = json.loads(old["metadata"]["annotations"]["seedance.io/placement"])
    uid = old["metadata"]["uid"]
    doc["jobId"] = uid
    old["metadata"]["annotations"]["seedance.io/placement"] = json.dumps(doc)
    t = restarted(("acme", uid))
    assert t.pod_seen(old, T0) == []  # adopted: nothing submitted again
    assert t.state_of(uid) is PodState.BOUND
    assert t.live_jobs() == {("acme", uid)}
    # its tenant's decisions reach it under the old id; another tenant's do not
    assert t.decision(_decisions(uid, "globex")[3], T0) == []
    assert t.foreign(_decisions(uid, "globex")[3])
    assert of(t.decision(_decisions(uid, "acme")[3], T0), DeletePod)
    (end,) = published(t.pod_seen(old, T0 + timedelta(seconds=1), deleted=True))
    assert isinstance(end, JobCancelled)
    assert (end.tenant, end.job_id) == ("acme", uid)


def test_live_jobs_are_tenant_and_job() -> None:
    t = tracker()
    t.bindings = {"team-a": "acme", "team-b": "globex"}
    a = pod(namespace="team-a", limits={"nvidia.com/gpu": 1})
    b = pod(namespace="team-b", limits={"nvidia.com/gpu": 1})
    jobs = {submit(t, a).job_id: "acme", submit(t, b).job_id: "globex"}
    assert t.live_jobs() == {(tenant, job) for job, tenant in jobs.items()}


def test_a_relabelled_namespace_leaves_a_bound_pod_under_its_jobs_tenant() -> None:
    p = pod(limits={"nvidia.com/gpu": 1})
    job = _bound(tracker(), p)
    t = restarted(("acme", job))
    t.bindings = {"team-a": "globex"}  # relabelled while no bridge ran
    assert t.pod_seen(p, T0) == []
    assert t.live_jobs() == {("acme", job)}
    (end,) = published(t.pod_seen(p, T0 + timedelta(seconds=1), deleted=True))
    assert (end.tenant, end.job_id) == ("acme", job)


def test_a_pod_of_a_namespace_bound_to_no_tenant_is_taken_once_it_is() -> None:
    t = tracker()
    p = pod(namespace="early", limits={"nvidia.com/gpu": 1})
    refused = t.pod_seen(p, T0)
    assert published(refused) == []
    assert "no_tenant" in of(refused, PatchStatus)[0].body["status"]["conditions"][0]["message"]
    assert t.namespace_seen({"metadata": {"name": "other", "labels": {}}}, T0) == []
    label = {"metadata": {"name": "early", "labels": {"seedance.io/tenant": "acme"}}}
    (submitted,) = published(t.namespace_seen(label, T0))
    assert (submitted.tenant, submitted.job_id) == ("acme", pod_job_id(p["metadata"]["uid"]))
    assert t.namespace_seen(label, T0) == []  # once
    q = pod(namespace="late", limits={"nvidia.com/gpu": 1})
    t.pod_seen(q, T0)
    (by_quota,) = published(t.rebind({"team-a": "acme", "late": "globex"}, T0))
    assert by_quota.tenant == "globex"


def test_a_pod_of_another_tenant_neither_joins_nor_counts_toward_a_group() -> None:
    t = tracker()
    a, b = _gang(2)
    assert t.pod_seen(a, T0) == []
    t.bindings = {"team-a": "globex"}  # relabelled: b is globex's
    refused = t.pod_seen(b, T0)
    assert published(refused) == []
    assert "tenant 'acme'" in of(refused, PatchStatus)[0].body["status"]["conditions"][0]["message"]
    assert t.state_of(a["metadata"]["uid"]) is PodState.GROUPING
    assert t.state_of(b["metadata"]["uid"]) is PodState.REFUSED
    t.bindings = {"team-a": "acme"}
    c = _gang(2)[0]
    (job,) = published(t.pod_seen(c, T0))  # acme's second member completes acme's group
    assert job.tenant == "acme"
    assert job.request.gang_size == 2


def test_a_pod_that_ended_before_a_restart_is_remembered_not_refused() -> None:
    # Its end went out, so its record is gone: the restarted bridge tells it nothing.
    p = pod(limits={"nvidia.com/gpu": 1})
    _bound(tracker(), p)
    _terminated(p, "Succeeded", "2026-12-01T10:05:00Z")
    t = restarted()
    assert t.pod_seen(p, T0 + timedelta(minutes=6)) == []
    assert t.state_of(p["metadata"]["uid"]) is PodState.ENDED
    assert t.pod_seen(p, T0 + timedelta(minutes=7), deleted=True) == []
