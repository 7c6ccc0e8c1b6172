"""(tenant, job) in the k8s-bridge: a bus tenant's job never reaches a pod, and a pod's job
never reaches a bus tenant's (issue 27, build item 1).

Everything runs as the deployment does: the shipped-auth nats-server (``auth_url``), the slicer
and the bridge under their own shipped users on the catalogue's durables, the tenants
``acme`` and ``globex`` under theirs (``tenant-<id>``), the test API server over HTTP. A pod's
job id is read from what the bridge published for it, never assumed.

- A hostile bus tenant (globex) submits jobs under the id of acme's waiting pod (its job id as
  the bridge published it, and the pod's uid): the first is dead-lettered by the slicer (a
  pod's job id is in a space no tenant may submit into), the second is placed as globex's
  own job, and the bridge binds nothing with it. A preemption naming the pod's job under
  globex (what a decision for globex's job would be) deletes nothing.
- A pod cannot take a bus job's id: acme's bus client submits a job under its own pod's uid
  and it is placed; the pod's deletion ends the pod's job and leaves the bus job running.
- The bridge's job records in KV are (tenant, job): records written by the bridge before
  this change are migrated (a waiting pod's job re-submitted in the pods' space and its old
  job ended; a bound pod keeps its job), and a record whose tenant is not the live job's is
  ended, not taken for it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from seedance.core import Bus
from seedance.core.kv import ensure_bucket, live_keys
from seedance.events import decode, derived_event_id, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import JobCancelled, JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import JobRejected, JobReleased, Placement, Preempted, Unschedulable
from seedance.events.subjects import QUOTA_POLICY_KEY, dlq, inbox_prefix, jobs, slicing
from seedance.k8s_bridge.core.kube import binding_body, placement_annotation
from seedance.k8s_bridge.core.pods import PodRef
from seedance.k8s_bridge.core.tracked import created_ms
from seedance.k8s_bridge.records import JOBS_BUCKET
from seedance.k8s_bridge.service import DURABLE, BridgeService
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually, next_matching, wait_consumer_settled
from tests.integration.k8s.bridge import (
    SYSTEM,
    Env,
    bridge,
    environment,
    gpu_node,
    shipped,
    slicer,
)

pytestmark = pytest.mark.timeout(120)

ACME, GLOBEX = "acme", "globex"


@contextlib.asynccontextmanager
async def connected(url: str, user: str, **kw: Any) -> AsyncIterator[Bus]:
    bus = await Bus.connect(shipped(url, user, **kw))
    try:
        yield bus
    finally:
        await bus.close()


def tenant_bus(url: str, tenant: str) -> contextlib.AbstractAsyncContextManager[Bus]:
    """A tenant's own connection (its user, its inbox prefix), as the SDK makes it."""
    return connected(url, f"tenant-{tenant}", inbox_prefix=inbox_prefix(tenant))


@pytest.fixture
async def env(
    kube_api: KubeApiServer, admin: Bus, unique: str, tmp_path: Path, auth_url: str
) -> AsyncIterator[Env]:
    """acme's namespace ``ns-<unique>``; the trail follows acme's and globex's subjects."""
    with contextlib.suppress(Exception):
        seed.namespace(kube_api, SYSTEM)
    async with environment(
        kube_api, admin, unique, tmp_path, auth_url, tenant=ACME, others=(GLOBEX,)
    ) as e:
        yield e


def shipped_bridge(env: Env) -> contextlib.AbstractAsyncContextManager[BridgeService]:
    """The bridge under its shipped user (reconciling no CRs: no quota, every tenant admitted)."""
    return bridge(env.kube, env.nats_url, env.unique, env.tmp_path, user="k8s-bridge",
                  policy_key="")  # fmt: skip


@contextlib.asynccontextmanager
async def running(env: Env) -> AsyncIterator[BridgeService]:
    """The slicer and the bridge, each under its shipped user."""
    async with (
        slicer(env.nats_url, env.unique, user="slicer", quota_key=QUOTA_POLICY_KEY),
        shipped_bridge(env) as b,
    ):
        yield b


