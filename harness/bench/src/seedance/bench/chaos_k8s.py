"""Attack classes of `make chaos-tenants` on the Kubernetes surfaces (issue 27, items 1 and 2).

The ``k8s`` stage: a fresh nats-server under the generated users, the test API server
(`seedance.testing.kube_api`, a process spoken to over HTTP), the slicer and the k8s-bridge as
processes under their own NATS users, one GPU node of 2 GPUs, and namespaces ``acme`` (bound to
the honest tenant acme), ``mallory`` (bound to the hostile tenant), ``rogue`` (bound to no
tenant) and ``inference`` (the operator's shared pool, ``SHARED_NAMESPACES``). The hostile
tenant has a GPU quota here, so a job of its own that names a pod's id is placed, not left
waiting over quota: the strongest form of the attack.

- ``forged-pod-job-ids``: acme's pods (one bound, one that cannot fit and waits); the hostile
  bus tenant submits, starts, finishes and cancels jobs under their job ids (``k8s:<uid>``)
  and their bare uids, and under other ids of the ``k8s:`` space. Must not happen: a pod bound,
  moved, deleted or released by any of it; a ``k8s:`` request not dead-lettered.
- ``rogue-endpoint-slices``: EndpointSlices labelled ``seedance.io/model`` for acme's model and
  the shared pool's, in the unbound namespace, in the hostile tenant's own namespace pointing at
  a pod of acme's namespace or at no pod. Must not happen: any of them registered under acme's
  or the shared pool's replica sets (what the router routes acme's and unnamed requests to),
  or an honest replica missing. The hostile tenant's slice for acme's model *name* in its own
  namespace registers as its own replica (its own requests only): allowed, and checked to be
  under its own key.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seedance.bench.chaos_classes import (
    AttackClass,
    ClassOutcome,
    StageRun,
    register,
    register_stage,
)
from seedance.bench.chaos_hostile import HOSTILE
from seedance.bench.kube_cluster import (
    Kube,
    gpu_node_object,
    kube_api,
    namespace_object,
    start_bridge,
)
from seedance.core import Bus, BusSettings
from seedance.core.kv import ensure_bucket
from seedance.events import decode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import (
    JobCancelled,
    JobFinished,
    JobStarted,
    JobSubmitted,
    ResourceRequest,
    pod_job_id,
)
from seedance.events.permissions import tenant_user_name
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.replicas import DEFAULT_FLEET, replica_set
from seedance.events.slicing import JobReleased, Placement, Preempted
from seedance.events.subjects import inbox_prefix, jobs, routing
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer, generated_auth, provision
from seedance.testing.waits import eventually, wait_consumer_settled, wait_copied
from seedance.testing.workloads import read_stream

__all__ = ["KubeStage", "forged_pod_job_ids", "rogue_endpoint_slices"]

VICTIM = "acme"
SYSTEM = "seedance-system"
ROGUE_NS = "rogue"
SHARED_NS = "inference"
NODE = "gpu-0"
MODEL = "acme-llm"  # acme's own model
SHARED_MODEL = "echo"  # the shared pool's
QUOTA = f"""version: 1
tenants:
  {VICTIM}:
    quota: {{gpus: 1000, shared_gpus: 1000}}
  {HOSTILE}:
    quota: {{gpus: 2, shared_gpus: 2}}
