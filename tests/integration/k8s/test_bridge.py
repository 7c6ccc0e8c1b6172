"""The k8s-bridge end to end: the test API server (real HTTP, through kubernetes_asyncio), a
real nats-server and a real SlicerService. A pod goes pending -> job.submitted -> placement
-> Binding + annotation + Event; its end becomes the job's; refusals, waits, deletions,
preemption, gangs, restarts of the bridge and of the API server, 410 relists, duplicate
Bindings and the leader hand-over."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from seedance.core import Bus
from seedance.events.jobs import JobFinished, JobSubmitted
from seedance.events.slicing import JobReleased, Placement
from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.kube import USER_AGENT
from seedance.testing.kube_api import KubeApiServer
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import Env, bridge, environment, gpu_node, slicer

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def env(
    kube_api: KubeApiServer, bus: Bus, unique: str, tmp_path: Path, nats_url: str
) -> AsyncIterator[Env]:
    async with environment(kube_api, bus, unique, tmp_path, nats_url) as e:
        yield e


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
        assert doc["jobId"] == uid
        assert doc["tenant"] == env.tenant
        assert len(doc["gpus"]) == 2
        assert {c.type: c.status for c in pod.status.conditions}["PodScheduled"] == "True"
        (submitted,) = env.trail.of(JobSubmitted, uid)
        assert submitted.request.gpus == 2
        (placed,) = env.trail.of(Placement, uid)
        assert [g.index for g in placed.gpus] == [g["index"] for g in doc["gpus"]]

        async def scheduled() -> bool:
            return "Scheduled" in await env.reasons("train")

        await eventually(scheduled, 10)
        (event,) = [e for e in await env.events_of("train") if e.reason == "Scheduled"]
        assert node in event.message
        assert event.source.component == "seedance-scheduler"
        await env.finish("train")

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, uid))

        await eventually(released, 10)
        (end,) = env.trail.of(JobFinished, uid)
        (rel,) = env.trail.of(JobReleased, uid)
        assert rel.outcome == "finished"
        assert rel.was_placed
        # the bill's end: the kubelet's finishedAt, bounded below by the bind
        assert end.at >= placed.at.replace(microsecond=0) or end.at == placed.at
        assert b.metrics.pods_bound_total._value.get() == 1
    # everything the bridge did is in its RBAC declaration
    used = env.kube.verbs_used(user_agent=USER_AGENT)
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert used <= declared
    assert ("", "pods/binding", "create") in used
