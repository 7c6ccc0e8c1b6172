"""The bridge's state machine: which pod is which job, where each is in its life, what to do.

Inputs are what the API server and the slicer say (a pod seen or deleted, a node, a decision on
the bus, the outcome of a Binding); outputs are `Action` values the service carries out
(publish an event, post a Binding, patch a pod's status, post an Event, delete a pod). It is
rebuilt from the informer's cache whenever the bridge becomes the leader, so everything it
emits is idempotent by construction: event ids are derived from the pod's uid and the
transition (``derived_event_id``; never from ``resourceVersion``, which every update changes,
the bridge's own included), Kubernetes Event names likewise, and a Binding of a pod already
bound where the slicer put it is a no-op.

A pod's life: ``grouping`` (a gang member waiting for its group to be complete) ->
``waiting`` (its job submitted) -> ``binding`` (placed; the Binding is in flight) -> ``bound``
-> ``ended``; or ``refused`` (never submitted: it would bypass the placement and the bill, or
asks for what Seedance cannot place).

Gangs (``seedance.io/pod-group`` + ``seedance.io/pod-group-size``): one job with
``gang_size = size`` is submitted once every member is pending; its id is derived from the
members' uids. The slicer places a gang all at once, one `Placement` per node (``part``); the
bridge binds only when the parts cover every member, each member taking its share of a part's
GPUs in the order of the members' names (so a restarted bridge assigns the same). If one
member's Binding fails after others succeeded, every member is deleted (Events say why) for
their controller to re-create, as KAI-Scheduler and Volcano do: a half-bound gang would hold
GPUs and never run. The gang's job ends then (cancelled); the re-created pods form a new gang
with a new id. A gang ends when one member fails or is deleted (failed / cancelled), or when
every member succeeded (finished).

Must not do I/O or read a clock (times come in as arguments).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec

from seedance.events import Event, derived_event_id
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted
from seedance.events.slicing import (
    GpuAssignment,
    JobRejected,
    Placement,
    Preempted,
    Unschedulable,
)
from seedance.events.subjects import observed, telemetry
from seedance.events.telemetry import NodeInventory
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.ends import billed_end, end_kind, parse_k8s_time
from seedance.k8s_bridge.core.kube import (
    binding_body,
    devices_text,
    event_body,
    node_name,
    parse_annotation,
    placement_annotation,
    scheduled_condition,
)
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.k8s_bridge.core.pods import (
    Gang,
    PodAsk,
    PodRef,
    RefusalReason,
    Refused,
    pod_ask,
    pod_ref,
)

__all__ = [
    "Action",
    "Bind",
    "BindOutcome",
    "DeletePod",
    "PatchStatus",
    "PodState",
    "PostEvent",
    "Publish",
    "Tracker",
]

Json = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Publish:
    subject: str
    event: Event


@dataclass(frozen=True, slots=True)
class Bind:
    """Post ``body`` (a v1 Binding) for ``ref``; report the outcome to `Tracker.bind_done`."""

    ref: PodRef
    node: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PatchStatus:
    """A strategic-merge patch of the pod's status subresource."""

    ref: PodRef
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PostEvent:
    ref: PodRef
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DeletePod:
    """Delete the pod (uid precondition), for ``reason`` (its Event is a separate action)."""

    ref: PodRef
    reason: str


Action = Publish | Bind | PatchStatus | PostEvent | DeletePod


class BindOutcome(enum.StrEnum):
    BOUND = "bound"  # 201, or 409 with the pod already on the placement's node
    GONE = "gone"  # 404, or 409 on the uid precondition: the pod was deleted
    CONFLICT = "conflict"  # 409: already bound to another node
    FAILED = "failed"  # refused for good (4xx)


class PodState(enum.StrEnum):
    GROUPING = "grouping"
    WAITING = "waiting"
    BINDING = "binding"
    BOUND = "bound"
    ENDED = "ended"
    REFUSED = "refused"


_LIVE = (PodState.WAITING, PodState.BINDING, PodState.BOUND)


