"""What the bridge tells a pod's owner in Kubernetes terms: its scheduling condition and Events.

Owns the shape of each notice the tracker gives: a refusal (the PodScheduled condition and a
warning Event), a scheduled Event, a cannot-place-now condition and Event (`cannot_place`, for
the waiting pods of a job), a preemption Event and the deletion beside it (`preemption`, for the
live pods of a job), and any other warning, each with the role its Event name is derived from
(so a rebuilt tracker posts the same Event, not a second one); a consolidation move's victim
is evicted (PodDisruptionBudgets honoured), not deleted, and a refused eviction has its
Event. It must not decide when a pod is told anything (`seedance.k8s_bridge.core.tracker`
does) nor post it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from seedance.events.jobs import JobSubmitted
from seedance.events.slicing import JobRejected, Preempted, Unschedulable
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.actions import Action, DeletePod, EvictPod, PatchStatus, PostEvent
from seedance.k8s_bridge.core.kube import event_body, node_name, scheduled_condition
from seedance.k8s_bridge.core.pods import PodRef, Refused
from seedance.k8s_bridge.core.tracked import LIVE, PodState, TrackedPod

#: `Preempted.reason` of a consolidation move (the slicer's ``CONSOLIDATION``; services never
#: import each other, the wire value is the contract).
CONSOLIDATION = "consolidation"
#: `Preempted.reason` of a move the slicer undid after the bridge reported its refusal
#: (`JobMoveRefused`): the pod never left its node, so there is nothing to do to it.
MOVE_REFUSED = "move_refused"

__all__ = [
    "cannot_place",
    "eviction_refused",
    "preempted",
    "preemption",
    "refusal",
    "scheduled",
    "unschedulable",
    "warning",
]


def warning(
    ref: PodRef, reason: str, message: str, now: datetime, role: str, instance: str
) -> dict[str, Any]:
    """A warning Event's body (``instance``: the bridge that posts it)."""
    return event_body(
        ref, reason=reason, message=message, warning=True, at=now, role=role, instance=instance
    )


def refusal(ref: PodRef, why: Refused, now: datetime, instance: str) -> list[Action]:
    """A pod Seedance will not take: its condition says why, and a warning Event."""
    message = f"{why.reason.value}: {why.message}"
    body = warning(ref, keys.EVENT_REFUSED, f"Seedance refused the pod: {message}", now,
                   "refused", instance)  # fmt: skip
    return [PatchStatus(ref, scheduled_condition(keys.REASON_REFUSED, message, now)),
            PostEvent(ref, body)]  # fmt: skip


def scheduled(ref: PodRef, devices: str, job_id: str, now: datetime, instance: str) -> PostEvent:
    """The Event of a pod bound where the slicer placed it (``devices``: where, in words)."""
    return PostEvent(
        ref,
        event_body(
            ref,
            reason=keys.EVENT_SCHEDULED,
            message=f"Successfully assigned {ref.namespace}/{ref.name} to "
            f"{devices} (Seedance job {job_id})",
            warning=False,
            at=now,
            role=f"scheduled/{job_id}",
            instance=instance,
        ),
    )


def unschedulable(
    ref: PodRef, reason: str, message: str, decision_id: str, now: datetime, instance: str
) -> list[Action]:
    """A waiting pod the slicer cannot place now: its condition and a warning Event, one per
    decision (``decision_id``)."""
    body = warning(ref, keys.EVENT_FAILED_SCHEDULING,
                   f"Seedance cannot place the pod now: {message}", now,
                   f"unschedulable/{reason}/{decision_id}", instance)  # fmt: skip
    condition = scheduled_condition(keys.REASON_UNSCHEDULABLE, message, now)
    return [PatchStatus(ref, condition), PostEvent(ref, body)]


def preempted(ref: PodRef, why: str, decision_id: str, now: datetime, instance: str) -> PostEvent:
    """The warning Event of a pod the slicer preempted (it is deleted beside it)."""
    body = warning(ref, keys.EVENT_PREEMPTED, f"Seedance {why}", now,
                   f"preempted/{decision_id}", instance)  # fmt: skip
    return PostEvent(ref, body)


def cannot_place(
    pods: list[TrackedPod], ev: Unschedulable | JobRejected, now: datetime, instance: str
) -> list[Action]:
    """The slicer cannot place (or refused) the job of ``pods``: each waiting one is told."""
    if isinstance(ev, JobRejected) and ev.cause_type != JobSubmitted.__struct_config__.tag:
        return []  # the answer to an end the bridge reported twice: nothing to show
    reason = ev.reason.value
    message = f"{reason}: {ev.detail}" if ev.detail and ev.detail != reason else reason
    out: list[Action] = []
    for p in pods:
        if p.state is PodState.WAITING:
            out += unschedulable(p.ref, reason, message, ev.id, now, instance)
    return out


def preemption(pods: list[TrackedPod], ev: Preempted, now: datetime, instance: str) -> list[Action]:
    """The slicer preempted the job of ``pods``: each live one is told and deleted, or, for a
    consolidation move (`CONSOLIDATION`: voluntary, as a drain is), evicted through the
    Eviction API so that its PodDisruptionBudgets are honoured. A `MOVE_REFUSED` preemption
    ends only the slicer's record of a placement the pod never took: nothing is done."""
    if ev.reason == MOVE_REFUSED:
        return []  # the end of a placement the pod never took (its move was refused)
    out: list[Action] = []
    why = f"preempted on {node_name(ev.node)} ({ev.reason or 'priority'})" + (
        f" by job {ev.by_job_id}" if ev.by_job_id else ""
    )
    for p in pods:
        if p.state in LIVE:
            out.append(preempted(p.ref, why, ev.id, now, instance))
            if ev.reason == CONSOLIDATION:
                out.append(EvictPod(p.ref, why, ev.id, ev.tenant, ev.job_id, ev.node))
            else:
                out.append(DeletePod(p.ref, why))
    return out


def eviction_refused(ref: PodRef, message: str, decision_id: str, now: datetime,
                     instance: str) -> PostEvent:  # fmt: skip
    """The warning Event of a consolidation move a PodDisruptionBudget refused (one per
    decision: a redelivery posts the same Event name, which the API server keeps once); the
    slicer is told (`JobMoveRefused`) and puts the job back where it runs."""
    body = warning(ref, keys.EVENT_EVICTION_BLOCKED,
                   f"Seedance's consolidation move was refused, the pod stays: {message}", now,
                   f"eviction-blocked/{decision_id}", instance)  # fmt: skip
    return PostEvent(ref, body)
