"""Slicer decisions: placements, unschedulable reasons, preemptions, MIG layout plans."""

from __future__ import annotations

import enum

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name, TenantId

__all__ = [
    "GpuAssignment",
    "MigInstanceChange",
    "MigLayoutPlan",
    "Placement",
    "PlacementKind",
    "Preempted",
    "SlicingEvent",
    "Unschedulable",
    "UnschedulableReason",
]


class PlacementKind(enum.StrEnum):
    WHOLE = "whole"
    SHARED = "shared"
    MIG = "mig"
    CPU = "cpu"


class GpuAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU (or a share or MIG instance of it) given to a job."""

    index: int
    uuid: str = ""
    milli: int = 1000
    mig_profile: str | None = None
    mig_start_slot: int | None = None


class Placement(Event, frozen=True, kw_only=True, tag="slice.placement.v1"):
    """A job was placed; it holds these resources from ``at`` until it ends or is preempted."""

    job_id: Name
    tenant: TenantId
    node: Name
    pool: Name = "default"
    gpu_model: str = ""
    kind: PlacementKind
    gpus: list[GpuAssignment] = msgspec.field(default_factory=list)
    cpu_milli: int = 0
    memory_mib: int = 0
    policy: str = ""
    #: The id of the job event this placement answers (the ledger's and tracing's link).
    cause_id: str = ""


class UnschedulableReason(enum.StrEnum):
    NO_CAPACITY = "no_capacity"
    NO_MATCHING_GPU = "no_matching_gpu"
    OVER_QUOTA = "over_quota"
    UNKNOWN_TENANT = "unknown_tenant"
    TENANT_PAUSED = "tenant_paused"
    INVALID_REQUEST = "invalid_request"


class Unschedulable(Event, frozen=True, kw_only=True, tag="slice.unschedulable.v1"):
    """A job cannot run now; it waits (or, for invalid requests, never will)."""

    job_id: Name
    tenant: TenantId
    reason: UnschedulableReason
    detail: str = ""
    cause_id: str = ""


class Preempted(Event, frozen=True, kw_only=True, tag="slice.preempted.v1"):
    """A running job was evicted to make room for higher-priority or lender work."""

    job_id: Name
    tenant: TenantId
    node: Name
    by_job_id: str = ""
    reason: str = ""


class MigInstanceChange(msgspec.Struct, frozen=True, kw_only=True):
    profile: str
    start_slot: int


class MigLayoutPlan(Event, frozen=True, kw_only=True, tag="slice.mig_plan.v1"):
    """Repartition a drained GPU: destroy these instances, then create those."""

    node: Name
    gpu_index: int
    destroy: list[MigInstanceChange] = msgspec.field(default_factory=list)
    create: list[MigInstanceChange] = msgspec.field(default_factory=list)
    reason: str = ""


SlicingEvent = Placement | Unschedulable | Preempted | MigLayoutPlan
