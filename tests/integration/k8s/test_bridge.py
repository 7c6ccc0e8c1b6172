"""The k8s-bridge end to end: the test API server (real HTTP, through kubernetes_asyncio), a
real nats-server and a real SlicerService. A pod goes pending -> job.submitted -> placement
-> Binding + annotation + Event; its end becomes the job's; refusals, waits, deletions,
preemption, gangs, restarts of the bridge and of the API server, 410 relists, duplicate
Bindings and the leader hand-over."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted, pod_job_id
from seedance.events.slicing import JobReleased, Placement
from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.kube import USER_AGENT
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import Env, bridge, gpu_node, slicer

pytestmark = pytest.mark.timeout(90)


async def test_a_pending_pod_is_placed_bound_annotated_and_its_end_reported(env: Env) -> None:
    node = f"gpu-{env.unique}"
    gpu_node(env.kube, node, gpus=8)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b,
    ):
        created = await env.create_pod("train", gpus=2)
        uid = created["metadata"]["uid"]
        pod = await env.bound("train")
        assert pod.spec.node_name == node
        doc = json.loads(pod.metadata.annotations["seedance.io/placement"])
        assert doc["podUid"] == uid
        assert doc["jobId"] == pod_job_id(uid)
        assert doc["tenant"] == env.tenant
        assert len(doc["gpus"]) == 2
        assert {c.type: c.status for c in pod.status.conditions}["PodScheduled"] == "True"
        (submitted,) = env.trail.of(JobSubmitted, pod_job_id(uid))
        assert submitted.request.gpus == 2
        (placed,) = env.trail.of(Placement, pod_job_id(uid))
        assert [g.index for g in placed.gpus] == [g["index"] for g in doc["gpus"]]

        async def scheduled() -> bool:
            return "Scheduled" in await env.reasons("train")

        await eventually(scheduled, 10)
        (event,) = [e for e in await env.events_of("train") if e.reason == "Scheduled"]
        assert node in event.message
        assert event.source.component == "seedance-scheduler"
        await env.finish("train")

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, pod_job_id(uid)))

        await eventually(released, 10)
        (end,) = env.trail.of(JobFinished, pod_job_id(uid))
        (rel,) = env.trail.of(JobReleased, pod_job_id(uid))
        assert rel.outcome == "finished"
        assert rel.was_placed
        # the bill's end: the kubelet's finishedAt (10:00:00, behind the bridge's clock here)
        # is bounded below by the bind, so the job ends at its bind time, never before
        bound_at = datetime.fromisoformat(doc["boundAt"].replace("Z", "+00:00"))
        assert end.at == bound_at
        assert end.at >= placed.at
        assert b.metrics.pods_bound_total._value.get() == 1
    # everything the bridge did is in its RBAC declaration
    used = env.kube.verbs_used(user_agent=USER_AGENT)
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert used <= declared
    assert ("", "pods/binding", "create") in used


async def _true(value: bool) -> bool:
    return value


async def _eventually(pred, timeout_s: float = 15.0, what: str | None = None) -> None:  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return bool(await pred())

    await eventually(check, timeout_s, what=what or getattr(pred, "__name__", None))


async def test_a_pod_with_node_name_preset_is_refused_never_bound_nor_billed(env: Env) -> None:
    node = f"gpu-{env.unique}"
    gpu_node(env.kube, node, gpus=8)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        created = await env.create_pod("sneaky", node_name=node)
        preset = await env.create_pod(
            "forged", annotations={"seedance.io/placement": '{"node": "x"}'}
        )

        async def refused() -> bool:
            reasons = [await env.reasons(n) for n in ("sneaky", "forged")]
            return all("FailedScheduling" in r for r in reasons)

        await _eventually(refused)
        pod = await env.pod("sneaky")
        cond = {c.type: c for c in pod.status.conditions}["PodScheduled"]
        assert (cond.status, cond.reason) == ("False", "SeedanceRefused")
        assert "node_name_preset" in cond.message
        forged = await env.pod("forged")
        assert not forged.spec.node_name
        assert (
            "placement_preset"
            in {c.type: c for c in forged.status.conditions}["PodScheduled"].message
        )
        for uid in (created["metadata"]["uid"], preset["metadata"]["uid"]):
            assert env.trail.of(JobSubmitted, pod_job_id(uid)) == []


async def test_an_unschedulable_pod_shows_the_slicers_reason_and_deleting_it_cancels(
    env: Env,
) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=4)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        created = await env.create_pod("huge", gpus=8)
        uid = created["metadata"]["uid"]

        # The bridge publishes the node and the job together, and the slicer may decide the
        # job before it has read the node ("no_capacity: no node inventory received yet"); it
        # judges the held job again once the node is known: wait for that answer.
        async def waiting() -> bool:
            pod = await env.pod("huge")
            conds = {c.type: c for c in pod.status.conditions or []}
            cond = conds.get("PodScheduled")
            return (
                cond is not None
                and cond.reason == "Unschedulable"
                and (cond.message or "").startswith("unsatisfiable:")
            )

        await _eventually(waiting)
        pod = await env.pod("huge")
        message = {c.type: c for c in pod.status.conditions}["PodScheduled"].message
        # No node of the fleet has 8 GPUs: said at once, as cluster-autoscaler reads it
        # (PodScheduled=False, Unschedulable), with what no node offers (issue 28, item 5).
        assert message.startswith("unsatisfiable: gpus=8 per member: a node has at most 4 GPUs")
        assert "FailedScheduling" in await env.reasons("huge")
        assert not pod.spec.node_name
        await env.core.delete_namespaced_pod("huge", env.ns)

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, pod_job_id(uid)))

        await _eventually(released)
        (cancel,) = env.trail.of(JobCancelled, pod_job_id(uid))
        assert cancel.reason == "pod deleted"
        (rel,) = env.trail.of(JobReleased, pod_job_id(uid))
        assert rel.outcome == "cancelled"
        assert not rel.was_placed


async def test_a_pod_deleted_while_its_binding_is_in_flight_is_cancelled(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    # The Binding finds the pod gone (the API server's 404): the job is cancelled, not bound.
    env.kube.fail_next("POST", r"/pods/gone/binding$", 404, message='pods "gone" not found')
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        created = await env.create_pod("gone")
        uid = created["metadata"]["uid"]

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, pod_job_id(uid)))

        await _eventually(released)
        (rel,) = env.trail.of(JobReleased, pod_job_id(uid))
        assert rel.outcome == "cancelled"
        assert rel.was_placed  # placed, then its pod was gone: what it held is free again
        assert not (await env.pod("gone")).spec.node_name


async def test_a_duplicate_binding_is_handled(env: Env) -> None:
    """The first Bindings fail for now (503). Before their retry, with the bridge's watches
    cut off (so only the retry's 409 can tell it), one pod is bound where the slicer put it,
    as an earlier leader would have, and another is bound elsewhere. The first 409 is taken as
    bound, once; the second makes the job fail, with a Warning."""
    node = f"gpu-{env.unique}"
    gpu_node(env.kube, node, gpus=8)
    for name in ("dup", "taken"):
        env.kube.fail_next("POST", rf"/pods/{name}/binding$", 503)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path, bind_retry_s=3.0) as b,
    ):
        dup = await env.create_pod("dup")
        taken = await env.create_pod("taken")

        async def refused_twice() -> bool:
            return sum(r.code == 503 and "binding" in r.path for r in env.kube.audit) == 2

        await _eventually(refused_twice)
        blind = env.kube.fail_next("GET", r"[?&]watch=", 500, count=10**6)
        await env.kube.stop()  # cuts the open watches; they cannot come back while blind
        await env.kube.start()
        for name, target in (("dup", node), ("taken", "elsewhere")):
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": target},
            }
            resp = await env.core.create_namespaced_pod_binding(
                name, env.ns, body, _preload_content=False
            )
            assert resp.status == 201

        async def conflicted() -> bool:
            return sum(r.code == 409 and "binding" in r.path for r in env.kube.audit) == 2

        await _eventually(conflicted)
        blind.remaining = 0
        uid_dup, uid_taken = dup["metadata"]["uid"], taken["metadata"]["uid"]

        async def settled() -> bool:
            return bool(env.trail.of(JobReleased, pod_job_id(uid_taken))) and "Scheduled" in (
                await env.reasons("dup")
            )

        await _eventually(settled)
        assert (await env.pod("dup")).spec.node_name == node
        assert env.trail.of(JobReleased, pod_job_id(uid_dup)) == []  # still running, as bound
        (failed,) = env.trail.of(JobFailed, pod_job_id(uid_taken))
        assert "elsewhere" in failed.reason
        warnings = [e for e in await env.events_of("taken") if e.type == "Warning"]
        assert any("elsewhere" in e.message for e in warnings)
        assert b.metrics.pods_bound_total._value.get() == 1


async def test_a_restarted_bridge_resumes_loses_nothing_and_duplicates_nothing(env: Env) -> None:
    """While the bridge is down a pod is created and a bound one ends: the restarted bridge
    binds the first and reports the second's end; nothing it did before is done twice."""
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    async with slicer(env.nats_url, env.unique):
        async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path):
            before = await env.create_pod("before")
            await env.bound("before")
        submitted_before = len(env.trail.of(JobSubmitted))
        during = await env.create_pod("during")
        await env.finish("before")
        async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path, replica="a"):
            await env.bound("during")
            uid = before["metadata"]["uid"]

            async def released() -> bool:
                return bool(env.trail.of(JobReleased, pod_job_id(uid)))

            await _eventually(released)
        assert len(env.trail.of(JobSubmitted)) == submitted_before + 1
        # the re-sent submit of "before" (same id) was dropped by the stream: one each
        assert len(env.trail.of(JobSubmitted, pod_job_id(uid))) == 1
        assert len(env.trail.of(Placement, pod_job_id(uid))) == 1
        assert len(env.trail.of(Placement, pod_job_id(during["metadata"]["uid"]))) == 1
        scheduled = [e for e in await env.events_of("before") if e.reason == "Scheduled"]
        assert len(scheduled) == 1


