"""What the slicer's scheduler decides: placements, waits, refusals, evictions, MIG plans, ends,
capacity plans.

Owns the typed effects `Scheduler` returns for every input and the one mapping of a fine
waiting reason (a metric label) to the published `UnschedulableReason` value. The shell turns
effects into wire events (`seedance.slicer.mapping`); this module must not know the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedance.slicer.core.capacity_plan import PoolPlan
from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.quota import RejectReason

__all__ = [
    "QUOTA_HELD",
    "CapacityPlanned",
    "Effect",
    "Ended",
    "Evicted",
    "GpuShare",
    "MigPlanned",
    "Placed",
    "Refused",
    "RejectedInput",
    "ShareSet",
    "Waiting",
    "ended_answer",
    "published_reason",
    "unknown_answer",
]


@dataclass(frozen=True, slots=True)
class GpuShare:
    index: int
    milli: int = 1000
    mig_profile: str | None = None
    mig_start_slot: int | None = None


@dataclass(frozen=True, slots=True)
class Placed:
    """A job (or, for a gang spread over nodes, its members on one node: `part`) starts.
    `attempt` counts the job's placements (1, then 2 after a preemption, ...)."""

    job: JobSpec
    node: str
    gpu_model: str
    kind: str  # whole | shared | mig | cpu
    gpus: tuple[GpuShare, ...]
    attempt: int
    part: int = 0
    #: The GPUs of the whole placement, (node, physical GPU index), every part's: each part
    #: is dated over all of them, so a gang's parts start at one instant
    #: (`SchedulerState.publish_at_s`; the ledger ends them together). () for one part: its own.
    placement: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job waits; `reason` is the fine label (metrics), `published_reason()` the event's."""

    job: JobSpec
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Refused:
    """A job that will never be queued (bad input, unknown tenant)."""

    job: JobSpec
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Evicted:
    job: JobSpec
    node: str
    by_job_id: str
    reason: str  # priority | quota_reclaim | node_removed | consolidation
    #: The preempting job's tenant: the job's own for `priority`, a cohort member's for
    #: `quota_reclaim`.
    by_tenant: str = ""
    #: Why, in words, where the reason needs more (a consolidation move's drained node).
    detail: str = ""
    #: The GPUs it freed, (node, physical GPU index), on every node it held (a gang's other
    #: nodes too, a MIG instance's GPU): a placement there caused by the same input is dated
    #: no earlier than this eviction (`SchedulerState.publish_at_s`).
    gpus: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MigPlanned:
    node: str
    gpu: int
    destroy: tuple[tuple[str, int], ...]
    create: tuple[tuple[str, int], ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Ended:
    """A job ended (finished, failed, cancelled) and what it held is free; `was_placed` says
    whether it held anything (False: it ended while it waited); `floor_s` is the job's floor
    when it ended (its trusted submit or the latest decision published about it, its latest
    placement among them: `SchedulerState.job_floor_s`), before which its end is never dated
    (`SchedulerState.publish_at_s`)."""

    job: JobSpec
    outcome: str  # finished | failed | cancelled
    was_placed: bool
    floor_s: float | None = None
    #: The GPUs it freed, (node, physical GPU index; a MIG instance's GPU): a placement
    #: there caused by the same input is dated no earlier than this end.
    gpus: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RejectedInput:
    """A tenant input the scheduler refuses and answers: a duplicate submit with another
    request (`duplicate_job`), a start or end of a job it does not know (`unknown_job`) or that
    has ended (`job_ended`)."""

    tenant: str
    job_id: str
    reason: str  # duplicate_job | unknown_job | job_ended
    detail: str


@dataclass(frozen=True, slots=True)
class CapacityPlanned:
    """A pool's capacity plan at a consolidation round (`core.capacity_plan.PoolPlan`)."""

    plan: PoolPlan


@dataclass(frozen=True, slots=True)
class ShareSet:
    """The scheduler set a running shared job's share itself (`core.resize`), from
    `from_milli` to `to_milli`, and says so, so that the node agent and the ledger follow the
    share it holds. `why`: `kept` (a rollback asked `from_milli` and the GPU had room for
    `to_milli` only, the job may not move) or `given_back` (room freed on its GPU gives it more
    of what a rollback asked)."""

    job: JobSpec
    node: str
    gpu: int
    from_milli: int
    to_milli: int
    why: str
    detail: str


Effect = (
    Placed
    | Waiting
    | Refused
    | Evicted
    | MigPlanned
    | Ended
    | RejectedInput
    | CapacityPlanned
    | ShareSet
)

#: The reasons a job is held for its quota, published as `over_quota`, which a release of quota
#: may cure (`core.tenant_waiting.freed_retry`): every refusal of the quota but the two refused
#: at submit (`unknown_tenant`, `invalid_request`). `duplicate_workload` is among them and is
#: never a held job's reason (a held job holds no quota for its key to be admitted twice).
QUOTA_HELD = frozenset(
    {r.value for r in RejectReason} - {RejectReason.UNKNOWN_TENANT, RejectReason.INVALID_REQUEST}
)


def published_reason(reason: str) -> str:
    """The `UnschedulableReason` value for a fine reason (closed sets on both sides)."""
    if reason in ("unknown_tenant", "invalid_request", "tenant_paused", "unsatisfiable"):
        return reason
    if reason in QUOTA_HELD:
        return "over_quota"
    if reason.endswith("no_allowed_gpu_model") or reason == "no_mig_profile":
        return "no_matching_gpu"
    return "no_capacity"


def ended_answer(tenant: str, job_id: str, what: str) -> RejectedInput:
    return RejectedInput(
        tenant, job_id, "job_ended",
        f"{what} of job {job_id!r} of tenant {tenant!r}: the job has already ended",
    )  # fmt: skip


def unknown_answer(tenant: str, job_id: str, what: str) -> RejectedInput:
    return RejectedInput(
        tenant, job_id, "unknown_job",
        f"{what} of job {job_id!r} of tenant {tenant!r}: no such job was submitted",
    )  # fmt: skip