def submit(tenant: str, job_id: str, gpus: int) -> JobSubmitted:
    now = datetime.now(UTC)
    return JobSubmitted(
        id=new_event_id(at=now),
        at=now,
        job_id=job_id,
        tenant=tenant,
        request=ResourceRequest(gpus=gpus),
    )


async def pod_job(env: Env, name: str) -> str:
    """The job id the bridge submitted pod ``name`` under (from the trail)."""

    async def submitted() -> bool:
        return any(e.labels.get("seedance.io/pod") == name for e in env.trail.of(JobSubmitted))

    await eventually(submitted, 20, what=f"pod {name}'s job submitted")
    (ev,) = [e for e in env.trail.of(JobSubmitted) if e.labels.get("seedance.io/pod") == name]
    assert ev.tenant == ACME
    return str(ev.job_id)


async def handled(admin: Bus, env: Env, event_id: str) -> None:
    """Wait until the bridge acknowledged the decision ``event_id`` (acked after its writes were
    made: a Binding or a deletion it caused is done by then)."""
    await eventually(lambda: event_id in env.trail.seqs, 20, what=f"{event_id} on the trail")
    await wait_consumer_settled(admin, "SEEDANCE_SLICING", DURABLE, env.trail.seqs[event_id], 20)


async def dead_letter_about(letters: Any, job: str) -> DeadLetter:
    """The first dead letter (from the subscription's start) whose reason names ``job``."""

    def about(msg: Any) -> bool:
        letter = decode(msg.data)
        assert isinstance(letter, DeadLetter)
        return repr(job) in letter.reason

    letter = decode((await next_matching(letters, about, 20, what=f"dead letter on {job}")).data)
    assert isinstance(letter, DeadLetter)
    return letter


def waiting(env: Env, job: str) -> bool:
    """The slicer answered the pod's job: it cannot place it now."""
    return bool(env.trail.of(Unschedulable, job, tenant=ACME))


async def test_a_bus_tenant_cannot_bind_or_delete_another_tenants_pod(
    env: Env, admin: Bus, auth_url: str
) -> None:
    node = f"gpu-{env.unique}"
    gpu_node(env.kube, node, gpus=1)
    letters = await admin.js.subscribe(dlq.subject("slicer"), ordered_consumer=True)
    async with running(env) as b, tenant_bus(auth_url, GLOBEX) as globex:
        created = await env.create_pod("victim", gpus=2)  # more than the node has: it waits
        uid = created["metadata"]["uid"]
        job = await pod_job(env, "victim")
        await eventually(lambda: waiting(env, job), 20, what="the victim's job waiting")

        # globex submits under the pod's job id and under its uid (the id it had before).
        for claimed in dict.fromkeys((job, uid)):
            await globex.publish(jobs.subject(GLOBEX, "submitted"), submit(GLOBEX, claimed, 1))

        async def globex_placed() -> bool:
            return bool(env.trail.of(Placement, uid, tenant=GLOBEX))

        await eventually(globex_placed, 20, what="globex's job placed")
        (placement,) = env.trail.of(Placement, uid, tenant=GLOBEX)
        await handled(admin, env, placement.id)
        assert not (await env.pod("victim")).spec.node_name, "globex's placement bound acme's pod"

        # The pod's own job id is no tenant's to submit: the slicer dead-letters it.
        if job != uid:
            letter = await dead_letter_about(letters, job)
            assert letter.error_kind == "reserved_job_id"
            assert letter.subject == jobs.subject(GLOBEX, "submitted")
            assert env.trail.of(Placement, job, tenant=GLOBEX) == []

        # A preemption of that job under globex (a decision about globex's job) deletes nothing.
        async with connected(auth_url, "slicer") as as_slicer:
            now = datetime.now(UTC)
            preempted = Preempted(
                id=new_event_id(at=now), at=now, job_id=job, tenant=GLOBEX, node=node,
                reason="priority",
            )  # fmt: skip
            await as_slicer.publish(slicing.subject(GLOBEX, "preempted"), preempted)
        await handled(admin, env, preempted.id)
        pod = await env.pod("victim")
        assert pod.metadata.uid == uid
        assert not pod.metadata.deletion_timestamp
        assert "Preempted" not in await env.reasons("victim")
        refused = b.metrics.decisions_refused_total.labels("other_tenant")._value.get()
        assert refused == 1
    await letters.unsubscribe()