async def test_the_watch_resumes_across_an_api_server_restart_and_relists_after_410(
    env: Env,
) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b,
    ):
        await env.create_pod("first")
        await env.bound("first")
        assert b.pods.lists == 1
        # a restart mid-watch: the watch resumes from its resourceVersion, no relist
        await env.kube.stop()
        await env.kube.start()
        await env.create_pod("second")
        await env.bound("second")
        assert b.pods.lists == 1
        # the revision the watch holds is compacted away while the server is down, and a pod
        # goes meanwhile: 410, relist, and the difference with the cache is the missed DELETED
        await env.kube.stop()
        rt = env.kube.api.resolve("", "v1", "pods")
        first = env.kube.api.delete(rt, env.ns, "first")
        env.kube.compact()
        await env.kube.start()
        await env.create_pod("third")
        await env.bound("third")
        assert b.pods.lists == 2
        uid = first["metadata"]["uid"]

        async def ended() -> bool:
            return bool(env.trail.of(JobCancelled, pod_job_id(uid)))

        await _eventually(ended)
        gone = b.metrics.watch_restarts_total.labels("pods", "gone")._value.get()
        assert gone >= 1


async def test_preemption_deletes_the_victim_with_an_event(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=1)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        low = await env.create_pod("low", priority=0)
        await env.bound("low")
        high = await env.create_pod("high", priority=1000)
        await env.bound("high")

        async def gone() -> bool:
            pods = await env.core.list_namespaced_pod(env.ns)
            return "low" not in {p.metadata.name for p in pods.items}

        await _eventually(gone)
        events = await env.events_of("low")
        (pre,) = [e for e in events if e.reason == "Preempted"]
        assert pre.type == "Warning"
        assert high["metadata"]["uid"] in pre.message
        uid = low["metadata"]["uid"]

        async def ended() -> bool:
            return bool(env.trail.of(JobCancelled, pod_job_id(uid)))

        await _eventually(ended)