@dataclass(slots=True)
class _Pod:
    ref: PodRef
    state: PodState
    created_ms: int
    ask: PodAsk | None = None
    job_id: str = ""
    tenant: str = ""
    gang: tuple[str, str] | None = None
    node: str = ""
    bound_at: datetime | None = None
    succeeded: bool = False
    #: The devices of its placement, for the Scheduled Event.
    devices: str = ""
    last: Json = field(default_factory=dict)


@dataclass(slots=True)
class _Gang:
    key: tuple[str, str]
    size: int
    members: set[str] = field(default_factory=set)
    job_id: str = ""
    tenant: str = ""
    gpus_per_member: int = 1
    gpu_mem_mib: int = 0
    created_ms: int = 0
    #: Per placement attempt, its parts by event id.
    parts: dict[str, Placement] = field(default_factory=dict)
    placed: bool = False
    ended: bool = False


def _created_ms(pod: Json) -> int:
    t = parse_k8s_time((pod.get("metadata") or {}).get("creationTimestamp"))
    return int(t.timestamp() * 1000) if t is not None else 0


class Tracker:
    """See the module docstring. ``instance`` names this bridge in its Events."""

    def __init__(self, *, instance: str = "") -> None:
        self._instance = instance
        self._pods: dict[str, _Pod] = {}
        self._gangs: dict[tuple[str, str], _Gang] = {}
        #: job id -> the pod uid (a single pod's job) or the gang key.
        self._jobs: dict[str, str | tuple[str, str]] = {}
        self._nodes: dict[str, NodeInventory] = {}
        #: namespace -> tenant, from TenantQuota bindings (``policy.reconcile``) and from labels.
        self.bindings: Mapping[str, str] = {}
        self.labelled: dict[str, str] = {}
        #: PriorityClass name -> value (used when a pod's ``spec.priority`` is unset).
        self.priorities: dict[str, int] = {}

    # --- queries (metrics, tests) ------------------------------------------------------------

    def state_of(self, uid: str) -> PodState | None:
        p = self._pods.get(uid)
        return p.state if p else None

    def job_of(self, uid: str) -> str:
        p = self._pods.get(uid)
        return p.job_id if p else ""

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in PodState}
        for p in self._pods.values():
            out[p.state.value] += 1
        return out

    def live_jobs(self) -> set[str]:
        """The jobs of pods that are submitted and not ended (the gangs' too)."""
        out = {p.job_id for p in self._pods.values() if p.state in _LIVE and p.job_id}
        out |= {g.job_id for g in self._gangs.values() if g.job_id and not g.ended}
        return out

    def orphan_ended(self, job_id: str, tenant: str, created_ms: int, now: datetime) -> Publish:
        """The end of a job whose pod is gone without the bridge seeing it go (it was deleted
        while no bridge ran): cancelled, at the bridge's time (the best bound it has)."""
        reason = "pod deleted while no bridge watched"
        return self._end_event(job_id, tenant, "cancelled", reason, now, created_ms)

    # --- namespaces and nodes ---------------------------------------------------------------

    def namespace_seen(self, ns: Json, *, deleted: bool = False) -> None:
        md = ns.get("metadata") or {}
        name = str(md.get("name", ""))
        tenant = (md.get("labels") or {}).get(keys.LABEL_TENANT)
        if deleted or not tenant:
            self.labelled.pop(name, None)
        else:
            self.labelled[name] = str(tenant)

    def node_seen(self, node: Json, now: datetime, *, deleted: bool = False) -> list[Action]:
        """The node's inventory when it changed since the last one published."""
        inv = node_inventory(node, now, deleted=deleted)
        last = self._nodes.get(inv.node)
        if last is not None and _same_inventory(last, inv):
            return []
        self._nodes[inv.node] = inv
        return [Publish(telemetry.inventory(inv.node), inv)]

    # --- pods -------------------------------------------------------------------------------

    def pod_seen(self, pod: Json, now: datetime, *, deleted: bool = False) -> list[Action]:
        """A pod of Seedance's scheduler was listed, added, modified or deleted."""
        ref = pod_ref(pod)
        known = self._pods.get(ref.uid)
        if known is None:
            if deleted:
                return []
            return self._new_pod(pod, ref, now)
        known.last = pod
        if known.state is PodState.WAITING and (pod.get("spec") or {}).get("nodeName"):
            return self._bound_meanwhile(known, pod, now)
        if known.state in (PodState.ENDED,):
            if deleted:
                del self._pods[ref.uid]
            return []
        if known.state in (PodState.REFUSED, PodState.GROUPING):
            if deleted:
                self._forget(known)
            return []
        ended = end_kind(pod, deleted=deleted)
        if ended is None:
            return []
        out = self._ended(known, pod, ended, now)
        if deleted:
            self._pods.pop(ref.uid, None)
        return out

    def _new_pod(self, pod: Json, ref: PodRef, now: datetime) -> list[Action]:
        spec = pod.get("spec") or {}
        created = _created_ms(pod)
        if spec.get("nodeName"):
            adopted = self._adopt_bound(pod, ref, created, now)
            if adopted is not None:
                return adopted
        ask = pod_ask(
            pod, bindings=self.bindings, labelled=self.labelled, priorities=self.priorities
        )
        if isinstance(ask, Refused):
            self._pods[ref.uid] = _Pod(ref, PodState.REFUSED, created, last=pod)
            return self._refuse(ref, ask, now)
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            # Ended without ever being bound by us (never placed): nothing to submit.
            self._pods[ref.uid] = _Pod(ref, PodState.ENDED, created, last=pod)
            return []
        if ask.gang is None:
            p = _Pod(ref, PodState.WAITING, created, ask, ref.uid, ask.tenant, last=pod)
            self._pods[ref.uid] = p
            self._jobs[ref.uid] = ref.uid
            return [self._submit(ask, ref.uid, ask.request.gang_size, created, now)]
        p = _Pod(ref, PodState.GROUPING, created, ask, tenant=ask.tenant, last=pod)
        p.gang = (ask.gang.namespace, ask.gang.name)
        self._pods[ref.uid] = p
        return self._join_gang(p, ask.gang, now)

    def _adopt_bound(
        self, pod: Json, ref: PodRef, created: int, now: datetime
    ) -> list[Action] | None:
        """A bound pod the bridge bound (before a restart or under another leader): our
        annotation names this very pod (its uid, which the API server assigned after any
        annotation a creator could have written) and the node it is on."""
        md = pod.get("metadata") or {}
        doc = parse_annotation(md.get("annotations") or {})
        node = (pod.get("spec") or {}).get("nodeName")
        if doc is None or doc.get("podUid") != ref.uid or node_name(str(doc.get("node"))) != node:
            return None
        job_id, tenant = str(doc.get("jobId", "")), str(doc.get("tenant", ""))
        p = _Pod(ref, PodState.BOUND, created, job_id=job_id, tenant=tenant, node=str(node))
        p.bound_at = parse_k8s_time(doc.get("boundAt"))
        p.last = pod
        labels = md.get("labels") or {}
        group = labels.get(keys.LABEL_POD_GROUP)
        if group and job_id != ref.uid:
            key = (ref.namespace, str(group))
            g = self._gangs.setdefault(key, _Gang(key, _int(labels.get(keys.LABEL_POD_GROUP_SIZE))))
            g.members.add(ref.uid)
            g.job_id, g.tenant = job_id, tenant
            p.gang = key
            self._jobs[job_id] = key
        else:
            self._jobs[job_id] = ref.uid
        self._pods[ref.uid] = p
        ended = end_kind(pod, deleted=False)
        return self._ended(p, pod, ended, now) if ended else []

    def _bound_meanwhile(self, p: _Pod, pod: Json, now: datetime) -> list[Action]:
        """A waiting pod that is bound now: by us (another leader, before a hand-over: our
        annotation names it) it is simply bound; by anyone else it left Seedance's hands."""
        doc = parse_annotation((pod.get("metadata") or {}).get("annotations") or {})
        node = str((pod.get("spec") or {}).get("nodeName"))
        if doc is not None and doc.get("podUid") == p.ref.uid:
            p.state, p.node = PodState.BOUND, node
            p.bound_at = parse_k8s_time(doc.get("boundAt")) or now
            ended = end_kind(pod, deleted=False)
            return self._ended(p, pod, ended, now) if ended else []
        return self._ended(p, pod, ("failed", f"bound to {node} by another scheduler"), now)

    def _refuse(self, ref: PodRef, why: Refused, now: datetime) -> list[Action]:
        message = f"{why.reason.value}: {why.message}"
        return [
            PatchStatus(ref, scheduled_condition(keys.REASON_REFUSED, message, now)),
            PostEvent(
                ref,
                event_body(
                    ref,
                    reason=keys.EVENT_REFUSED,
                    message=f"Seedance refused the pod: {message}",
                    warning=True,
                    at=now,
                    role="refused",
                    instance=self._instance,
                ),
            ),
        ]

    def _submit(
        self, ask: PodAsk, job_id: str, gang_size: int, created_ms: int, now: datetime
    ) -> Publish:
        request = msgspec.structs.replace(ask.request, gang_size=gang_size)
        ev = JobSubmitted(
            id=derived_event_id(job_id, "submitted", created_ms),
            at=now,
            job_id=job_id,
            tenant=ask.tenant,
            kind=ask.kind,
            priority=ask.priority,
            request=request,
            expected_duration_s=ask.expected_duration_s,
            labels=ask.labels,
        )
        return Publish(observed.subject(ask.tenant, "submitted"), ev)

    # --- gangs ------------------------------------------------------------------------------

    def _join_gang(self, p: _Pod, gang: Gang, now: datetime) -> list[Action]:
        key = (gang.namespace, gang.name)
        g = self._gangs.get(key)
        if g is None or g.ended:
            g = self._gangs[key] = _Gang(key, gang.size)
        if g.job_id and len(g.members) < g.size:
            # A member of a gang half bound before a restart: the placement, redelivered,
            # binds it.
            g.members.add(p.ref.uid)
            g.gpus_per_member = max(p.ask.request.gpus, 1) if p.ask else 1
            g.gpu_mem_mib = p.ask.request.gpu_mem_mib if p.ask else 0
            p.state, p.job_id = PodState.WAITING, g.job_id
            return []
        if g.job_id:
            # The group's job is already submitted with other members: a pod beyond its size.
            p.state = PodState.REFUSED
            return self._refuse(
                p.ref,
                Refused(
                    _INVALID_GANG,
                    f"pod group {gang.name!r} already has its {g.size} members submitted",
                ),
                now,
            )
        g.members.add(p.ref.uid)
        if len(g.members) < g.size:
            return []
        return self._submit_gang(g, now)

    def _submit_gang(self, g: _Gang, now: datetime) -> list[Action]:
        members = [self._pods[u] for u in sorted(g.members)]
        asks = [m.ask for m in members if m.ask is not None]
        first = asks[0]
        if any(a.request != first.request or a.tenant != first.tenant for a in asks) or any(
            (m.ask.gang.size if m.ask and m.ask.gang else 0) != g.size for m in members
        ):
            out: list[Action] = []
            for m in members:
                m.state = PodState.REFUSED
                out += self._refuse(
                    m.ref,
                    Refused(
                        _INVALID_GANG,
                        f"pod group {g.key[1]!r}: members ask for different resources, "
                        "tenants or group sizes",
                    ),
                    now,
                )
            del self._gangs[g.key]
            return out
        if first.request.gpus == 0:
            # The slicer's placement of a CPU-only gang names nodes, not members per node.
            out = []
            for m in members:
                m.state = PodState.REFUSED
                out += self._refuse(
                    m.ref, Refused(_INVALID_GANG, "a pod group must ask for GPUs"), now
                )
            del self._gangs[g.key]
            return out
        g.job_id = derived_event_id(
            f"gang/{g.key[0]}/{g.key[1]}/{','.join(sorted(g.members))}", "job"
        )
        g.tenant = first.tenant
        g.gpus_per_member = first.request.gpus
        g.gpu_mem_mib = first.request.gpu_mem_mib
        g.created_ms = min(m.created_ms for m in members)
        self._jobs[g.job_id] = g.key
        for m in members:
            m.state, m.job_id = PodState.WAITING, g.job_id
        return [self._submit(first, g.job_id, g.size, g.created_ms, now)]

    def _gang_members(self, g: _Gang) -> list[_Pod]:
        """Members in the order they take the placement's shares: by pod name."""
        members = [self._pods[u] for u in g.members if u in self._pods]
        return sorted(members, key=lambda m: m.ref.name)

    def _gang_placed(self, g: _Gang, ev: Placement, now: datetime) -> list[Action]:
        g.parts[ev.id] = ev
        parts = sorted(
            (p for p in g.parts.values() if _attempt(p) == _attempt(ev)),
            key=lambda p: p.id,
        )
        n = g.gpus_per_member
        slots = [
            (part, part.gpus[i : i + n]) for part in parts for i in range(0, len(part.gpus), n)
        ]
        if len(slots) < g.size or g.placed:
            return []
        g.placed = True
        out: list[Action] = []
        for member, (part, gpus) in zip(self._gang_members(g), slots, strict=False):
            if member.state is PodState.WAITING:
                out.append(self._bind(member, part, gpus, g.gpu_mem_mib, now))
        return out

    # --- decisions --------------------------------------------------------------------------

    def decision(self, ev: Event, now: datetime) -> list[Action]:
        """A slicer decision from the bus; decisions on jobs that are not pods are ignored."""
        job_id = getattr(ev, "job_id", "")
        target = self._jobs.get(job_id)
        if target is None:
            return []
        if isinstance(target, tuple):
            g = self._gangs.get(target)
            return self._gang_decision(g, ev, now) if g is not None else []
        p = self._pods.get(target)
        if p is None:
            return []
        if isinstance(ev, Placement):
            if p.state is not PodState.WAITING:
                return []  # a redelivery, or a placement of a pod already gone
            gpu_mem = p.ask.request.gpu_mem_mib if p.ask else 0
            return [self._bind(p, ev, list(ev.gpus), gpu_mem, now)]
        if isinstance(ev, Unschedulable | JobRejected):
            return self._unschedulable([p], ev, now)
        if isinstance(ev, Preempted):
            return self._preempt([p], ev, now)
        return []  # JobReleased: the slicer confirms an end the bridge reported

    def _gang_decision(self, g: _Gang, ev: Event, now: datetime) -> list[Action]:
        members = self._gang_members(g)
        if isinstance(ev, Placement):
            return self._gang_placed(g, ev, now)
        if isinstance(ev, Unschedulable | JobRejected):
            return self._unschedulable(members, ev, now)
        if isinstance(ev, Preempted):
            return self._preempt(members, ev, now)
        return []

    def _bind(
        self,
        p: _Pod,
        ev: Placement,
        gpus: list[GpuAssignment],
        gpu_mem_mib: int,
        now: datetime,
    ) -> Bind:
        node = node_name(ev.node)
        annotation = placement_annotation(
            ref=p.ref,
            job_id=p.job_id,
            tenant=p.tenant,
            node=ev.node,
            kind=ev.kind.value,
            gpu_model=ev.gpu_model,
            gpus=gpus,
            gpu_mem_mib=gpu_mem_mib,
            placement_id=ev.id,
            bound_at=now,
        )
        p.state, p.node, p.bound_at = PodState.BINDING, node, now
        p.devices = devices_text(node, gpus, ev.kind.value)
        return Bind(p.ref, node, binding_body(p.ref, node, annotation))

    def _unschedulable(
        self, pods: list[_Pod], ev: Unschedulable | JobRejected, now: datetime
    ) -> list[Action]:
        if isinstance(ev, JobRejected) and ev.cause_type != JobSubmitted.__struct_config__.tag:
            return []  # the answer to an end the bridge reported twice: nothing to show
        reason = ev.reason.value
        message = f"{reason}: {ev.detail}" if ev.detail and ev.detail != reason else reason
        out: list[Action] = []
        for p in pods:
            if p.state is not PodState.WAITING:
                continue
            condition = scheduled_condition(keys.REASON_UNSCHEDULABLE, message, now)
            out.append(PatchStatus(p.ref, condition))
            out.append(
                PostEvent(
                    p.ref,
                    event_body(
                        p.ref,
                        reason=keys.EVENT_FAILED_SCHEDULING,
                        message=f"Seedance cannot place the pod now: {message}",
                        warning=True,
                        at=now,
                        role=f"unschedulable/{reason}/{ev.id}",
                        instance=self._instance,
                    ),
                )
            )
        return out

    def _preempt(self, pods: list[_Pod], ev: Preempted, now: datetime) -> list[Action]:
        out: list[Action] = []
        why = f"preempted on {node_name(ev.node)} ({ev.reason or 'priority'})" + (
            f" by job {ev.by_job_id}" if ev.by_job_id else ""
        )
        for p in pods:
            if p.state not in _LIVE:
                continue
            out.append(
                PostEvent(
                    p.ref,
                    event_body(
                        p.ref,
                        reason=keys.EVENT_PREEMPTED,
                        message=f"Seedance {why}",
                        warning=True,
                        at=now,
                        role=f"preempted/{ev.id}",
                        instance=self._instance,
                    ),
                )
            )
            out.append(DeletePod(p.ref, why))
        return out

    def holds(self, ev: Event) -> bool:
        """Whether a decision must stay unacknowledged: a part of a gang's placement while the
        gang is not yet placed whole (acked, it would be lost to a restart; redelivered, the
        tracker takes it again by its id)."""
        if not isinstance(ev, Placement):
            return False
        target = self._jobs.get(ev.job_id)
        if not isinstance(target, tuple):
            return False
        g = self._gangs.get(target)
        return g is not None and not g.placed and not g.ended

    def bind_retry(self, ref: PodRef) -> None:
        """A Binding that failed for now (no answer, 5xx, 429): the pod waits again, so the
        placement, redelivered, binds it."""
        p = self._pods.get(ref.uid)
        if p is None or p.state is not PodState.BINDING:
            return
        p.state = PodState.WAITING
        if p.gang is not None and (g := self._gangs.get(p.gang)) is not None:
            g.placed = False

    # --- binding outcomes -------------------------------------------------------------------

    def bind_done(
        self, ref: PodRef, outcome: BindOutcome, now: datetime, detail: str = ""
    ) -> list[Action]:
        """What follows a Binding's outcome (the service reads the pod on a 409 to tell a
        pod already bound where the slicer put it, BOUND, from one bound elsewhere)."""
        p = self._pods.get(ref.uid)
        if p is None or p.state is not PodState.BINDING:
            return []
        g = self._gangs.get(p.gang) if p.gang else None
        if outcome is BindOutcome.BOUND:
            p.state = PodState.BOUND
            devices = p.devices or p.node
            return [
                PostEvent(
                    ref,
                    event_body(
                        ref,
                        reason=keys.EVENT_SCHEDULED,
                        message=f"Successfully assigned {ref.namespace}/{ref.name} to "
                        f"{devices} (Seedance job {p.job_id})",
                        warning=False,
                        at=now,
                        role=f"scheduled/{p.job_id}",
                        instance=self._instance,
                    ),
                )
            ]
        if outcome is BindOutcome.GONE:
            return self._ended(p, p.last, ("cancelled", "pod deleted before binding"), now)
        if g is not None:
            return self._gang_bind_failed(g, p, outcome, detail, now)
        # A single pod bound elsewhere, or refused for good: it leaves Seedance's hands.
        why = (
            f"already bound to another node ({detail})"
            if outcome is BindOutcome.CONFLICT
            else f"the Binding was refused: {detail}"
        )
        out = self._ended(p, p.last, ("failed", why), now)
        out.append(PostEvent(ref, self._warn(ref, keys.EVENT_FAILED_SCHEDULING, why, now, "bind")))
        if outcome is BindOutcome.FAILED:
            out.append(DeletePod(ref, why))
        return out

    def _gang_bind_failed(
        self, g: _Gang, failed: _Pod, outcome: BindOutcome, detail: str, now: datetime
    ) -> list[Action]:
        why = (
            f"member {failed.ref.name} of pod group {g.key[1]!r} could not be bound "
            f"({outcome.value}: {detail}); the group is deleted for its controller to re-create"
        )
        out: list[Action] = []
        for m in self._gang_members(g):
            if m.state not in _LIVE and m is not failed:
                continue
            warning = self._warn(m.ref, keys.EVENT_GANG_BIND_FAILED, why, now, "gang")
            out.append(PostEvent(m.ref, warning))
            out.append(DeletePod(m.ref, why))
        out += self._gang_end(g, "cancelled", why, now, failed)
        return out

    def _warn(
        self, ref: PodRef, reason: str, message: str, now: datetime, role: str
    ) -> dict[str, Any]:
        return event_body(
            ref, reason=reason, message=message, warning=True, at=now, role=role,
            instance=self._instance,
        )  # fmt: skip

    # --- ends -------------------------------------------------------------------------------

    def _ended(self, p: _Pod, pod: Json, ended: tuple[str, str], now: datetime) -> list[Action]:
        outcome, reason = ended
        if p.gang is not None and p.gang in self._gangs:
            g = self._gangs[p.gang]
            if outcome == "finished":
                p.succeeded = True
                p.state = PodState.ENDED
                members = self._gang_members(g)
                if all(m.succeeded for m in members) and len(members) >= g.size:
                    return self._gang_end(g, "finished", "", now, p, pod)
                return []
            p.state = PodState.ENDED
            return self._gang_end(g, outcome, reason, now, p, pod)
        if p.state not in _LIVE:
            return []
        p.state = PodState.ENDED
        at = billed_end(pod, observed_at=now, bound_at=p.bound_at)
        return [self._end_event(p.job_id, p.tenant, outcome, reason, at, p.created_ms)]

    def _gang_end(
        self,
        g: _Gang,
        outcome: str,
        reason: str,
        now: datetime,
        last: _Pod,
        pod: Json | None = None,
    ) -> list[Action]:
        if g.ended or not g.job_id:
            return []
        g.ended = True
        at = billed_end(pod or last.last, observed_at=now, bound_at=last.bound_at)
        out: list[Action] = [self._end_event(g.job_id, g.tenant, outcome, reason, at, g.created_ms)]
        for m in self._gang_members(g):
            if m.state in _LIVE:
                m.state = PodState.ENDED
        return out

    def _end_event(
        self, job_id: str, tenant: str, outcome: str, reason: str, at: datetime, created_ms: int
    ) -> Publish:
        # One id for every end of a job, whichever it is: a second end is a duplicate.
        ev_id = derived_event_id(job_id, "end", created_ms)
        ev: Event
        if outcome == "finished":
            ev = JobFinished(id=ev_id, at=at, job_id=job_id, tenant=tenant)
        elif outcome == "failed":
            ev = JobFailed(id=ev_id, at=at, job_id=job_id, tenant=tenant, reason=reason[:1024])
        else:
            ev = JobCancelled(id=ev_id, at=at, job_id=job_id, tenant=tenant, reason=reason[:1024])
        return Publish(observed.subject(tenant, outcome), ev)

    def _forget(self, p: _Pod) -> None:
        self._pods.pop(p.ref.uid, None)
        if p.gang is not None and (g := self._gangs.get(p.gang)) is not None:
            g.members.discard(p.ref.uid)
            if not g.members:
                del self._gangs[p.gang]


_INVALID_GANG = RefusalReason.INVALID_GANG


def _attempt(p: Placement) -> tuple[str, datetime]:
    """The parts of one placement share its cause and its decision time."""
    return p.cause_id, p.at


def _int(raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return 0


def _same_inventory(a: NodeInventory, b: NodeInventory) -> bool:
    return msgspec.structs.replace(a, id="", at=b.at) == msgspec.structs.replace(b, id="")
