"""The slicer's pure placement core: cluster model, fragmentation metric, policies, scheduler.

No NATS, no wall clock, no I/O: typed inputs to typed decisions. The bus adapter drives
`Scheduler` (submit / finish / schedule with event times) and publishes its `Decision`s.
"""

from seedance.slicer.core.fragmentation import (
    FragmentationIndex,
    TargetWorkload,
    TaskClass,
    cluster_fragmentation,
)
from seedance.slicer.core.model import ClusterState, Node, Placement, PodRequest, Rejection
from seedance.slicer.core.policies import (
    BestFit,
    FirstFit,
    FragmentationGradientDescent,
    Policy,
    SeedancePolicy,
)
from seedance.slicer.core.scheduler import (
    Decision,
    Job,
    JobPlaced,
    JobPreempted,
    JobUnschedulable,
    PendingRecord,
    RunningRecord,
    Scheduler,
    SchedulerConfig,
    SchedulerSnapshot,
)

__all__ = [
    "BestFit",
    "ClusterState",
    "Decision",
    "FirstFit",
    "FragmentationGradientDescent",
    "FragmentationIndex",
    "Job",
    "JobPlaced",
    "JobPreempted",
    "JobUnschedulable",
    "Node",
    "PendingRecord",
    "Placement",
    "PodRequest",
    "Policy",
    "Rejection",
    "RunningRecord",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerSnapshot",
    "SeedancePolicy",
    "TargetWorkload",
    "TaskClass",
    "cluster_fragmentation",
]
