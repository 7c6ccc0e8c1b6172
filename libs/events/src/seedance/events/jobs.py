"""Job lifecycle events, published by users (through the SDK) and by workload runtimes.

A job asks for GPUs in one of three shapes: whole GPUs (``gpus >= 1``, ``gpu_milli == 1000``),
a share of one GPU (``gpus == 1``, ``gpu_milli < 1000``; time-slicing or MPS), or a MIG
instance (``mig_profile`` set). ``gpus == 0`` is a CPU-only job.

Every bound a request must meet is declared here, once, as msgspec ``Meta`` on the field: the
SDK and CLI validate with these same types before publishing, and every service decodes with
them, so a value the SDK accepts is one the slicer accepts (integers above 2^63 once passed the
CLI and poisoned a slicer batch). The bounds are generous (a request may be refused later for
want of capacity, never for a limit that is not written here).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Annotated

import msgspec

from seedance.events.base import Event, derived_event_id
from seedance.events.subjects import SubjectShapeError, parse_tenant_subject
from seedance.events.tokens import Name, TenantId, anchored

__all__ = [
    "K8S_JOB_PREFIX",
    "MAX_GPUS",
    "MAX_RESTART_S",
    "MOVE_REFUSED_WITHIN_S",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "JobCancelled",
    "JobEvent",
    "JobFailed",
    "JobFinished",
    "JobKind",
    "JobMoveRefused",
    "JobStarted",
    "JobSubmitted",
    "MoveRefusedCause",
    "ObservedJobEvent",
    "ResourceRequest",
    "gang_job_id",
    "is_k8s_job",
    "pod_job_id",
    "request_problem",
    "tenant_job_problem",
]

#: The job ids of Kubernetes pods and pod groups, which the k8s-bridge publishes as a trusted
#: observer (``seedance.observed``): ``k8s:<pod uid>``, a group's ``k8s:<id derived from its
#: members>``. It is a space no tenant may submit into: a request on a tenant's own subjects
#: (``seedance.jobs.<tenant>.*``) naming such an id is dead-lettered by every consumer
#: (`tenant_job_problem`), so a bus tenant can neither claim, end or
#: block a pod's job nor be reached by one. (Pod uids are visible to anyone who lists pods.)
K8S_JOB_PREFIX = "k8s:"

#: Kubernetes' PriorityClass range (int32); the slicer caps a request at its quota's bound.
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1
#: Upper bounds of a request. A node holds 16 GPUs at most today; 1024 leaves room for any
#: gang member, 16 TiB of GPU memory, 10,000 cores and 2 PiB of host memory per member.
MAX_GPUS = 1024
MAX_GPU_MEM_MIB = 16 * 1024 * 1024
MAX_CPU_MILLI = 10_000_000
MAX_MEMORY_MIB = 2 * 1024**3
MAX_GANG_SIZE = 4096
#: A job's expected run time is at most a year.
MAX_EXPECTED_DURATION_S = 366 * 86_400.0
#: A restart (re-load, re-warm, checkpoint restore) costs a job at most a day.
MAX_RESTART_S = 86_400.0

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Priority = Annotated[int, msgspec.Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)]
GpuModel = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
MigProfile = Annotated[
    str, msgspec.Meta(pattern=anchored(r"[0-9]+g\.[0-9]+gb(?:\+[a-z]+)?"), max_length=32)
]
LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
LabelValue = Annotated[str, msgspec.Meta(max_length=256)]
#: A human-readable reason (a failure's, a cancellation's).
Reason = Annotated[str, msgspec.Meta(max_length=1024)]


def pod_job_id(uid: str) -> str:
    """The job id of a lone pod (its ``metadata.uid``) in the Kubernetes pods' space."""
    return f"{K8S_JOB_PREFIX}{uid}"


def gang_job_id(namespace: str, group: str, members: Sequence[str]) -> str:
    """A pod group's job id in the Kubernetes pods' space: ``k8s:`` and an id derived from its
    namespace, name and members' uids (sorted), none of which a bus tenant chooses."""
    derived = derived_event_id(f"gang/{namespace}/{group}/{','.join(sorted(members))}", "job")
    return f"{K8S_JOB_PREFIX}{derived}"