"""


@dataclass
class KubeStage:
    kube: Kube
    admin: Bus
    mallory: Bus
    refused: list[str] = field(default_factory=list)


def _node(name: str, gpus: int) -> dict[str, Any]:
    return gpu_node_object(name, gpus=gpus, product="A100-SXM4-80GB", gpu_memory_mib=81920)


def _pod(name: str, gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "seedance",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": limits, "requests": limits},
                }
            ],
        },
    }


@contextlib.asynccontextmanager
async def k8s_stage(logdir: Path, args: argparse.Namespace) -> AsyncIterator[StageRun]:
    config, passwords = generated_auth([VICTIM, HOSTILE], source=__name__)
    server = NatsServer(config=config)
    # what a deployment runs first: no service user may create a stream (docs/security.md)
    provision(server.url, PROVISIONER, passwords[PROVISIONER])
    tmp = Path(tempfile.mkdtemp(prefix="chaos-k8s-"))
    (tmp / "quota.yaml").write_text(QUOTA)
    procs = ServiceProcesses(server.url, logdir, credentials=passwords)
    run = StageRun(parts=None)
    try:
        async with kube_api(tmp) as kube, _clients(server.url, passwords) as (admin, mallory):
            try:
                await admin.ensure_streams()
                procs.start(
                    "slicer", replica="chaos", quota_file=str(tmp / "quota.yaml"), batch="50",
                )  # fmt: skip
                await start_bridge(
                    kube, procs, admin, replica="chaos", policy_key="",
                    shared_namespaces=SHARED_NS, nodes=[_node(NODE, 2)],
                    namespaces=[
                        namespace_object(VICTIM, VICTIM), namespace_object(HOSTILE, HOSTILE),
                        namespace_object(ROGUE_NS), namespace_object(SHARED_NS),
                    ],
                )  # fmt: skip
                run.parts = KubeStage(kube, admin, mallory)
                yield run
            finally:
                _stop(procs, run)  # before the API server and the clients go
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.asynccontextmanager
async def _clients(url: str, passwords: dict[str, str]) -> AsyncIterator[tuple[Bus, Bus]]:
    """The operator's connection and the hostile tenant's (under its own inbox prefix)."""
    async with contextlib.AsyncExitStack() as stack:
        buses = []
        for name, prefix in (("admin", None), (tenant_user_name(HOSTILE), inbox_prefix(HOSTILE))):
            settings = BusSettings(
                url=url, user=name, password=passwords[name], name=f"chaos-k8s-{name}"
            )
            if prefix:
                settings = dataclasses.replace(settings, inbox_prefix=prefix)
            bus = await Bus.connect(settings)
            stack.push_async_callback(bus.close)
            buses.append(bus)
        yield buses[0], buses[1]


def _stop(procs: ServiceProcesses, run: StageRun) -> None:
    for key, proc in procs.procs.items():
        if proc.poll() is not None:
            run.exits.append(f"{key} exited {proc.returncode} during the k8s stage")
    codes = procs.stop_all()
    run.exits += [f"{k} exited {c}" for k, c in codes.items() if c != 0]


register_stage("k8s", k8s_stage)


# --- forged job ids on pods -------------------------------------------------------------------


def _scheduled_false(pod: dict[str, Any] | None) -> bool:
    for c in ((pod or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return True
    return False


def _requests(job_ids: list[str], now: datetime) -> list[tuple[str, Any]]:
    """The hostile tenant's requests naming ``job_ids``: a submit (1 GPU, the highest priority
    its quota allows), a start, a finish, a cancel of each."""
    out: list[tuple[str, Any]] = []
    m = HOSTILE
    for job in job_ids:
        submit = JobSubmitted(
            id=new_event_id(at=now), at=now, job_id=job, tenant=m,
            request=ResourceRequest(gpus=1), priority=2**31 - 1,
        )  # fmt: skip
        out += [
            (jobs.subject(m, "submitted"), submit),
            (
                jobs.subject(m, "started"),
                JobStarted(id=new_event_id(at=now), at=now, job_id=job, tenant=m),
            ),
            (
                jobs.subject(m, "finished"),
                JobFinished(id=new_event_id(at=now), at=now, job_id=job, tenant=m),
            ),
            (
                jobs.subject(m, "cancelled"),
                JobCancelled(id=new_event_id(at=now), at=now, job_id=job, tenant=m, reason="x"),
            ),
        ]
    return out


async def forged_pod_job_ids(stage: KubeStage, args: argparse.Namespace) -> ClassOutcome:
    out = ClassOutcome("forged-pod-job-ids")
    kube, ns = stage.kube, VICTIM
    uids = {}
    for name, gpus in (("bound", 1), ("waiting", 4)):  # the node has 2 GPUs: "waiting" waits
        pod = await kube.create(f"/api/v1/namespaces/{ns}/pods", _pod(name, gpus))
        uids[name] = str(pod["metadata"]["uid"])

    async def settled() -> bool:
        bound, waiting = await kube.pod(ns, "bound"), await kube.pod(ns, "waiting")
        return bool((bound or {}).get("spec", {}).get("nodeName")) and _scheduled_false(waiting)

    await eventually(settled, 60, what="acme's pod bound and its other pod reported waiting")
    before = await kube.pod(ns, "bound")
    assert before is not None
    reserved = [pod_job_id(u) for u in uids.values()]
    reserved += [f"{pod_job_id('')}{uids['bound'][:8]}", pod_job_id("")]
    requests = _requests([*reserved, *uids.values()], datetime.now(UTC))
    for subject, event in requests:
        await stage.mallory.publish(subject, event)
    out.sent = len(requests)
    admin = stage.admin
    await wait_copied(admin.js, "SEEDANCE_JOBS")  # sourced: the copies first
    await wait_consumer_settled(admin, "SEEDANCE_JOBS", "slicer-jobs", timeout_s=60)
    await wait_consumer_settled(admin, "SEEDANCE_SLICING", "k8s-bridge-decisions", timeout_s=60)
    want = sum(1 for _, e in requests if e.job_id.startswith(pod_job_id("")))
    out.refused = await _reserved_letters(admin)
    if out.refused < want:
        out.effects.append(
            f"the slicer dead-lettered {out.refused} of the {want} requests naming k8s: jobs"
        )
    out.effects += await _decision_effects(admin, pod_job_id(uids["bound"]))
    out.effects += await _pod_effects(kube, uids, before["spec"]["nodeName"])
    return out


async def _reserved_letters(admin: Bus) -> int:
    """The slicer's dead letters of requests naming the pods' job space."""
    seen = set()
    for msg in await read_stream(admin, "SEEDANCE_DLQ"):
        letter = decode(msg.data)
        if (
            isinstance(letter, DeadLetter)
            and letter.service == "slicer"
            and letter.error_kind == "reserved_job_id"
        ):
            seen.add((letter.subject, letter.stream_seq))
    return len(seen)


async def _decision_effects(admin: Bus, bound_job: str) -> list[str]:
    """The slicer's decisions: none for the hostile tenant on a k8s: job, none ending or moving
    acme's, acme's one placement its bound pod's."""
    effects = []
    decisions = [decode(m.data) for m in await read_stream(admin, "SEEDANCE_SLICING")]
    for ev in decisions:
        tenant, job = getattr(ev, "tenant", ""), str(getattr(ev, "job_id", ""))
        if tenant == HOSTILE and job.startswith(pod_job_id("")):
            effects.append(f"the slicer decided {type(ev).__name__} on {job} for it")
        if tenant == VICTIM and isinstance(ev, (JobReleased, Preempted)):
            effects.append(f"acme's pod job {job} {type(ev).__name__}")
    placed = [e.job_id for e in decisions if isinstance(e, Placement) and e.tenant == VICTIM]
    if placed != [bound_job]:
        effects.append(f"acme's placements: {placed}, not [{bound_job}]")
    return effects


