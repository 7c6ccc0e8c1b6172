"""A gang's life in the bridge's tracker: its members gathered, its one job submitted, its parts
bound, a member's failed Binding, its end.

Gangs (``seedance.io/pod-group`` + ``seedance.io/pod-group-size``): one job with
``gang_size = size`` is submitted once every member is pending; its id is ``k8s:`` and an id
derived from the members' uids. The slicer places a gang all at once, one `Placement` per node
(``part``); the bridge binds only when the parts cover every member, each member taking its
share of a part's GPUs in the order of the members' names (so a restarted bridge assigns the
same). A group is one tenant's: a pod of another may not join it. If one member's Binding
fails after others succeeded, every member is deleted (Events say why) for their controller
to re-create, as KAI-Scheduler and Volcano do: a half-bound gang would hold GPUs and never
run; its job ends (cancelled). A gang ends when one member fails or is deleted (failed /
cancelled), or when every member succeeded (finished).

Owns the gang transitions of `seedance.k8s_bridge.core.tracker.Tracker`, on the tracker's own
state (each function takes the tracker, as the slicer's ``core.draining`` takes its scheduler).
Must not decide a single pod's life (the tracker's: its Binding, its refusal, its end), do I/O
or read a clock (times come in as arguments).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from seedance.events import Event
from seedance.events.slicing import JobRejected, Placement, Preempted, Unschedulable
from seedance.k8s_bridge.core import keys, notices
from seedance.k8s_bridge.core.actions import Action, BindOutcome, DeletePod, PostEvent
from seedance.k8s_bridge.core.ends import billed_end
from seedance.k8s_bridge.core.job_events import end_event, submit_event
from seedance.k8s_bridge.core.kube import gang_job_id
from seedance.k8s_bridge.core.pods import Gang, RefusalReason, Refused, gang_problem
from seedance.k8s_bridge.core.tracked import LIVE, PodState, TrackedGang, TrackedPod, attempt_of

if TYPE_CHECKING:
    from seedance.k8s_bridge.core.tracker import Tracker

__all__ = [
    "gang_bind_failed",
    "gang_decision",
    "join_gang",
    "member_ended",
]

Json = Mapping[str, Any]

_INVALID_GANG = RefusalReason.INVALID_GANG


def join_gang(t: Tracker, p: TrackedPod, gang: Gang, now: datetime) -> list[Action]:
    """A pending pod of a pod group: a member of its gang, which is submitted once complete."""
    key = (gang.namespace, gang.name)
    g = t._gangs.get(key)
    if g is None or g.ended:
        g = t._gangs[key] = TrackedGang(key, gang.size)
        g.tenant = p.tenant
    if g.tenant != p.tenant:
        # The namespace was relabelled since the group's first member came: this pod may
        # neither join another tenant's group nor count toward or end it.
        p.state = PodState.REFUSED
        why = f"pod group {gang.name!r} is tenant {g.tenant!r}'s, this pod {p.tenant!r}'s"
        return t._refuse(p.ref, Refused(_INVALID_GANG, why), now)
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
        return t._refuse(
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
    return _submit_gang(t, g, now)


def _submit_gang(t: Tracker, g: TrackedGang, now: datetime) -> list[Action]:
    members = [t._pods[u] for u in sorted(g.members)]
    asks = [m.ask for m in members]
    problem = gang_problem(asks, g.size)
    if problem:
        out: list[Action] = []
        for m in members:
            m.state = PodState.REFUSED
            why = Refused(_INVALID_GANG, f"pod group {g.key[1]!r}: {problem}")
            out += t._refuse(m.ref, why, now)
        del t._gangs[g.key]
        return out
    first = asks[0]
    assert first is not None
    g.job_id = gang_job_id(g.key[0], g.key[1], sorted(g.members))
    g.tenant = first.tenant
    g.gpus_per_member = first.request.gpus
    g.gpu_mem_mib = first.request.gpu_mem_mib
    g.created_ms = min(m.created_ms for m in members)
    t._jobs.add(g.tenant, g.job_id, g.key)
    for m in members:
        m.state, m.job_id = PodState.WAITING, g.job_id
    return [submit_event(first, g.job_id, g.size, g.created_ms, now, t.id_key)]


def _gang_members(t: Tracker, g: TrackedGang) -> list[TrackedPod]:
    """Members in the order they take the placement's shares: by pod name."""
    members = [t._pods[u] for u in g.members if u in t._pods]
    return sorted(members, key=lambda m: m.ref.name)


