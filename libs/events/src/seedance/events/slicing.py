"""Slicer decisions: placements, releases, rejections, unschedulable reasons, preemptions, MIG
layout plans, and the shares it resizes on its own (automatic right-sizing) with their alerts.

These are trusted facts: only the slicer publishes them, each at the time the slicer decided it
(the server's receive time of the request that caused it, or a trusted observer's time), never
at a tenant's claimed ``at``. The cost-ledger bills from them and from collector samples alone.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from seedance.events.base import Event, UtcDatetime
from seedance.events.telemetry import MAX_NODE_DEVICES, GpuModelName, GpuUuid
from seedance.events.tokens import Name, TenantId

#: A MIG profile's name (``3g.40gb``, ``1g.10gb+me``, ``1c.3g.20gb``): well under this.
MigProfileName = Annotated[str, msgspec.Meta(max_length=32)]

__all__ = [
    "CapacityPlan",
    "EndOutcome",
    "GpuAssignment",
    "JobRejected",
    "JobReleased",
    "MigInstanceChange",
    "MigLayoutPlan",
    "Placement",
    "PlacementKind",
    "Preempted",
    "RejectionReason",
    "ShareAlert",
    "ShareChangeReason",
    "ShareChanged",
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
    uuid: GpuUuid = ""
    milli: int = 1000
    mig_profile: MigProfileName | None = None
    mig_start_slot: int | None = None


#: A placement's GPUs: no more than a node may describe (``telemetry.MAX_NODE_DEVICES``).
PlacedGpus = Annotated[list[GpuAssignment], msgspec.Meta(max_length=MAX_NODE_DEVICES)]


class Placement(Event, frozen=True, kw_only=True, tag="slice.placement.v1"):
    """A job was placed; it holds these resources from ``at`` until it ends or is preempted."""

    job_id: Name
    tenant: TenantId
    node: Name
    pool: Name = "default"
    #: Bounded as the inventories' models are (``telemetry.MAX_GPU_MODEL_LEN``): the ledger's
    #: cost entries copy it, and every output must stay under its size bound.
    gpu_model: GpuModelName = ""
    kind: PlacementKind
    gpus: PlacedGpus = msgspec.field(default_factory=list)
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
    #: No node type of the fleet (pools scaled to zero included) could hold the request even
    #: empty: the detail names what no node offers and the values the fleet has. The job stays
    #: queued and is placed if the fleet changes.
    UNSATISFIABLE = "unsatisfiable"


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
    #: Why, in words, where the reason needs more: a `consolidation` move says which node is
    #: being emptied and what the move is worth against the restarts it costs.
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""


class EndOutcome(enum.StrEnum):
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobReleased(Event, frozen=True, kw_only=True, tag="slice.released.v1"):
    """A job ended and the slicer released what it held, at ``at`` (the slicer's trusted time).

    The end of billing: the cost-ledger stops a job's charge here, never at a tenant's own
    ``job.finished`` (a back-dated one could otherwise reverse windows already billed).
    ``claimed_at`` is the time the ending event claimed, kept for the record only.
    """

    job_id: Name
    tenant: TenantId
    outcome: EndOutcome
    #: Whether the job held resources (False: it ended while it waited).
    was_placed: bool = True
    claimed_at: UtcDatetime | None = None
    cause_id: str = ""


class RejectionReason(enum.StrEnum):
    DUPLICATE_JOB = "duplicate_job"
    UNKNOWN_JOB = "unknown_job"
    JOB_ENDED = "job_ended"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TENANT = "unknown_tenant"
    #: The tenant already has as many jobs waiting as the slicer's bound allows (the detail
    #: names the bound and the count); nothing was queued.
    TOO_MANY_WAITING = "too_many_waiting"


class JobRejected(Event, frozen=True, kw_only=True, tag="job.rejected.v1"):
    """The slicer refused a tenant's job event; nothing it asked for happened.

    Published on the tenant's own ``rejected`` subject so the SDK and CLI can report it: a
    duplicate submit with a different request, a start or end of an unknown or already ended
    job, a request the slicer can never accept, a submit past the tenant's bound on waiting
    jobs (``too_many_waiting``).
    """

    job_id: Name
    tenant: TenantId
    reason: RejectionReason
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    #: The id of the rejected event and its type tag (``job.finished.v1``).
    cause_id: str = ""
    cause_type: str = ""


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


class ShareChangeReason(enum.StrEnum):
    #: Lowered to the share the job was measured to use (its tenant opted in).
    RIGHTSIZED = "rightsized"
    #: Put back: what the job used after the change deviated past the bound.
    ROLLED_BACK = "rolled_back"


class ShareChanged(Event, frozen=True, kw_only=True, tag="slice.share_changed.v1"):
    """The compute share a running shared job is enforced at changed, at ``at`` (the reading's
    time that decided it), from ``from_milli`` to ``to_milli`` thousandths of GPU ``gpu_index``
    of ``node`` (the MPS thread percentage is ``ceil(milli / 10)``), and with it the MPS pinned
    memory limit, ``mem_limit_mib`` (0: the placement's own, the request's GPU memory or none)."""

    job_id: Name
    tenant: TenantId
    node: Name
    gpu_index: int
    from_milli: int
    to_milli: int
    reason: ShareChangeReason
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    #: The id of the reading (``gpu.pod_share.v1``) that decided it.
    cause_id: str = ""
    #: The MPS pinned memory limit after the change, MiB: the measured peak plus headroom of a
    #: right-sizing; 0 (and every change from before the field): the placement's own.
    mem_limit_mib: Annotated[int, msgspec.Meta(ge=0)] = 0


class ShareAlert(Event, frozen=True, kw_only=True, tag="slice.share_alert.v1"):
    """An automatic right-sizing was rolled back: in a charge window after the change, one
    measured signal deviated by ``deviation_ppm``, past ``bound_ppm``: ``signal`` ``cost``,
    what the job was billed for (``max(share, measured use)``, the ledger's rule) over what was
    predicted (the new share); ``slo``, the fraction of the window the job was held at its new
    share over the fraction of its measured history at or above it (a throttled job). The
    share is back at ``restored_milli``; the job is not resized again while this placement
    lasts."""

    job_id: Name
    tenant: TenantId
    node: Name
    applied_milli: int
    restored_milli: int
    deviation_ppm: int
    bound_ppm: int
    #: Which signal deviated: ``cost``, ``slo`` or ``memory`` (the pod's memory in use grown
    #: into its lowered limit's headroom; ``deviation_ppm`` its growth over the measured peak);
    #: an alert from before the field: cost.
    signal: str = "cost"
    detail: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    cause_id: str = ""


class CapacityPlan(Event, frozen=True, kw_only=True, tag="slice.capacity_plan.v1"):
    """What one pool of GPUs (the nodes of one GPU model in a slicer's pool) needs, now and at
    a horizon, published by the slicer at each consolidation round (docs/slicer-fleet.md).

    ``nodes`` are the pool's nodes not removed, of which ``nodes_busy`` run something and
    ``nodes_draining`` take nothing new (cordoned, or held empty by consolidation for the
    fleet to release). ``gpus_in_use`` GPUs hold work, ``gpus_waiting`` are asked for by jobs
    queued for capacity that this pool could hold, ``headroom_gpus`` cover what arrives while
    a new node starts (``startup_s``, a high quantile of the forecast demand). ``nodes_needed``
    = ⌈(in use + waiting + headroom) / ``gpus_per_node``⌉; ``nodes_needed_at_horizon`` adds the
    forecast net growth over ``horizon_s``. ``releasable_nodes``: empty nodes beyond both the
    need and the busy nodes (what an autoscaler may remove now); ``nodes_short``: ready nodes
    missing for the need now. ``drained_nodes``: the nodes of this pool consolidation holds
    empty now, by name (sorted; a node leaves the list when its hold lapses or it is removed):
    the Kubernetes bridge cordons and taints these and lifts both once a node is not listed."""

    pool: Name
    gpu_model: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    nodes: int
    nodes_busy: int
    nodes_draining: int
    gpus_per_node: int
    gpus_in_use: int
    gpus_waiting: float
    headroom_gpus: float
    startup_s: float
    nodes_needed: int
    horizon_s: float
    nodes_needed_at_horizon: int
    releasable_nodes: int
    nodes_short: int
    #: A field added in v1 with a default: a plan without it names no held node.
    drained_nodes: Annotated[list[Name], msgspec.Meta(max_length=4096)] = msgspec.field(
        default_factory=list
    )


SlicingEvent = (
    Placement
    | Unschedulable
    | Preempted
    | MigLayoutPlan
    | JobReleased
    | JobRejected
    | ShareChanged
    | ShareAlert
    | CapacityPlan
)