def is_k8s_job(job_id: str) -> bool:
    """Whether ``job_id`` is in the Kubernetes pods' space (`K8S_JOB_PREFIX`)."""
    return job_id.startswith(K8S_JOB_PREFIX)


def tenant_job_problem(subject: str, job_id: str | None) -> str:
    """Why a tenant's request on ``subject`` may not name ``job_id`` ("" when it may, or when
    ``subject`` is no tenant's request subject).

    A Kubernetes pod's job (``k8s:...``) is the k8s-bridge's, reported on
    ``seedance.observed``: a tenant that could submit, start or end one on its own subjects
    would take the pod's job (its placement would bind the pod, its preemption delete it, its
    end stop the pod's bill) or block the pod's own submit. Every consumer refuses such a
    request (``seedance.core.consumer``: dead-lettered as ``reserved_job_id``), the SDK before
    publishing.
    """
    if job_id is None or not job_id.startswith(K8S_JOB_PREFIX):
        return ""
    try:
        parsed = parse_tenant_subject(subject)
    except SubjectShapeError:
        return ""  # owner_of refuses the subject itself
    if parsed is None or parsed.family != "jobs":
        return ""
    return (
        f"job_id {job_id!r} on {subject!r}: ids starting {K8S_JOB_PREFIX!r} are the jobs of "
        "Kubernetes pods, which only the k8s-bridge reports; a tenant's job needs another id"
    )


def request_problem(
    *, gpus: int, gpu_milli: int, mig_profile: str | None, gang_size: int, mig: bool = False
) -> str:
    """Why a request's fields do not make one of the three shapes ("" when they do).

    The one statement of the rule that crosses fields (the per-field bounds are the ``Meta``
    above): ``ResourceRequest`` runs it on every decode and construction, so the SDK and the CLI
    refuse such a request before publishing, and the slicer runs it on the requests it takes
    without a wire event (its core's `JobSpec`), so both sides refuse the same requests.
    """
    if gpu_milli < 1000 and gpus > 1:
        return f"a shared-GPU request takes one GPU: gpus={gpus} with gpu_milli={gpu_milli}"
    if (mig_profile is not None or mig) and (gpus != 1 or gang_size != 1):
        return (
            "a MIG request takes one instance: gpus=1 and gang_size=1, "
            f"got gpus={gpus} gang_size={gang_size}"
        )
    return ""