def _gang_placed(t: Tracker, g: TrackedGang, ev: Placement, now: datetime) -> list[Action]:
    g.parts[ev.id] = ev
    parts = sorted(
        (p for p in g.parts.values() if attempt_of(p) == attempt_of(ev)),
        key=lambda p: p.id,
    )
    n = g.gpus_per_member
    slots = [(part, part.gpus[i : i + n]) for part in parts for i in range(0, len(part.gpus), n)]
    if len(slots) < g.size or g.placed:
        return []
    g.placed = True
    out: list[Action] = []
    for member, (part, gpus) in zip(_gang_members(t, g), slots, strict=False):
        if member.state is PodState.WAITING:
            out.append(t._bind(member, part, gpus, g.gpu_mem_mib, now))
    return out


def gang_decision(t: Tracker, g: TrackedGang, ev: Event, now: datetime) -> list[Action]:
    """A slicer decision on a gang's job: its members bound once the parts cover them all, or
    told why it waits, was refused or preempted."""
    members = _gang_members(t, g)
    if isinstance(ev, Placement):
        return _gang_placed(t, g, ev, now)
    if isinstance(ev, Unschedulable | JobRejected):
        return notices.cannot_place(members, ev, now, t._instance)
    if isinstance(ev, Preempted):
        return notices.preemption(members, ev, now, t._instance)
    return []


def gang_bind_failed(
    t: Tracker,
    g: TrackedGang,
    failed: TrackedPod,
    outcome: BindOutcome,
    detail: str,
    now: datetime,
) -> list[Action]:
    """One member's Binding failed for good: every member deleted, the gang's job ended."""
    why = (
        f"member {failed.ref.name} of pod group {g.key[1]!r} could not be bound "
        f"({outcome.value}: {detail}); the group is deleted for its controller to re-create"
    )
    out: list[Action] = []
    for m in _gang_members(t, g):
        if m.state not in LIVE and m is not failed:
            continue
        warning = t._warn(m.ref, keys.EVENT_GANG_BIND_FAILED, why, now, "gang")
        out.append(PostEvent(m.ref, warning))
        out.append(DeletePod(m.ref, why))
    out += _gang_end(t, g, "cancelled", why, now, failed)
    return out


def member_ended(
    t: Tracker,
    g: TrackedGang,
    p: TrackedPod,
    pod: Json,
    ended: tuple[str, str],
    now: datetime,
) -> list[Action]:
    """A member's end: the gang's once every member succeeded, or at once on a failure."""
    outcome, reason = ended
    if outcome == "finished":
        p.succeeded = True
        p.state = PodState.ENDED
        members = _gang_members(t, g)
        if all(m.succeeded for m in members) and len(members) >= g.size:
            return _gang_end(t, g, "finished", "", now, p, pod)
        return []
    p.state = PodState.ENDED
    return _gang_end(t, g, outcome, reason, now, p, pod)


def _gang_end(
    t: Tracker,
    g: TrackedGang,
    outcome: str,
    reason: str,
    now: datetime,
    last: TrackedPod,
    pod: Json | None = None,
) -> list[Action]:
    """The gang's job ended (once), billed from `last`'s end; its live members end with it."""
    if g.ended or not g.job_id:
        return []
    g.ended = True
    at = billed_end(pod or last.last, observed_at=now, bound_at=last.bound_at)
    out: list[Action] = [end_event(g.job_id, g.tenant, outcome, reason, at, g.created_ms, t.id_key)]
    for m in _gang_members(t, g):
        if m.state in LIVE:
            m.state = PodState.ENDED
    return out
