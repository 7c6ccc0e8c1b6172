"""Capacity release and PodDisruptionBudgets on the test API server (issue 30): a real slicer
consolidates movable pods off a node and holds it empty; the bridge cordons and taints that
node (the fields cluster-autoscaler and Karpenter read are checked on the API server's
objects), evicts the moved pod through ``pods/eviction``, and lifts the mark when the slicer
takes the node back. A PodDisruptionBudget that allows no disruption refuses the move: the pod
stays where it is, the bridge reports the refusal and the slicer puts the job back there. An
eviction the API server never answers is given up after the bridge's tries and reported the
same way, so the slicer puts that job back too."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client

from seedance.events.jobs import JobMoveRefused, MoveRefusedCause, pod_job_id
from seedance.events.slicing import Placement, Preempted
from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.kube import USER_AGENT
from seedance.k8s_bridge.service import DURABLE, BridgeService
from seedance.slicer.service import SlicerService
from seedance.testing.waits import eventually, wait_consumer_settled
from tests.integration.k8s.bridge import Env, bridge, gpu_node, slicer

pytestmark = pytest.mark.timeout(90)

TAINT = "seedance.io/releasing"
#: What the autoscalers read that would keep a node (docs/k8s-bridge.md, "Capacity release").
CA_SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
CA_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"


async def until(pred: Any, timeout_s: float = 20.0, what: str = "") -> None:
    async def check() -> bool:
        return bool(await pred())

    await eventually(check, timeout_s, what=what or getattr(pred, "__name__", None))


async def ready(env: Env, name: str) -> None:
    """Report the pod running and Ready, as its kubelet would (a PDB counts Ready pods)."""
    body = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    resp = await env.core.patch_namespaced_pod_status(name, env.ns, body, _preload_content=False)
    assert resp.status == 200, await resp.text()


async def finish_after(env: Env, name: str, after: datetime) -> None:
    """The pod succeeded, as its kubelet reports it, in a second later than ``after`` (the
    slicer's last decision): ``finishedAt`` has whole seconds, and an end stamped before the
    slicer's latest time moves no consolidation round (the slicer's trusted time only goes
    forward). So the report waits for the clock to pass that second, as a pod runs on."""
    second = after.replace(microsecond=0) + timedelta(seconds=1)

    async def passed() -> bool:
        return datetime.now(UTC) >= second

    await until(passed, 5)
    terminated = {"exitCode": 0, "finishedAt": second.strftime("%Y-%m-%dT%H:%M:%SZ")}
    status = {"phase": "Succeeded", "containerStatuses": [{
        "name": "main", "image": "registry.example/train:1", "imageID": "", "ready": False,
        "restartCount": 0, "state": {"terminated": terminated},
    }]}  # fmt: skip
    resp = await env.core.patch_namespaced_pod_status(
        name, env.ns, {"status": status}, _preload_content=False
    )
    assert resp.status == 200, await resp.text()


def marked(node: client.V1Node) -> bool:
    return any(t.key == TAINT for t in node.spec.taints or [])


def marked_gauge(br: BridgeService) -> float:
    """The bridge's own count of the nodes it marked (set once a patch has answered)."""
    return float(br.metrics.nodes_marked._value.get())


@asynccontextmanager
async def consolidating(
    env: Env, pdb: dict[str, Any] | None = None, hold_s: float = 2.0, **bridge_kw: Any
) -> AsyncIterator[tuple[SlicerService, BridgeService, str, str]]:
    """Node A runs an unmovable filler and a movable mover (Ready, labelled ``app=mover``);
    node B runs a 3-GPU job and has one GPU free. The filler's end lets the slicer drain A.
    ``bridge_kw``: the bridge's settings besides the cluster and a 0.3 s eviction retry."""
    a, b = f"gpu-a-{env.unique}", f"gpu-b-{env.unique}"
    gpu_node(env.kube, a, gpus=4)
    async with (
        slicer(
            env.nats_url, env.unique, consolidate_interval_s=1e-6, consolidate_hold_s=hold_s
        ) as s,
        bridge(
            env.kube, env.nats_url, env.unique, env.tmp_path, cluster=f"c-{env.unique}",
            evict_retry_s=0.3, **bridge_kw,
        ) as br,
    ):  # fmt: skip
        await env.create_pod("filler")
        await env.create_pod(
            "mover", labels={"app": "mover"}, annotations={"seedance.io/movable": "true"}
        )
        for name in ("filler", "mover"):
            assert (await env.bound(name)).spec.node_name == a
        await ready(env, "mover")
        if pdb is not None:
            policy = client.PolicyV1Api(env.core.api_client)
            await policy.create_namespaced_pod_disruption_budget(env.ns, pdb)
        gpu_node(env.kube, b, gpus=4)
        await env.create_pod("other", gpus=3)  # only B has 3 GPUs free
        assert (await env.bound("other")).spec.node_name == b
        other = (await env.pod("other")).metadata.uid
        (placed,) = env.trail.of(Placement, pod_job_id(other))
        await finish_after(env, "filler", placed.at)
        yield s, br, a, b


