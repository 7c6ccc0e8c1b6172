"""The placement queue's values: a job, the decisions about it, its records, the configuration.

Owns the plain values `seedance.slicer.core.queue.PlacementQueue` takes and gives (`Job`, its
decisions `JobPlaced` / `JobUnschedulable` / `JobPreempted`, the records it persists through,
`QueueConfig`); the queue module re-exports them. It must not decide anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from seedance.slicer.core.model import NodeGpus, PodRequest

__all__ = [
    "Job",
    "JobPlaced",
    "JobPreempted",
    "JobUnschedulable",
    "PendingRecord",
    "QueueConfig",
    "QueueDecision",
    "RunningRecord",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A unit of work: `replicas` identical pods that start together or not at all."""

    job_id: str
    request: PodRequest
    replicas: int = 1
    priority: int = 0
    preemptible: bool = True
    tenant: str = ""
    #: The expected run time when the submitter knows it (replays do); carried for backfill
    #: with estimates, not used by the queue's order today (reservations need no estimate).
    expected_duration_s: float | None = None
    #: The submitter said the job may be stopped and placed again elsewhere (a consolidation
    #: move); `restart_s` is its hint of what one restart costs (None: the planner's default).
    movable: bool = False
    restart_s: float | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"job {self.job_id}: replicas={self.replicas} must be >= 1")


@dataclass(frozen=True, slots=True)
class JobPlaced:
    job_id: str
    placements: tuple[NodeGpus, ...]
    at_s: float
    waited_s: float
    #: The share of each GPU it holds, as the queue holds it (a right-sized one's, not the
    #: request's as submitted).
    gpu_milli: int = 1000


@dataclass(frozen=True, slots=True)
class JobUnschedulable:
    """Published when a job's reason for waiting changes (not on every pass)."""

    job_id: str
    reason: str
    at_s: float
    #: What the reason means for this job (e.g. which GPU models its request matched).
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobPreempted:
    """A running job was evicted from `node` (an index) and is back in the queue."""

    job_id: str
    by_job_id: str
    at_s: float
    node: int
    #: `priority` (the tenant's own lower-priority work) or `quota_reclaim` (a cohort member's
    #: borrowed share, taken back for a gang).
    reason: str = "priority"
    #: The GPUs it held, (node index, GPU), on every node (a gang's other nodes too).
    gpus: tuple[tuple[int, int], ...] = ()


QueueDecision = JobPlaced | JobUnschedulable | JobPreempted


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueConfig:
    backfill: bool = True
    # A job blocked this long gets nodes reserved for it. Short enough that 8-GPU jobs do not
    # starve, long enough that transient blocking does not idle nodes.
    reserve_after_s: float = 300.0
    # Reserved nodes idle while they drain: cap how many the queue may hold at once.
    max_reserved_nodes: int = 16
    preemption: bool = True


@dataclass(frozen=True, slots=True)
class RunningRecord:
    job: Job
    placements: tuple[NodeGpus, ...]
    started_s: float
    submitted_s: float
    seq: int


@dataclass(frozen=True, slots=True)
class PendingRecord:
    job: Job
    submitted_s: float
    seq: int
    reason: str
    reserved: tuple[int, ...]
