"""Job events as the SDK builds them: one per call, checked against the event types' bounds.

Owns building and validating a tenant's job events before anything is published (the bounds
are declared once, on the schema, so an event built here is one the slicer decodes) and the
subject kind each is published under. Must not publish or touch the bus: ``client`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict

import msgspec

from seedance.core.clock import WALL_CLOCK, Clock
from seedance.events import new_event_id
from seedance.events.jobs import (
    JobCancelled,
    JobEvent,
    JobFailed,
    JobFinished,
    JobKind,
    JobStarted,
    JobSubmitted,
    tenant_job_problem,
)
from seedance.events.subjects import jobs
from seedance.events.tokens import check_tenant, check_token

__all__ = ["KIND_OF", "JobRequest", "job_event", "job_submitted"]


#: The subject kind each job event is published under (``seedance.jobs.<tenant>.<kind>``).
KIND_OF: dict[type, str] = {
    JobSubmitted: "submitted",
    JobStarted: "started",
    JobFinished: "finished",
    JobFailed: "failed",
    JobCancelled: "cancelled",
}
_EVENT_OF = {kind: cls for cls, kind in KIND_OF.items()}


class JobRequest(TypedDict, total=False):
    """What a submit asks for besides its names and time: `job_submitted`'s keywords, so the
    client's ``submit_job`` passes them on without restating them (the defaults live there)."""

    gpus: int
    gpu_milli: int
    gpu_mem_mib: int
    mig_profile: str | None
    mig: bool
    gpu_models: list[str] | None
    cpu_milli: int
    memory_mib: int
    gang_size: int
    priority: int
    kind: JobKind | str
    expected_duration_s: float | None
    labels: Mapping[str, str] | None
    movable: bool
    restart_s: float | None


def job_submitted(
    tenant: str,
    job_id: str,
    *,
    gpus: int = 1,
    gpu_milli: int = 1000,
    gpu_mem_mib: int = 0,
    mig_profile: str | None = None,
    mig: bool = False,
    gpu_models: list[str] | None = None,
    cpu_milli: int = 0,
    memory_mib: int = 0,
    gang_size: int = 1,
    priority: int = 0,
    kind: JobKind | str = JobKind.TRAINING,
    expected_duration_s: float | None = None,
    labels: Mapping[str, str] | None = None,
    movable: bool = False,
    restart_s: float | None = None,
    at: datetime | None = None,
    clock: Clock = WALL_CLOCK,
) -> JobSubmitted:
    """A ``job.submitted.v1`` checked against the schema's bounds; ValueError names a bad
    field and value (nothing is published)."""
    _check_names(tenant, job_id, "submitted")
    at = at or clock.now()
    event: JobSubmitted = _validated(
        JobSubmitted,
        id=new_event_id(at=at),
        at=at,
        job_id=job_id,
        tenant=tenant,
        kind=str(kind),
        priority=priority,
        request={
            "gpus": gpus,
            "gpu_milli": gpu_milli,
            "gpu_mem_mib": gpu_mem_mib,
            "mig_profile": mig_profile,
            "mig": mig,
            "gpu_models": list(gpu_models or []),
            "cpu_milli": cpu_milli,
            "memory_mib": memory_mib,
            "gang_size": gang_size,
        },
        expected_duration_s=expected_duration_s,
        labels=dict(labels or {}),
        movable=movable,
        restart_s=restart_s,
    )
    return event


def job_event(
    kind: str,
    tenant: str,
    job_id: str,
    *,
    at: datetime | None = None,
    reason: str = "",
    clock: Clock = WALL_CLOCK,
) -> JobEvent:
    """A ``started``, ``finished``, ``failed`` or ``cancelled`` event, checked like
    `job_submitted`."""
    if kind not in ("started", "finished", "failed", "cancelled"):
        raise ValueError(f"kind {kind!r} is not one of started, finished, failed, cancelled")
    _check_names(tenant, job_id, kind)
    extra = {"reason": reason} if kind in ("failed", "cancelled") else {}
    at = at or clock.now()
    event: JobEvent = _validated(
        _EVENT_OF[kind], id=new_event_id(at=at), at=at, job_id=job_id, tenant=tenant, **extra
    )
    return event


def _check_names(tenant: str, job_id: str, kind: str) -> None:
    """The tenant and the job id as the consumers will check them (a Kubernetes pod's job id is
    refused here, as every consumer would dead-letter it)."""
    check_tenant(tenant)
    check_token("job_id", job_id)
    problem = tenant_job_problem(jobs.subject(tenant, kind), job_id)
    if problem:
        raise ValueError(problem)


def _validated(cls: Any, **fields: Any) -> Any:
    """The event, checked by msgspec against the event type's declared bounds (the slicer
    decodes with the same type); a ValueError names the field and the bound."""
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        got = _value_at(fields, str(exc))
        raise ValueError(f"invalid {cls.__struct_config__.tag}: {exc}{got}") from exc


def _value_at(fields: Mapping[str, Any], message: str) -> str:
    """``" (got <value>)"`` for the path msgspec's message ends in (`$.request.gpus`)."""
    match = re.search(r"at `\$((?:\.\w+)+)`$", message)
    if match is None:
        return ""
    value: Any = fields
    for part in match.group(1).strip(".").split("."):
        if not isinstance(value, Mapping) or part not in value:
            return ""
        value = value[part]
    text = repr(value)
    return f" (got {text[:80]}{'...' if len(text) > 80 else ''})"