async def test_a_node_the_slicer_empties_is_cordoned_tainted_and_given_back(env: Env) -> None:
    async with consolidating(env) as (s, br, a, b):
        seen: list[client.V1Node] = []

        async def a_marked() -> bool:
            seen[:] = [await env.core.read_node(a)]
            return marked(seen[0])

        await until(a_marked)
        node = seen[0]  # as the check saw it: a second read could differ
        # What cluster-autoscaler and Karpenter read: nothing new lands (cordon + NoSchedule
        # taint), nothing keeps the node (no scale-down-disabled annotation) ...
        assert node.spec.unschedulable is True
        (taint,) = [t for t in node.spec.taints if t.key == TAINT]
        assert (taint.value, taint.effect) == (f"c-{env.unique}", "NoSchedule")
        assert CA_SCALE_DOWN_DISABLED not in (node.metadata.annotations or {})
        assert not marked(await env.core.read_node(b))

        # ... and no Seedance pod still runs there: the mover was evicted (pods/eviction).
        async def a_empty() -> bool:
            pods = await env.core.list_namespaced_pod(env.ns, field_selector=f"spec.nodeName={a}")
            return all(p.status.phase in ("Succeeded", "Failed") for p in pods.items)

        await until(a_empty)
        pods = await env.core.list_namespaced_pod(env.ns, field_selector=f"spec.nodeName={a}")
        for p in pods.items:
            annotations = p.metadata.annotations or {}
            assert annotations.get(CA_SAFE_TO_EVICT) != "false"
            assert annotations.get(KARPENTER_DO_NOT_DISRUPT) != "true"
        (pre,) = [e for e in env.trail.of(Preempted) if e.node == a]
        assert pre.reason == "consolidation"
        # The bridge counts its mark once the patch has answered, which can be after the API
        # server shows it: wait for its own account rather than race it.
        await eventually(lambda: marked_gauge(br) == 1, 5, what="the bridge counts one node marked")

        # The fleet did not remove A: once the slicer's hold lapses (its trusted time, the
        # next input's), it takes A back, and the bridge lifts the cordon and the taint.
        until_s = s.scheduler._moves.drained[a]

        async def hold_over() -> bool:
            return time.time() > until_s

        await until(hold_over, 10)
        await env.create_pod("late")  # an input: the slicer's next round is after the hold

        async def a_given_back() -> bool:
            seen[:] = [await env.core.read_node(a)]
            return not marked(seen[0]) and not seen[0].spec.unschedulable

        await until(a_given_back)
        assert "seedance.io/releasing" not in (seen[0].metadata.annotations or {})
        await eventually(lambda: marked_gauge(br) == 0, 5, what="the bridge counts no node marked")
    used = env.kube.verbs_used(user_agent=USER_AGENT)
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert {("", "nodes", "patch"), ("", "pods/eviction", "create")} <= used <= declared


async def test_a_pdb_refuses_a_move_and_the_slicer_puts_the_job_back(env: Env) -> None:
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "mover-pdb"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "mover"}}},
    }
    async with consolidating(env, pdb) as (s, br, a, b):

        async def blocked() -> bool:
            return "EvictionBlocked" in await env.reasons("mover")

        await until(blocked)
        # The budget holds: the pod still runs on A, and its Event says why.
        mover = await env.pod("mover")
        assert mover.spec.node_name == a
        assert mover.metadata.deletion_timestamp is None
        (ev,) = [e for e in await env.events_of("mover") if e.reason == "EvictionBlocked"]
        assert "mover-pdb needs 1 healthy pods and has 1 currently" in ev.message
        assert ev.type == "Warning"
        refused = await put_back(env, s, br, a, b)
        assert refused.cause is MoveRefusedCause.DISRUPTION_BUDGET
        assert "mover-pdb" in refused.reason
        assert br.metrics.evictions_blocked_total._value.get() == 1  # reported, not retried