def _gang(n: int, group: str = "g1") -> dict[str, str]:
    return {"seedance.io/pod-group": group, "seedance.io/pod-group-size": str(n)}


async def test_a_gang_is_bound_all_or_nothing(env: Env) -> None:
    # two GPUs per node: three one-GPU members must span two nodes
    for i in (1, 2):
        gpu_node(env.kube, f"gpu{i}-{env.unique}", gpus=2)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        await env.create_pod("w-0", labels=_gang(3))
        await env.create_pod("w-1", labels=_gang(3))
        await env.core.list_namespaced_pod(env.ns)  # a round trip: the bridge saw both
        assert env.trail.of(JobSubmitted) == []
        assert not (await env.pod("w-0")).spec.node_name
        await env.create_pod("w-2", labels=_gang(3))
        pods = [await env.bound(f"w-{i}") for i in range(3)]
        (job,) = env.trail.of(JobSubmitted)
        assert job.request.gang_size == 3
        assert len({p.spec.node_name for p in pods}) == 2
        docs = [json.loads(p.metadata.annotations["seedance.io/placement"]) for p in pods]
        assert {d["jobId"] for d in docs} == {job.job_id}
        slots = {(d["node"], d["gpus"][0]["index"]) for d in docs}
        assert len(slots) == 3  # each member its own GPU