async def test_a_pod_cannot_take_or_end_a_bus_tenants_job(
    env: Env, admin: Bus, auth_url: str
) -> None:
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=2)
    async with running(env), tenant_bus(auth_url, ACME) as acme:
        created = await env.create_pod("big", gpus=4)  # never fits: it waits
        uid = created["metadata"]["uid"]
        job = await pod_job(env, "big")
        await eventually(lambda: waiting(env, job), 20, what="the pod's job waiting")

        # acme's bus client submits a job of its own under the pod's uid: it is acme's job.
        await acme.publish(jobs.subject(ACME, "submitted"), submit(ACME, uid, 1))

        async def answered() -> bool:
            return bool(
                env.trail.of(Placement, uid, tenant=ACME)
                or env.trail.of(JobRejected, uid, tenant=ACME)
            )

        await eventually(answered, 20, what="the bus job placed or rejected")
        assert env.trail.of(JobRejected, uid, tenant=ACME) == [], "the pod took the bus job's id"
        (placement,) = env.trail.of(Placement, uid, tenant=ACME)
        await handled(admin, env, placement.id)
        assert (await env.pod("big")).spec.node_name is None, "the bus job's placement bound it"

        # The pod goes: its job ends, the bus job runs on.
        await env.core.delete_namespaced_pod("big", env.ns)

        async def pod_job_released() -> bool:
            return bool(env.trail.of(JobReleased, job, tenant=ACME))

        await eventually(pod_job_released, 20, what="the pod's job released")
        assert env.trail.of(JobReleased, uid, tenant=ACME) == []
        assert env.trail.of(JobCancelled, uid, tenant=ACME) == []


async def test_a_tenant_cannot_spend_its_pods_end_id(env: Env, auth_url: str) -> None:
    """acme created the pod, so it knows the pod's job id and creation time (the time bits of
    the submit's id), and with them the id the bridge derived for the pod's end without its key
    (docs/security.md, "Nats-Msg-Id"). Published first on acme's own job subject (the same
    stream, one duplicate window), it had the bridge's end dropped: the job never ended and
    the slicer held its GPUs after the pod was gone. Keyed, the end still comes."""
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=2)
    async with running(env), tenant_bus(auth_url, ACME) as acme:
        await env.create_pod("big", gpus=4)  # never fits: it waits
        job = await pod_job(env, "big")
        await eventually(lambda: waiting(env, job), 20, what="the pod's job waiting")
        (submitted,) = env.trail.of(JobSubmitted, job, tenant=ACME)
        created_ms = uuid.UUID(submitted.id).int >> 80
        spent = derived_event_id(job, "end", created_ms)
        ack = await acme.js.publish(
            jobs.subject(ACME, "cancelled"), b"spent", headers={"Nats-Msg-Id": spent}
        )
        assert not ack.duplicate
        await env.core.delete_namespaced_pod("big", env.ns)

        async def released() -> bool:
            return bool(env.trail.of(JobReleased, job, tenant=ACME))

        await eventually(released, 20, what="the pod's job released")
        (end,) = env.trail.of(JobCancelled, job, tenant=ACME)
        assert end.id != spent