async def _pod_effects(kube: Kube, uids: dict[str, str], node: str) -> list[str]:
    """acme's pods as they were: none deleted or replaced, the bound one where it was under its
    own placement, the waiting one unbound."""
    effects = []
    after = {n: await kube.pod(VICTIM, n) or {} for n in uids}
    for name, pod in after.items():
        meta = pod.get("metadata") or {}
        if meta.get("uid") != uids[name] or meta.get("deletionTimestamp"):
            effects.append(f"acme's pod {name} deleted")
    if after["waiting"].get("spec", {}).get("nodeName"):
        effects.append("acme's waiting pod was bound")
    if after["bound"].get("spec", {}).get("nodeName") != node:
        effects.append("acme's bound pod moved")
    notes = after["bound"].get("metadata", {}).get("annotations") or {}
    placement = json.loads(notes.get("seedance.io/placement", "{}"))
    claimed = (placement.get("tenant"), placement.get("jobId"))
    if claimed != (VICTIM, pod_job_id(uids["bound"])):
        effects.append(f"acme's bound pod's placement names {claimed}")
    return effects


register(
    AttackClass(
        "forged-pod-job-ids",
        "k8s",
        forged_pod_job_ids,
        "a bus tenant names another tenant's pods' jobs (k8s:<uid>, bare uids): no pod bound, "
        "moved, deleted or released; every k8s: request dead-lettered",
    )
)


# --- rogue EndpointSlices -----------------------------------------------------------------------


def _slice(name: str, model: str, *endpoints: tuple[str, str | None, str]) -> dict[str, Any]:
    """A slice of a Service labelled for ``model``; each endpoint (ip, pod or None: no
    targetRef, the pod's namespace)."""
    eps = []
    for ip, pod, pod_ns in endpoints:
        ep: dict[str, Any] = {"addresses": [ip], "conditions": {"ready": True, "serving": True}}
        if pod is not None:
            ep["targetRef"] = {"kind": "Pod", "name": pod, "namespace": pod_ns}
        eps.append(ep)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/service-name": name, "seedance.io/model": model},
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "grpc", "port": 8001, "protocol": "TCP"}],
    }