async def test_an_eviction_never_answered_is_given_up_and_the_slicer_puts_the_job_back(
    env: Env,
) -> None:
    """The API server answers every eviction of the mover 503: after the bridge's 3 tries the
    move is reported refused (cause ``unanswered``), so the slicer does not believe it moved."""
    fault = env.kube.fail_next("POST", r"/pods/mover/eviction$", 503, count=1000)
    async with consolidating(env, hold_s=10.0, evict_tries=3) as (s, br, a, b):
        refused = await put_back(env, s, br, a, b)
        assert refused.cause is MoveRefusedCause.UNANSWERED
        assert "did not answer the eviction in 3 tries" in refused.reason
        assert fault.remaining == 1000 - 3  # tried 3 times, then no more
        writes = br.metrics.api_writes_total
        assert writes.labels("evict_pod", "retry")._value.get() == 2
        assert writes.labels("evict_pod", "gave_up")._value.get() == 1
        assert "EvictionBlocked" not in await env.reasons("mover")


async def put_back(env: Env, s: SlicerService, br: BridgeService, a: str, b: str) -> JobMoveRefused:
    """The mover's move off A was not carried out: the bridge reports it (once, for that
    decision) and the slicer undoes the move (the job back on A's GPUs it held, its placement
    on B ended at the refusal), the pod untouched on A. The report."""
    mover = await env.pod("mover")
    job = pod_job_id(mover.metadata.uid)

    async def undone() -> bool:
        return len(env.trail.of(Placement, job)) == 3 and bool(env.trail.of(JobMoveRefused))

    await until(undone)
    pre, ended = env.trail.of(Preempted, job)
    assert (pre.reason, pre.node) == ("consolidation", a)
    (refused,) = env.trail.of(JobMoveRefused, job)
    assert (refused.node, refused.decision_id) == (a, pre.id)
    placements = env.trail.of(Placement, job)
    assert [p.node for p in placements] == [a, b, a]
    assert (ended.reason, ended.node) == ("move_refused", b)
    back = placements[-1]
    assert ended.at == back.at >= refused.at  # billed on B up to the refusal, on A after
    assert back.gpus == placements[0].gpus  # the very GPUs it never left
    assert [p for p in placements if p.node == b and p.at >= refused.at] == []
    # The slicer's state says the same: the job runs on A, and A is no longer held empty.
    sched = s.scheduler
    rec = sched._queue.running_record(f"{pre.tenant}/{job}")
    assert rec is not None
    assert [sched._nodes[p.node].name for p in rec.placements] == [a]
    assert a not in sched._moves.drained
    assert s.metrics.refused_moves_total.labels("undone")._value.get() == 1
    # ... and the pod was never touched: once the bridge has handled the end of the
    # placement on B (acknowledged after its writes), it is still bound to A, not deleted.
    durable = f"{DURABLE}-{br._settings.instance}" if br._settings.instance else DURABLE
    await wait_consumer_settled(env.bus, "SEEDANCE_SLICING", durable, env.trail.seqs[ended.id])
    mover = await env.pod("mover")
    assert mover.spec.node_name == a
    assert mover.metadata.deletion_timestamp is None
    return refused


async def test_a_new_leader_reads_the_marks_from_the_nodes_and_gives_the_node_back(
    env: Env,
) -> None:
    """The mark is the record: the bridge that cordoned A stops, a standby takes the lead with
    nothing but the Nodes to go on, and lifts A's mark when the slicer takes A back."""
    # A hold long enough for the hand-over (the lease lapses in 1.5 s) to come first.
    async with consolidating(env, hold_s=8.0) as (s, first, a, _b):

        async def a_marked() -> bool:
            return marked(await env.core.read_node(a))

        await until(a_marked)
        until_s = s.scheduler._moves.drained[a]
        async with bridge(
            env.kube, env.nats_url, env.unique, env.tmp_path, replica="b",
            cluster=f"c-{env.unique}",
        ) as second:  # fmt: skip
            await first.stop()  # its lease lapses; the standby takes over

            async def second_leads_with_the_mark() -> bool:
                release = second.release
                return bool(
                    second.leading and release and release.marks and a in release.marks.marked
                )

            await until(second_leads_with_the_mark)

            async def hold_over() -> bool:
                return time.time() > until_s

            await until(hold_over, 10)
            await env.create_pod("late")

            async def a_given_back() -> bool:
                n = await env.core.read_node(a)
                return not marked(n) and not n.spec.unschedulable

            await until(a_given_back)
            await eventually(lambda: marked_gauge(second) == 0, 5, what="no node marked")
