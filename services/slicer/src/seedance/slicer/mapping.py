"""The slicer's one mapping between wire events and its core: events in, effects out.

Owns, for every event the slicer reads, which fields reach the core and, for each field that
does not, why (`NOT_CARRIED`: a test keeps it complete, so a new wire field is either carried
or refused here with a reason), and the events each core effect is published as. Every event's
`id` becomes the cause of what it decides (decision ids are derived from it) and its `at` is
read as the trusted time the service decides (`seedance.slicer.trusted_time`).

It must not decide anything (that is `seedance.slicer.core`'s) or do I/O (the service
publishes what this returns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from seedance.core import InvalidMessage
from seedance.events import Event, derived_event_id
from seedance.events.cost import PauseRequest
from seedance.events.jobs import (
    JobCancelled,
    JobFailed,
    JobFinished,
    JobStarted,
    JobSubmitted,
    ResourceRequest,
)
from seedance.events.slicing import (
    CapacityPlan,
    EndOutcome,
    GpuAssignment,
    JobRejected,
    JobReleased,
    MigInstanceChange,
    MigLayoutPlan,
    Placement,
    PlacementKind,
    Preempted,
    RejectionReason,
    ShareChanged,
    ShareChangeReason,
    Unschedulable,
    UnschedulableReason,
)
from seedance.events.subjects import slicing
from seedance.events.telemetry import GpuHealth, GpuInfo, NodeInventory
from seedance.slicer.core import (
    CapacityPlanned,
    Effect,
    Ended,
    Evicted,
    GpuSpec,
    JobSpec,
    MigPlanned,
    NodeSpec,
    Placed,
    Refused,
    RejectedInput,
    ShareChange,
    ShareSet,
    Waiting,
    published_reason,
)

__all__ = [
    "CARRIED",
    "NOT_CARRIED",
    "OUTCOMES",
    "Published",
    "job_spec",
    "node_spec",
    "published",
    "share_change",
]

#: Fields of the base `Event` every input has: `id` is the cause of its decisions, `at` its
#: (claimed or trusted) time.
_BASE = frozenset({"id", "at"})

#: Per wire type, the fields that reach the core.
CARRIED: Mapping[type, frozenset[str]] = {
    NodeInventory: _BASE | {"node", "cpu_milli", "memory_mib", "gpus", "labels", "state"},
    GpuInfo: frozenset({"index", "model", "mem_total_mib", "mig_capable", "mig_enabled",
                        "nvlink_domain"}),
    GpuHealth: _BASE | {"node", "gpu_index", "healthy"},
    PauseRequest: _BASE | {"tenant", "paused"},
    JobSubmitted: _BASE | {"job_id", "tenant", "priority", "request", "expected_duration_s",
                           "movable", "restart_s"},
    ResourceRequest: frozenset({"gpus", "gpu_milli", "gpu_mem_mib", "mig_profile", "mig",
                                "gpu_models", "cpu_milli", "memory_mib", "gang_size"}),
    JobStarted: _BASE | {"job_id", "tenant"},
    JobFinished: _BASE | {"job_id", "tenant"},
    JobFailed: _BASE | {"job_id", "tenant"},
    JobCancelled: _BASE | {"job_id", "tenant"},
    ShareChanged: _BASE | {"job_id", "tenant", "node", "gpu_index", "from_milli", "to_milli",
                           "reason"},
}  # fmt: skip

#: Per wire type, the fields that do not reach the core, and why.
NOT_CARRIED: Mapping[type, Mapping[str, str]] = {
    NodeInventory: {
        "pool": "every node the inventory consumer delivers joins this slicer's pool",
        "simulated": "a replayed node is placed on exactly like a real one",
    },
    GpuInfo: {
        "uuid": "GPUs are placed by index; the node agent resolves the index to its device",
    },
    GpuHealth: {
        "uuid": "the GPU is masked by (node, index), as it is placed",
        "reason": "why a GPU failed does not change where work goes (the collector logs it)",
        "xid": "as reason: the operator's record, not a placement input",
    },
    PauseRequest: {"reason": "a pause holds new work whatever its reason (the ledger logs it)"},
    JobSubmitted: {
        "kind": "training and inference are placed alike (the ledger reads the kind)",
        "labels": "free-form tenant metadata; placement never reads it",
    },
    ResourceRequest: {},
    JobStarted: {},
    JobFinished: {},
    JobFailed: {"reason": "the release records the outcome; the reason stays on the event"},
    JobCancelled: {"reason": "as for JobFailed"},
    ShareChanged: {
        "detail": "the loop's explanation, already on the bus; the share is what is applied",
        "cause_id": "the reading that decided it; the change's own id is the cause here",
        "mem_limit_mib": "the MPS memory limit the node agent enforces; placement counts the "
        "request's memory",
    },
}

#: Ending events and the outcome their release records.
OUTCOMES: Mapping[type, EndOutcome] = {
    JobFinished: EndOutcome.FINISHED,
    JobFailed: EndOutcome.FAILED,
    JobCancelled: EndOutcome.CANCELLED,
}


def node_spec(ev: NodeInventory) -> NodeSpec:
    return NodeSpec(
        name=ev.node,
        cpu_milli=ev.cpu_milli,
        memory_mib=ev.memory_mib,
        gpus=tuple(
            GpuSpec(
                model=g.model,
                mem_mib=g.mem_total_mib,
                mig_capable=g.mig_capable,
                mig_enabled=g.mig_enabled,
                nvlink_domain=g.nvlink_domain,
            )
            for g in sorted(ev.gpus, key=lambda g: g.index)
        ),
        labels=dict(ev.labels),
        state=ev.state.value,
    )


def job_spec(ev: JobSubmitted) -> JobSpec:
    r = ev.request
    return JobSpec(
        job_id=ev.job_id,
        tenant=ev.tenant,
        cause_id=ev.id,
        priority=ev.priority,
        gpus=r.gpus,
        gpu_milli=r.gpu_milli,
        gpu_mem_mib=r.gpu_mem_mib,
        mig_profile=r.mig_profile,
        mig=r.mig,
        gpu_models=tuple(r.gpu_models),
        cpu_milli=r.cpu_milli,
        memory_mib=r.memory_mib,
        gang_size=r.gang_size,
        expected_duration_s=ev.expected_duration_s,
        movable=ev.movable,
        restart_s=ev.restart_s,
    )


#: One publishable decision: its subject, the event, and its metric (outcome, reason).
Published = tuple[str, Event, tuple[str, str]]


def share_change(ev: ShareChanged) -> ShareChange:
    """The core's input for a share change of the slicer's own right-sizing loop. Raises
    InvalidMessage (dead-lettered) for a share that is not one of a GPU, naming it."""
    try:
        return ShareChange(
            tenant=ev.tenant, job_id=ev.job_id, node=ev.node, gpu=ev.gpu_index,
            from_milli=ev.from_milli, to_milli=ev.to_milli, reason=ev.reason.value,
            billed_at_s=ev.at.timestamp(),
        )  # fmt: skip
    except ValueError as exc:
        raise InvalidMessage(f"ShareChanged {ev.id}: {exc}", kind="invalid_input") from None


def published(
    effect: Effect, cause: Event, at: datetime, *, pool: str, policy: str, key: bytes | None
) -> Published:
    """The event `effect` (decided on `cause`) is published as, stamped `at` (the cause's
    trusted time). `key`: the slicer's secret (`seedance.core.id_key`), with which every
    decision's id is derived: its decisions reach `SEEDANCE_LEDGER_IN`, which sources the
    nodes' telemetry too (one duplicate window), and a node reads the causes (a placement
    carries its job's submit id), so an unkeyed id could be published first by a node. No
    default: only a caller that says so (a test, ``key=None``) derives them unkeyed."""
    return _BUILDERS[type(effect)](effect, cause, at, pool, policy, key)


def _placement(
    e: Placed, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    job = e.job
    ev = Placement(
        id=derived_event_id(job.cause_id, f"placement/{e.attempt}/{e.part}", key=key),
        at=at,
        job_id=job.job_id,
        tenant=job.tenant,
        node=e.node,
        pool=pool,
        gpu_model=e.gpu_model,
        kind=PlacementKind(e.kind),
        gpus=[
            GpuAssignment(
                index=g.index,
                milli=g.milli,
                mig_profile=g.mig_profile,
                mig_start_slot=g.mig_start_slot,
            )
            for g in e.gpus
        ],
        cpu_milli=job.cpu_milli * job.gang_size,
        memory_mib=job.memory_mib * job.gang_size,
        policy=policy,
        cause_id=job.cause_id,
    )
    return slicing.subject(job.tenant, "placement"), ev, ("placed", e.kind)


def _rejection(
    cause: Event,
    at: datetime,
    tenant: str,
    job_id: str,
    reason: str,
    detail: str,
    key: bytes | None,
) -> JobRejected:
    return JobRejected(
        id=derived_event_id(cause.id, f"rejected/{tenant}/{job_id}", key=key),
        at=at,
        job_id=job_id,
        tenant=tenant,
        reason=RejectionReason(reason),
        detail=detail[:1024],
        cause_id=cause.id,
        cause_type=str(type(cause).__struct_config__.tag),
    )


def _refused(
    e: Refused, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    ev = _rejection(cause, at, e.job.tenant, e.job.job_id, e.reason, e.detail or e.reason, key)
    return slicing.subject(e.job.tenant, "rejected"), ev, ("refused", e.reason)


def _rejected(
    e: RejectedInput, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    ev = _rejection(cause, at, e.tenant, e.job_id, e.reason, e.detail, key)
    return slicing.subject(e.tenant, "rejected"), ev, ("rejected", e.reason)


def _released(
    e: Ended, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    job = e.job
    ev = JobReleased(
        id=derived_event_id(cause.id, f"released/{job.tenant}/{job.job_id}", key=key),
        at=at,
        job_id=job.job_id,
        tenant=job.tenant,
        outcome=EndOutcome(e.outcome),
        was_placed=e.was_placed,
        claimed_at=cause.at,
        cause_id=cause.id,
    )
    return slicing.subject(job.tenant, "released"), ev, ("released", e.outcome)


def _unschedulable(
    e: Waiting, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    job = e.job
    ev = Unschedulable(
        id=derived_event_id(
            cause.id, f"unschedulable/{job.tenant}/{job.job_id}/{e.reason}", key=key
        ),
        at=at,
        job_id=job.job_id,
        tenant=job.tenant,
        reason=UnschedulableReason(published_reason(e.reason)),
        detail=e.detail or e.reason,
        cause_id=job.cause_id,
    )
    return slicing.subject(job.tenant, "unschedulable"), ev, ("waiting", e.reason)


def _preempted(
    e: Evicted, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    ev = Preempted(
        id=derived_event_id(cause.id, f"preempted/{e.job.tenant}/{e.job.job_id}", key=key),
        at=at,
        job_id=e.job.job_id,
        tenant=e.job.tenant,
        node=e.node or "unknown",
        # Another tenant's job id is not this tenant's to read (a cohort reclaim).
        by_job_id=e.by_job_id if e.by_tenant == e.job.tenant else "",
        reason=e.reason,
        detail=e.detail,
    )
    return slicing.subject(e.job.tenant, "preempted"), ev, ("preempted", e.reason)


#: What a published capacity plan carries of the core's plan (a field or a count it derives):
#: every field of the event but the envelope and the pool.
_PLAN_FIGURES = tuple(
    f for f in CapacityPlan.__struct_fields__ if f not in {*Event.__struct_fields__, "pool"}
)


def _capacity_plan(
    e: CapacityPlanned, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    p = e.plan
    ev = CapacityPlan(
        id=derived_event_id(cause.id, f"capacity/{pool}/{p.gpu_model}", key=key),
        at=at,
        pool=pool,
        **{f: getattr(p, f) for f in _PLAN_FIGURES},
    )
    return slicing.capacity(pool), ev, ("capacity_plan", "round")


def _mig_plan(
    e: MigPlanned, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    ev = MigLayoutPlan(
        id=derived_event_id(cause.id, f"mig/{e.node}/{e.gpu}", key=key),
        at=at,
        node=e.node,
        gpu_index=e.gpu,
        destroy=[MigInstanceChange(profile=p, start_slot=s) for p, s in e.destroy],
        create=[MigInstanceChange(profile=p, start_slot=s) for p, s in e.create],
        reason=e.reason,
    )
    return slicing.mig_plan(e.node), ev, ("mig_plan", "repartition")


def _share_set(
    e: ShareSet, cause: Event, at: datetime, pool: str, policy: str, key: bytes | None
) -> Published:
    """A share the scheduler set itself (part of a rollback: kept, or given back later), as a
    rollback's change at its cause's time (a kept share's cause is the rollback itself, at the
    same instant: each reader takes the changes in the stream's order, and the ledger a change
    at the instant of another 1 ms after it)."""
    job = e.job
    ev = ShareChanged(
        id=derived_event_id(cause.id, f"share-{e.why}/{job.tenant}/{job.job_id}", key=key),
        at=at,
        job_id=job.job_id, tenant=job.tenant, node=e.node, gpu_index=e.gpu,
        from_milli=e.from_milli, to_milli=e.to_milli, reason=ShareChangeReason.ROLLED_BACK,
        detail=e.detail[:1024], cause_id=cause.id,
    )  # fmt: skip
    return slicing.subject(job.tenant, "share"), ev, ("share", e.why)


_BUILDERS: Mapping[type, Callable[[Any, Event, datetime, str, str, bytes | None], Published]] = {
    Placed: _placement,
    Refused: _refused,
    RejectedInput: _rejected,
    Ended: _released,
    Waiting: _unschedulable,
    Evicted: _preempted,
    MigPlanned: _mig_plan,
    CapacityPlanned: _capacity_plan,
    ShareSet: _share_set,
}
