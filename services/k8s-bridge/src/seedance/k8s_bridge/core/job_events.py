"""The job events the bridge publishes for pods, as a trusted observer (``seedance.observed``).

Owns their shape and their ids: a pod's (or a gang's) submit and its one end, with ids derived
from the job and its creation time (``derived_event_id``), so a rebuilt tracker emits the very
same events and the bus drops the repeats, keyed with the bridge's secret (``key``:
`seedance.core.id_key`, in ``seedance-k8s-bridge-jobs``): a tenant that created the pod knows
its job id and creation time, and could otherwise publish the id first on its own job subject
and have the bridge's event dropped as a duplicate (``SEEDANCE_JOBS``, which sources the
requests and the observed events, may drop a copy whose ``Nats-Msg-Id`` it holds). It must
not decide when a job starts or ends (`seedance.k8s_bridge.core.tracker` does) nor publish.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from seedance.events import Event, derived_event_id
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished, JobSubmitted
from seedance.events.subjects import observed
from seedance.k8s_bridge.core.actions import Publish
from seedance.k8s_bridge.core.pods import PodAsk

__all__ = ["end_event", "submit_event"]


def submit_event(
    ask: PodAsk, job_id: str, gang_size: int, created_ms: int, now: datetime, key: bytes
) -> Publish:
    request = msgspec.structs.replace(ask.request, gang_size=gang_size)
    ev = JobSubmitted(
        id=derived_event_id(job_id, "submitted", created_ms, key=key),
        at=now,
        job_id=job_id,
        tenant=ask.tenant,
        kind=ask.kind,
        priority=ask.priority,
        request=request,
        expected_duration_s=ask.expected_duration_s,
        labels=ask.labels,
        movable=ask.movable,
        restart_s=ask.restart_s,
    )
    return Publish(observed.subject(ask.tenant, "submitted"), ev)


def end_event(
    job_id: str,
    tenant: str,
    outcome: str,
    reason: str,
    at: datetime,
    created_ms: int,
    key: bytes,
) -> Publish:
    # One id for every end of a job, whichever it is: a second end is a duplicate.
    ev_id = derived_event_id(job_id, "end", created_ms, key=key)
    ev: Event
    if outcome == "finished":
        ev = JobFinished(id=ev_id, at=at, job_id=job_id, tenant=tenant)
    elif outcome == "failed":
        ev = JobFailed(id=ev_id, at=at, job_id=job_id, tenant=tenant, reason=reason[:1024])
    else:
        ev = JobCancelled(id=ev_id, at=at, job_id=job_id, tenant=tenant, reason=reason[:1024])
    return Publish(observed.subject(tenant, outcome), ev)