class JobKind(enum.StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"


class ResourceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What one job needs.

    Attributes:
        gpus: GPUs per gang member (0 for CPU-only).
        gpu_milli: share of each GPU in thousandths; 1000 is a whole GPU.
        gpu_mem_mib: GPU memory per GPU; 0 means "whatever the GPU has".
        mig_profile: a MIG profile such as ``"3g.40gb"``; the job then gets one MIG instance.
        mig: one MIG instance, of ``mig_profile`` or, when none is named, of the SlicingPolicy's
            default profile (``spec.mig.defaultProfile``) in force when the slicer takes it.
        gpu_models: allowed GPU models; empty means any.
        gang_size: members placed all or nothing.
    """

    gpus: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS)] = 1
    gpu_milli: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1000
    gpu_mem_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_MEM_MIB)] = 0
    mig_profile: MigProfile | None = None
    mig: bool = False
    gpu_models: Annotated[list[GpuModel], msgspec.Meta(max_length=32)] = msgspec.field(
        default_factory=list
    )
    cpu_milli: Annotated[int, msgspec.Meta(ge=0, le=MAX_CPU_MILLI)] = 0
    memory_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_MEMORY_MIB)] = 0
    gang_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_GANG_SIZE)] = 1

    def __post_init__(self) -> None:
        problem = request_problem(
            gpus=self.gpus,
            gpu_milli=self.gpu_milli,
            mig_profile=self.mig_profile,
            gang_size=self.gang_size,
            mig=self.mig,
        )
        if problem:
            raise ValueError(problem)


class JobSubmitted(Event, frozen=True, kw_only=True, tag="job.submitted.v1"):
    job_id: Name
    tenant: TenantId
    kind: JobKind = JobKind.TRAINING
    #: The priority the tenant asks for; the slicer caps it at the tenant's quota bound.
    priority: Priority = 0
    request: ResourceRequest
    #: Expected run time, when known (replays know it; the scheduler may backfill with it).
    expected_duration_s: (
        Annotated[float, msgspec.Meta(ge=0.0, le=MAX_EXPECTED_DURATION_S)] | None
    ) = None
    labels: Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=dict
    )
    #: The job may be stopped and placed again elsewhere to empty a node (a consolidation
    #: move). False by default: a job that did not say so is never moved for consolidation.
    movable: bool = False
    #: What one restart costs the job beyond its lost progress (model load, warm-up), when the
    #: submitter knows it; the slicer weighs moves with it (its default when None).
    restart_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RESTART_S)] | None = None


class JobStarted(Event, frozen=True, kw_only=True, tag="job.started.v1"):
    job_id: Name
    tenant: TenantId


class JobFinished(Event, frozen=True, kw_only=True, tag="job.finished.v1"):
    job_id: Name
    tenant: TenantId


class JobFailed(Event, frozen=True, kw_only=True, tag="job.failed.v1"):
    job_id: Name
    tenant: TenantId
    reason: Reason = ""


class JobCancelled(Event, frozen=True, kw_only=True, tag="job.cancelled.v1"):
    job_id: Name
    tenant: TenantId
    reason: Reason = ""


JobEvent = JobSubmitted | JobStarted | JobFinished | JobFailed | JobCancelled


class MoveRefusedCause(enum.StrEnum):
    """Why a consolidation move did not happen (`JobMoveRefused.cause`)."""

    #: The eviction was answered 429: a PodDisruptionBudget allows no disruption.
    DISRUPTION_BUDGET = "disruption_budget"
    #: The API server never answered the eviction (no answer, 5xx) within the bridge's tries.
    UNANSWERED = "unanswered"


#: The longest a consolidation move's refusal (`JobMoveRefused`) may take to be reported after
#: the move's decision, when the bridge and the bus are up: a contract between two services with
#: separate settings, checked where each starts. The k8s-bridge refuses eviction settings whose
#: give-up (its waits between tries plus each try's request timeout) comes later; the slicer
#: refuses a consolidation hold shorter, so a refusal reported in time finds the emptied node
#: still held and its old GPUs free. A later report (a bridge down meanwhile) is still undone
#: while the job runs and its old GPUs are free (`seedance.slicer.core.refused_moves`).
MOVE_REFUSED_WITHIN_S = 480.0


class JobMoveRefused(Event, frozen=True, kw_only=True, tag="job.move_refused.v1"):
    """A consolidation move the cluster refused (issue 30): the k8s-bridge's eviction of the
    job's pod was answered 429 because a PodDisruptionBudget allows no disruption, or was not
    answered within the bridge's tries (``cause``), so the pod still runs on ``node`` as far as
    the bridge knows. Observed by the bridge for its own cluster only, published once per
    refused decision (``decision_id``: the slicer's ``slice.preempted.v1`` it carried out; the
    event id is derived from it) on ``seedance.observed.<tenant>.move_refused``, which no tenant
    may publish on. ``at`` is when the refusal was observed: the slicer undoes the move there."""

    job_id: Name
    tenant: TenantId
    node: Name
    decision_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    reason: Reason = ""
    #: A report from before the field existed was a budget's refusal.
    cause: MoveRefusedCause = MoveRefusedCause.DISRUPTION_BUDGET


#: What only a trusted observer reports about a job (never a tenant's request, so not a
#: `JobEvent`, which the SDK and the CLI build).
ObservedJobEvent = JobEvent | JobMoveRefused
