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

Jobs are keyed by (tenant, job id), the tenant the pod's namespace's when its job is
submitted (a relabel later moves no submitted job): a decision reaches a pod only under that
tenant (one naming the pod's job under another is `foreign`: refused). A pod's job id
(``k8s:<uid>``, `seedance.events.jobs.pod_job_id`) is in a space no tenant may submit into.
A pod whose namespace is bound to no tenant is refused and taken again once it is. A bound pod
new to the tracker (after a restart) is taken over only under the job the bridge recorded for
it (`seedance.k8s_bridge.core.adoption`), never on its annotation's word.

Gangs (``seedance.io/pod-group`` + ``seedance.io/pod-group-size``): one job for the whole
group, bound once the slicer's parts cover every member, ended with its first failed member or
its last success; their transitions live in `seedance.k8s_bridge.core.gangs`, on this tracker's
state.

The values it emits are `seedance.k8s_bridge.core.actions`' (re-exported here), its records of
pods and gangs `seedance.k8s_bridge.core.tracked`'s, and the job events' shape and ids
`seedance.k8s_bridge.core.job_events`'.

Must not do I/O or read a clock (times come in as arguments).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from seedance.events import Event
from seedance.events.jobs import pod_job_id
from seedance.events.slicing import GpuAssignment, JobRejected, Placement, Preempted, Unschedulable
from seedance.events.subjects import telemetry
from seedance.events.telemetry import NodeInventory, NodeState
from seedance.k8s_bridge.core import keys, notices
from seedance.k8s_bridge.core.actions import (
    Action,
    Bind,
    BindOutcome,
    DeletePod,
    PatchStatus,
    PostEvent,
    Publish,
)
from seedance.k8s_bridge.core.adoption import JobRecords, adoption, scheduled_at
from seedance.k8s_bridge.core.ends import billed_end, end_kind
from seedance.k8s_bridge.core.gangs import gang_bind_failed, gang_decision, join_gang, member_ended
from seedance.k8s_bridge.core.job_events import end_event, submit_event
from seedance.k8s_bridge.core.kube import (
    binding_body,
    devices_text,
    node_name,
    parse_annotation,
    placement_annotation,
)
from seedance.k8s_bridge.core.nodes import (
    UndescribedNode,
    held_cordoned,
    node_inventory,
    same_inventory,
)
from seedance.k8s_bridge.core.pods import (
    PodRef,
    RefusalReason,
    Refused,
    pod_ask,
    pod_ref,
    tenant_for,
)
from seedance.k8s_bridge.core.tracked import (
    LIVE,
    JobIndex,
    JobKey,
    PodState,
    TrackedGang,
    TrackedPod,
    created_ms,
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


class Tracker:
    """See the module docstring. ``instance`` names this bridge in its Events; ``id_key`` keys
    the ids of the job events it publishes (`job_events`)."""

    def __init__(self, *, instance: str = "", id_key: bytes) -> None:
        self._instance = instance
        self.id_key = id_key
        self._pods: dict[str, TrackedPod] = {}
        self._gangs: dict[tuple[str, str], TrackedGang] = {}
        self._jobs = JobIndex()
        self._nodes: dict[str, NodeInventory] = {}
        #: namespace -> tenant, from TenantQuota bindings (``policy.reconcile``) and from labels.
        self.bindings: Mapping[str, str] = {}
        self.labelled: dict[str, str] = {}
        #: PriorityClass name -> value (used when a pod's ``spec.priority`` is unset).
        self.priorities: dict[str, int] = {}
        #: The jobs the bridge recorded as submitted (KV), read on taking the lead: a bound
        #: pod is taken over only under its record.
        self.records = JobRecords()
        #: Pods refused only because their namespace is bound to no tenant (yet).
        self._unbound: set[str] = set()

    # --- queries (metrics, tests) ------------------------------------------------------------

    def state_of(self, uid: str) -> PodState | None:
        p = self._pods.get(uid)
        return p.state if p else None

    def counts(self) -> dict[str, int]:
        states = [p.state.value for p in self._pods.values()]
        return {s.value: states.count(s.value) for s in PodState}

    def live_jobs(self) -> set[JobKey]:
        """The (tenant, job) of pods that are submitted and not ended (the gangs' too)."""
        out = {(p.tenant, p.job_id) for p in self._pods.values() if p.state in LIVE and p.job_id}
        out |= {(g.tenant, g.job_id) for g in self._gangs.values() if g.job_id and not g.ended}
        return out

    def orphan_ended(self, job_id: str, tenant: str, created_ms: int, now: datetime) -> Publish:
        """The end of a job whose pod went while no bridge ran: cancelled, at the bridge's time
        (the best bound it has)."""
        return end_event(job_id, tenant, "cancelled", _ORPHANED, now, created_ms, self.id_key)

    # --- namespaces and nodes ---------------------------------------------------------------

    def namespace_seen(
        self, ns: Json, now: datetime | None = None, *, deleted: bool = False
    ) -> list[Action]:
        """A namespace's tenant label; with ``now``, the submits of pods that waited for their
        namespace to be bound to a tenant and now are. A relabel moves no pod already
        submitted: each keeps the tenant its job was submitted for."""
        md = ns.get("metadata") or {}
        name = str(md.get("name", ""))
        tenant = (md.get("labels") or {}).get(keys.LABEL_TENANT)
        if deleted or not tenant:
            self.labelled.pop(name, None)
        else:
            self.labelled[name] = str(tenant)
        return self._unbound_again(now) if now is not None else []

    def rebind(self, bindings: Mapping[str, str], now: datetime) -> list[Action]:
        """New namespace -> tenant bindings (the TenantQuotas'), as `namespace_seen`."""
        self.bindings = bindings
        return self._unbound_again(now)

    def _unbound_again(self, now: datetime) -> list[Action]:
        """Pods refused because their namespace had no tenant, taken again where it has one."""
        out: list[Action] = []
        for uid in sorted(self._unbound):
            p = self._pods.get(uid)
            if p is not None and p.state is PodState.REFUSED:
                if isinstance(tenant_for(p.ref.namespace, self.bindings, self.labelled), Refused):
                    continue
                del self._pods[uid]
                out += self._new_pod(p.last, p.ref, now)
            self._unbound.discard(uid)
        return out

    def node_seen(self, node: Json, now: datetime, *, deleted: bool = False) -> list[Action]:
        """The node's inventory when it changed since the last one published.

        Raises:
            UndescribedNode: the node's labels cannot describe it; where an inventory of it was
                published, it is published again ``cordoned`` (`held_cordoned`), in the
                exception's ``held``.
        """
        try:
            inv = node_inventory(node, now, deleted=deleted, key=self.id_key)
        except UndescribedNode as exc:
            last = self._nodes.get(exc.node)
            if not deleted and last is not None and last.state is not NodeState.REMOVED:
                inv = held_cordoned(last, node, now, key=self.id_key)
                if not same_inventory(last, inv):
                    self._nodes[inv.node] = inv
                    exc.held = [Publish(telemetry.inventory(inv.node), inv)]
            raise
        last = self._nodes.get(inv.node)
        if last is not None and same_inventory(last, inv):
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
                self._gone(known)
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
        created = created_ms(pod)
        if spec.get("nodeName"):
            adopted = self._adopt_bound(pod, ref, created, now)
            if adopted is not None:
                return adopted
        ask = pod_ask(
            pod, bindings=self.bindings, labelled=self.labelled, priorities=self.priorities
        )
        if isinstance(ask, Refused):
            self._pods[ref.uid] = TrackedPod(ref, PodState.REFUSED, created, last=pod)
            if ask.reason is RefusalReason.NO_TENANT:
                self._unbound.add(ref.uid)  # taken again once its namespace is bound
            return self._refuse(ref, ask, now)
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            # Ended without ever being bound by us (never placed): nothing to submit.
            self._pods[ref.uid] = TrackedPod(ref, PodState.ENDED, created, last=pod)
            return []
        if ask.gang is None:
            job_id = pod_job_id(ref.uid)
            p = TrackedPod(ref, PodState.WAITING, created, ask, job_id, ask.tenant, last=pod)
            self._pods[ref.uid] = p
            self._jobs.add(ask.tenant, job_id, ref.uid)
            return [submit_event(ask, job_id, ask.request.gang_size, created, now, self.id_key)]
        p = TrackedPod(ref, PodState.GROUPING, created, ask, tenant=ask.tenant, last=pod)
        p.gang = (ask.gang.namespace, ask.gang.name)
        self._pods[ref.uid] = p
        return join_gang(self, p, ask.gang, now)

    def _adopt_bound(
        self, pod: Json, ref: PodRef, created: int, now: datetime
    ) -> list[Action] | None:
        """A bound pod new to this tracker is taken over under the job and tenant the bridge
        recorded for it (`seedance.k8s_bridge.core.adoption`), else refused; one that ended
        has no record once its end went out: it is only remembered. None: no annotation."""
        tenant = tenant_for(ref.namespace, self.bindings, self.labelled)
        adopted = adoption(pod, ref, self.records, tenant if isinstance(tenant, str) else "")
        if isinstance(adopted, Refused):
            done = end_kind(pod, deleted=False) is not None
            state = PodState.ENDED if done else PodState.REFUSED
            self._pods[ref.uid] = TrackedPod(ref, state, created, last=pod)
            return [] if done else self._refuse(ref, adopted, now)
        if adopted is None:
            return None
        tenant, job_id, node = adopted.tenant, adopted.job_id, adopted.node
        p = TrackedPod(ref, PodState.BOUND, created, job_id=job_id, tenant=tenant, node=node)
        p.bound_at, p.last = adopted.bound_at, pod
        if adopted.gang is not None:
            g = self._gangs.setdefault(adopted.gang, TrackedGang(adopted.gang, adopted.gang_size))
            if g.job_id and (g.job_id, g.tenant) != (job_id, tenant):
                p.state = PodState.REFUSED
                self._pods[ref.uid] = p
                why = f"pod group {adopted.gang[1]!r} is another job's ({g.tenant}/{g.job_id})"
                return self._refuse(ref, Refused(RefusalReason.NOT_ADOPTED, why), now)
            g.members.add(ref.uid)
            g.job_id, g.tenant = job_id, tenant
            p.gang = adopted.gang
            self._jobs.add(tenant, job_id, adopted.gang)
        else:
            self._jobs.add(tenant, job_id, ref.uid)
        self._pods[ref.uid] = p
        ended = end_kind(pod, deleted=False)
        return self._ended(p, pod, ended, now) if ended else []

    def _bound_meanwhile(self, p: TrackedPod, pod: Json, now: datetime) -> list[Action]:
        """A waiting pod that is bound now: by us (another leader, before a hand-over: our
        annotation names it) it is simply bound; by anyone else it left Seedance's hands."""
        doc = parse_annotation((pod.get("metadata") or {}).get("annotations") or {})
        node = str((pod.get("spec") or {}).get("nodeName"))
        if doc is not None and (doc.get("podUid"), doc.get("jobId")) == (p.ref.uid, p.job_id):
            p.state, p.node = PodState.BOUND, node
            p.bound_at = scheduled_at(pod) or now
            ended = end_kind(pod, deleted=False)
            return self._ended(p, pod, ended, now) if ended else []
        return self._ended(p, pod, ("failed", f"bound to {node} by another scheduler"), now)

    def _refuse(self, ref: PodRef, why: Refused, now: datetime) -> list[Action]:
        return notices.refusal(ref, why, now, self._instance)

    # --- decisions --------------------------------------------------------------------------

    def decision(self, ev: Event, now: datetime) -> list[Action]:
        """A slicer decision from the bus; decisions on jobs that are not pods are ignored, and
        so are decisions naming a pod's job under another tenant than the pod's (`foreign`)."""
        target = self._jobs.get(_key_of(ev))
        if target is None:
            return []
        if isinstance(target, tuple):
            g = self._gangs.get(target)
            return gang_decision(self, g, ev, now) if g is not None else []
        p = self._pods.get(target)
        if p is None:
            return []
        if isinstance(ev, Placement):
            if p.state is not PodState.WAITING:
                return []  # a redelivery, or a placement of a pod already gone
            gpu_mem = p.ask.request.gpu_mem_mib if p.ask else 0
            return [self._bind(p, ev, list(ev.gpus), gpu_mem, now)]
        if isinstance(ev, Unschedulable | JobRejected):
            return notices.cannot_place([p], ev, now, self._instance)
        if isinstance(ev, Preempted):
            return notices.preemption([p], ev, now, self._instance)
        return []  # JobReleased: the slicer confirms an end the bridge reported

    def _bind(
        self,
        p: TrackedPod,
        ev: Placement,
        gpus: list[GpuAssignment],
        gpu_mem_mib: int,
        now: datetime,
    ) -> Bind:
        node = node_name(ev.node)
        g = self._gangs.get(p.gang) if p.gang else None
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
            # the members the job id was derived from: the node agent's proof of membership
            gang=(g.key[1], sorted(g.members)) if g is not None else None,
        )
        p.state, p.node, p.bound_at = PodState.BINDING, node, now
        p.devices = devices_text(node, gpus, ev.kind.value)
        return Bind(p.ref, node, binding_body(p.ref, node, annotation))

    def foreign(self, ev: Event) -> bool:
        """Whether a decision names one of our pods' jobs under another tenant than the pod's:
        the answer to a job a bus tenant submitted under a pod's id (only a pod bound before
        pods' jobs had a space of their own can still be named so). Never acted on."""
        return self._jobs.foreign(_key_of(ev))

    def holds(self, ev: Event) -> bool:
        """Whether a decision must stay unacknowledged: a part of a gang's placement while the
        gang is not yet placed whole (acked, it would be lost to a restart; redelivered, the
        tracker takes it again by its id)."""
        if not isinstance(ev, Placement):
            return False
        target = self._jobs.get(_key_of(ev))
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
            return [notices.scheduled(ref, devices, p.job_id, now, self._instance)]
        if outcome is BindOutcome.GONE:
            return self._ended(p, p.last, ("cancelled", "pod deleted before binding"), now)
        if g is not None:
            return gang_bind_failed(self, g, p, outcome, detail, now)
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

    def _warn(
        self, ref: PodRef, reason: str, message: str, now: datetime, role: str
    ) -> dict[str, Any]:
        return notices.warning(ref, reason, message, now, role, self._instance)

    # --- ends -------------------------------------------------------------------------------

    def _ended(
        self, p: TrackedPod, pod: Json, ended: tuple[str, str], now: datetime
    ) -> list[Action]:
        if p.gang is not None and p.gang in self._gangs:
            return member_ended(self, self._gangs[p.gang], p, pod, ended, now)
        outcome, reason = ended
        if p.state not in LIVE:
            return []
        p.state = PodState.ENDED
        at = billed_end(pod, observed_at=now, bound_at=p.bound_at)
        return [end_event(p.job_id, p.tenant, outcome, reason, at, p.created_ms, self.id_key)]

    def _gone(self, p: TrackedPod) -> None:
        """An ended pod deleted: forgotten, with its job (a gang's stays with the gang)."""
        del self._pods[p.ref.uid]
        if p.gang is None:
            self._jobs.drop(p.tenant, p.job_id)

    def _forget(self, p: TrackedPod) -> None:
        self._pods.pop(p.ref.uid, None)
        self._unbound.discard(p.ref.uid)
        if p.gang is not None and (g := self._gangs.get(p.gang)) is not None:
            g.members.discard(p.ref.uid)
            if not g.members:
                del self._gangs[p.gang]


_ORPHANED = "pod deleted while no bridge watched"


def _key_of(ev: Event) -> JobKey:
    """The (tenant, job) a decision is about (every slicer decision names both)."""
    return str(getattr(ev, "tenant", "")), str(getattr(ev, "job_id", ""))
