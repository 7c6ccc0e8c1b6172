"""Job lifecycle events, published by users (through the SDK) and by workload runtimes.

A job asks for GPUs in one of three shapes: whole GPUs (``gpus >= 1``, ``gpu_milli == 1000``),
a share of one GPU (``gpus == 1``, ``gpu_milli < 1000``; time-slicing or MPS), or a MIG
instance (``mig_profile`` set). ``gpus == 0`` is a CPU-only job.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name, TenantId

__all__ = [
    "JobCancelled",
    "JobEvent",
    "JobFailed",
    "JobFinished",
    "JobKind",
    "JobStarted",
    "JobSubmitted",
    "ResourceRequest",
]

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


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
        gpu_models: allowed GPU models; empty means any.
        gang_size: members placed all or nothing.
    """

    gpus: NonNegative = 1
    gpu_milli: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1000
    gpu_mem_mib: NonNegative = 0
    mig_profile: str | None = None
    gpu_models: list[str] = msgspec.field(default_factory=list)
    cpu_milli: NonNegative = 0
    memory_mib: NonNegative = 0
    gang_size: Annotated[int, msgspec.Meta(ge=1)] = 1

    def __post_init__(self) -> None:
        if self.gpu_milli < 1000 and self.gpus > 1:
            raise ValueError(
                "a shared-GPU request takes one GPU: "
                f"gpus={self.gpus} with gpu_milli={self.gpu_milli}"
            )
        if self.mig_profile is not None and self.gpus != 1:
            raise ValueError(f"a MIG request takes one instance: gpus={self.gpus}")


class JobSubmitted(Event, frozen=True, kw_only=True, tag="job.submitted.v1"):
    job_id: Name
    tenant: TenantId
    kind: JobKind = JobKind.TRAINING
    priority: int = 0
    request: ResourceRequest
    #: Expected run time, when known (replays know it; the scheduler may backfill with it).
    expected_duration_s: float | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)


class JobStarted(Event, frozen=True, kw_only=True, tag="job.started.v1"):
    job_id: Name
    tenant: TenantId


class JobFinished(Event, frozen=True, kw_only=True, tag="job.finished.v1"):
    job_id: Name
    tenant: TenantId


class JobFailed(Event, frozen=True, kw_only=True, tag="job.failed.v1"):
    job_id: Name
    tenant: TenantId
    reason: str = ""


class JobCancelled(Event, frozen=True, kw_only=True, tag="job.cancelled.v1"):
    job_id: Name
    tenant: TenantId
    reason: str = ""


JobEvent = JobSubmitted | JobStarted | JobFinished | JobFailed | JobCancelled