async def test_a_gang_member_that_cannot_be_bound_deletes_the_gang(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=4)
    env.kube.fail_next("POST", r"/pods/w-1/binding$", 422, message="injected: refused")
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path),
    ):
        for i in range(3):
            await env.create_pod(f"w-{i}", labels=_gang(3))

        async def deleted() -> bool:
            pods = await env.core.list_namespaced_pod(env.ns)
            return not pods.items

        await _eventually(deleted)
        for i in range(3):
            reasons = await env.reasons(f"w-{i}")
            assert "GangBindFailed" in reasons
        (job,) = env.trail.of(JobSubmitted)

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, job.job_id))

        await _eventually(released)
        (rel,) = env.trail.of(JobReleased, job.job_id)
        assert rel.outcome == "cancelled"
        # the controller re-creates the group: a new gang, a new job, bound
        for i in range(3):
            await env.create_pod(f"w-{i}", labels=_gang(3))
        for i in range(3):
            await env.bound(f"w-{i}")
        assert len(env.trail.of(JobSubmitted)) == 2


async def test_the_standby_takes_over_when_the_leader_goes(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path, replica="a") as a,
    ):
        await _eventually(lambda: _true(a.leading), what="bridge-a leads")
        async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path, replica="b") as b:
            await env.create_pod("one")
            await env.bound("one")
            assert not b.leading
            (one,) = [e for e in await env.events_of("one") if e.reason == "Scheduled"]
            assert one.reporting_instance == "bridge-a"
            await a.stop()  # a clean stop releases the Lease: b need not wait out its duration
            await _eventually(lambda: _true(b.leading), what="bridge-b leads")
            await env.create_pod("two")
            await env.bound("two")
            (two,) = [e for e in await env.events_of("two") if e.reason == "Scheduled"]
            assert two.reporting_instance == "bridge-b"
            lease = await env.kube_lease(f"bridge-{env.unique}")
            assert lease["spec"]["holderIdentity"] == "bridge-b"
            assert lease["spec"]["leaseTransitions"] == 1
            # the hand-over re-sent nothing that reached the slicer twice
            assert len(env.trail.of(Placement)) == 2


async def test_a_bridge_that_lost_the_lease_acts_on_nothing_before_it_steps_down(
    env: Env,
) -> None:
    # The runtime steps down at its next poll; meanwhile the watches' changes and the decisions
    # must not reach the tracker of a term that is over (a standby may already lead).
    async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as a:
        await _eventually(lambda: _true(a.leading), what="bridge-a leads")
        assert a.view._tracker() is a.tracker
        a.elector.leading.clear()  # the elector could not renew in time
        assert not a.leading
        assert a.view._tracker() is None


async def test_a_node_the_bridge_cannot_read_stops_nothing_else(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    gpu_node(env.kube, f"odd-{env.unique}", gpus=8, x="y")
    rt = env.kube.api.resolve("", "v1", "nodes")
    odd = env.kube.api.get(rt, "", f"odd-{env.unique}")
    odd["status"]["allocatable"]["cpu"] = "lots"  # no quantity: node_inventory raises on it
    env.kube.api.update(rt, "", odd["metadata"]["name"], odd, "status")
    async with (
        slicer(env.nats_url, env.unique),
        bridge(env.kube, env.nats_url, env.unique, env.tmp_path) as b,
    ):
        await env.create_pod("fine")
        pod = await env.bound("fine")
        assert pod.spec.node_name == f"gpu-{env.unique}"
        assert b.metrics.object_errors_total.labels("nodes")._value.get() >= 1


async def test_a_pod_deleted_while_no_bridge_ran_still_ends_its_job(env: Env) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=8)
    async with slicer(env.nats_url, env.unique):
        async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path):
            lost = await env.create_pod("lost")
            await env.bound("lost")
            kept = await env.create_pod("kept")
            await env.bound("kept")
        await env.core.delete_namespaced_pod("lost", env.ns)  # nobody watches
        async with bridge(env.kube, env.nats_url, env.unique, env.tmp_path):
            uid = lost["metadata"]["uid"]

            async def released() -> bool:
                return bool(env.trail.of(JobReleased, pod_job_id(uid)))

            await _eventually(released)
            (rel,) = env.trail.of(JobReleased, pod_job_id(uid))
            assert rel.outcome == "cancelled"
            assert rel.was_placed
            # the pod that is still there keeps its job
            assert env.trail.of(JobReleased, pod_job_id(kept["metadata"]["uid"])) == []