#: (namespace, slice, model, endpoints) of the honest registrations and the hostile ones.
HONEST_SLICES = (
    (VICTIM, "acme-llm", MODEL, (("10.1.0.1", "acme-llm-0", VICTIM),)),
    (SHARED_NS, "echo", SHARED_MODEL, (("10.2.0.1", "echo-0", SHARED_NS),)),
)
ROGUE_SLICES = (
    (ROGUE_NS, "rogue-shared", SHARED_MODEL, (("10.6.6.1", "r-0", ROGUE_NS),)),
    (ROGUE_NS, "rogue-acme", MODEL, (("10.6.6.2", "r-1", ROGUE_NS),)),
    (HOSTILE, "steal-acme-pod", SHARED_MODEL, (("10.6.6.3", "acme-llm-0", VICTIM),)),
    (HOSTILE, "bare-address", MODEL, (("10.6.6.4", None, HOSTILE),)),
)
#: Its own slice for acme's model name: its own replica, reached by its own requests only.
OWN_SLICE = (HOSTILE, "own-acme-llm", MODEL, (("10.6.6.5", "m-0", HOSTILE),))


@contextlib.asynccontextmanager
async def _registrations(bus: Bus) -> AsyncIterator[dict[str, str]]:
    """The replicas bucket as it changes (one watch for the block): key -> address."""
    kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)
    watcher = await kv.watch(f"{DEFAULT_FLEET}.>")
    out: dict[str, str] = {}

    async def follow() -> None:
        async for entry in watcher:
            if entry is None:
                continue  # the current values are in; changes follow
            if entry.operation is None and entry.value:
                out[entry.key] = str(json.loads(entry.value).get("address", ""))
            else:
                out.pop(entry.key, None)

    task = asyncio.create_task(follow())
    try:
        yield out
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await watcher.stop()


async def _refused_slices(kube: Kube) -> set[tuple[str, str]]:
    """The slices the bridge reported (a ``ReplicaRefused`` Event on each)."""
    warned = set()
    for ns in (ROGUE_NS, HOSTILE):
        for ev in await kube.events(ns):
            if ev.get("reason") == "ReplicaRefused":
                warned.add((ns, str((ev.get("involvedObject") or {}).get("name"))))
    return warned


async def rogue_endpoint_slices(stage: KubeStage, args: argparse.Namespace) -> ClassOutcome:
    out = ClassOutcome("rogue-endpoint-slices")
    kube = stage.kube
    own_key = f"{replica_set(DEFAULT_FLEET, MODEL, HOSTILE)}.{HOSTILE}_m-0"
    address = {(ns, name): {f"{ip}:8001" for ip, *_ in eps} for ns, name, _, eps in ROGUE_SLICES}
    async with _registrations(stage.admin) as regs:
        for ns, name, model, eps in (*HONEST_SLICES, *ROGUE_SLICES, OWN_SLICE):
            await kube.create(
                f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                _slice(name, model, *eps),
            )
        out.sent = len(ROGUE_SLICES) + 1

        async def settled() -> bool:
            """Each rogue slice either reported or registered; the others registered."""
            warned = await _refused_slices(kube)
            seen = set(regs.values())
            decided = all(k in warned or a & seen for k, a in address.items())
            return decided and own_key in regs and len(regs) >= len(HONEST_SLICES) + 1

        await eventually(settled, 60, what="every slice registered or reported", interval_s=0.1)
        out.refused = len(await _refused_slices(kube) & set(address))
        registered = dict(regs)
    rogue_addresses = {f"{ip}:8001" for *_, eps in (*ROGUE_SLICES, OWN_SLICE) for ip, *_ in eps}
    for ns, _name, model, eps in HONEST_SLICES:
        owner = VICTIM if ns == VICTIM else ""
        prefix = replica_set(DEFAULT_FLEET, model, owner) + "."
        members = {k: a for k, a in registered.items() if k.startswith(prefix)}
        honest = {f"{ip}:8001" for ip, *_ in eps}
        if set(members.values()) != honest:
            out.effects.append(
                f"{model!r} of {owner or 'the shared pool'} routes to {sorted(members.values())}, "
                f"not {sorted(honest)}"
            )
    for key, addr in registered.items():
        if addr in rogue_addresses and key != own_key:
            out.effects.append(f"a rogue slice registered as {key} ({addr})")
    return out


register(
    AttackClass(
        "rogue-endpoint-slices",
        "k8s",
        rogue_endpoint_slices,
        "EndpointSlices labelled seedance.io/model in an unbound namespace, or pointing at "
        "another namespace's pod or at no pod: never a replica of acme's model or the shared "
        "pool's",
    )
)