async def test_a_tenant_cannot_spend_its_pods_submit_id(env: Env, auth_url: str) -> None:
    """acme creates its pod while no bridge runs and reads back its uid and creation time: the
    job id and the time bits of the bridge's submit. Published first on acme's own job subject
    with the id the bridge derived without its key, it had the submit dropped (the pod never
    scheduled). Keyed, the submit comes."""
    gpu_node(env.kube, f"gpu-{env.unique}", gpus=2)
    async with tenant_bus(auth_url, ACME) as acme:
        pod = await env.create_pod("early", gpus=1)
        job = f"k8s:{pod['metadata']['uid']}"
        spent = derived_event_id(job, "submitted", created_ms(pod))
        ack = await acme.js.publish(
            jobs.subject(ACME, "submitted"), b"spent", headers={"Nats-Msg-Id": spent}
        )
        assert not ack.duplicate
        async with running(env):
            assert await pod_job(env, "early") == job
            (submitted,) = env.trail.of(JobSubmitted, job, tenant=ACME)
            assert submitted.id != spent


async def test_job_records_are_keyed_by_tenant_and_job_and_old_records_migrate(
    env: Env, admin: Bus, auth_url: str
) -> None:
    """Records written by the bridge before job ids moved into the pods' space: the waiting
    pod's old job is ended and its job submitted anew; the bound pod keeps its job (its
    placement annotation names it) and ends under it; a record of another tenant under a live
    job's id is that tenant's job, ended as an orphan."""
    node = f"gpu-{env.unique}"
    gpu_node(env.kube, node, gpus=4)
    waiting = (await env.create_pod("waiting", gpus=1))["metadata"]["uid"]
    bound_pod = await env.create_pod("bound", gpus=1)
    bound = bound_pod["metadata"]["uid"]
    # As the bridge bound it before: the Binding with its annotation (job id = the pod's uid).
    ref = PodRef(env.ns, "bound", bound)
    annotation = placement_annotation(
        ref=ref, job_id=bound, tenant=ACME, node=node, kind="whole", gpu_model="A100-SXM4-80GB",
        gpus=[], gpu_mem_mib=0, placement_id=str(uuid.uuid4()), bound_at=datetime.now(UTC),
    )  # fmt: skip
    resp = await env.core.create_namespaced_pod_binding(
        "bound", env.ns, binding_body(ref, node, annotation), _preload_content=False
    )
    assert resp.status == 201, await resp.text()
    scope = f"bridge-{env.unique}"
    async with connected(auth_url, "k8s-bridge") as own:
        kv = await ensure_bucket(own, JOBS_BUCKET)
        for tenant, job_id in ((ACME, waiting), (ACME, bound), (GLOBEX, bound)):
            await kv.put(f"{scope}.{tenant}.{job_id}", b"1764000000000")
        # A cluster whose Lease name extends this one's with a dot: its records are its own.
        other = f"{scope}.eu.{ACME}.{uuid.uuid4()}"
        await kv.put(other, b"1764000000000")
    async with shipped_bridge(env):

        async def migrated() -> bool:
            return bool(
                env.trail.of(JobCancelled, waiting, tenant=ACME)
                and env.trail.of(JobCancelled, bound, tenant=GLOBEX)
            )

        await eventually(migrated, 20, what="the old waiting job and globex's record ended")
        new_job = await pod_job(env, "waiting")
        assert new_job != waiting
        assert env.trail.of(JobSubmitted, bound) == []
        await env.finish("bound")

        async def bound_ended() -> bool:
            return bool(env.trail.of(JobFinished, bound, tenant=ACME))

        await eventually(bound_ended, 20, what="the bound pod's end under its own job")
        # Everything of the take-over went out before the end: the bound job was never orphaned.
        assert env.trail.of(JobCancelled, bound, tenant=ACME) == []
        async with connected(auth_url, "k8s-bridge") as own:
            kv = await ensure_bucket(own, JOBS_BUCKET)
            keys = set(await live_keys(kv, scope))
        assert f"{scope}.{ACME}.{waiting}" not in keys
        assert f"{scope}.{GLOBEX}.{bound}" not in keys
        assert other in keys
        assert not any(e.tenant == "eu" for e in env.trail.events if hasattr(e, "tenant"))
