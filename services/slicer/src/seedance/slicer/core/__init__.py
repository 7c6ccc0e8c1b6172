"""The slicer's pure core: the scheduler and everything it decides with.

No NATS, no wall clock, no I/O: typed inputs to typed decisions. The service shell maps wire
events to `Scheduler` inputs (`seedance.slicer.mapping`), calls it with event times, and
publishes its `Effect`s; `Scheduler.snapshot` / `restore` persist its one state.

Modules: `scheduler` (the one scheduler: its inputs and decisions) over `state` (its state,
views and persistence), `queue` (the placement queue it owns: backfill, reservations, gangs,
priority preemption), `model` / `policies` / `fragmentation` / `signatures` (the cluster
arrays and where one request goes), `mig` / `mig_pool` (MIG geometry and the pool's
instances), `quota` (tenant quotas), `tenant_waiting` (the bound on a tenant's waiting jobs,
which held jobs a release re-checks), `inputs` / `effects` / `snapshot` (its values).
"""

from seedance.slicer.core.effects import (
    CapacityPlanned,
    Effect,
    Ended,
    Evicted,
    GpuShare,
    MigPlanned,
    Placed,
    Refused,
    RejectedInput,
    ShareSet,
    Waiting,
    published_reason,
)
from seedance.slicer.core.fragmentation import (
    FragmentationIndex,
    TargetWorkload,
    TaskClass,
    cluster_fragmentation,
)
from seedance.slicer.core.inputs import GpuSpec, JobSpec, NodeSpec, job_key
from seedance.slicer.core.mig import mig_model
from seedance.slicer.core.model import ClusterState, Node, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.policies import (
    BestFit,
    FirstFit,
    FragmentationGradientDescent,
    Policy,
    SeedancePolicy,
)
from seedance.slicer.core.quota import QuotaError, QuotaPolicy
from seedance.slicer.core.resize import ShareChange
from seedance.slicer.core.scheduler import Scheduler, SchedulerConfig
from seedance.slicer.core.snapshot import STATE_VERSION, SchedulerSnapshot

__all__ = [
    "STATE_VERSION",
    "BestFit",
    "CapacityPlanned",
    "ClusterState",
    "Effect",
    "Ended",
    "Evicted",
    "FirstFit",
    "FragmentationGradientDescent",
    "FragmentationIndex",
    "GpuShare",
    "GpuSpec",
    "JobSpec",
    "MigPlanned",
    "Node",
    "NodeGpus",
    "NodeSpec",
    "Placed",
    "PodRequest",
    "Policy",
    "QuotaError",
    "QuotaPolicy",
    "Refused",
    "RejectedInput",
    "Rejection",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerSnapshot",
    "SeedancePolicy",
    "ShareChange",
    "ShareSet",
    "TargetWorkload",
    "TaskClass",
    "Waiting",
    "cluster_fragmentation",
    "job_key",
    "mig_model",
    "published_reason",
]
