"""The target workload the slicer's policy keeps placeable, learned from submitted requests.

Owns the request shapes of the last `size` jobs submitted, the shapes the current policy was
built from (part of the state, so a restored scheduler has the very same policy), and the
construction of that policy (`SeedancePolicy` on the shapes, or first-fit). The policy is
refreshed every `refresh_every` submissions, and by the scheduler whenever the node set
changes; and the scheduler's configuration of both (`SchedulerConfig`). It must not place
anything; no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from seedance.slicer.core.capacity import LeaveEmpty
from seedance.slicer.core.fragmentation import TargetWorkload
from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.model import MAX_TOPOLOGY_LEVELS, PodRequest
from seedance.slicer.core.policies import FirstFit, Policy, SeedancePolicy
from seedance.slicer.core.queue import Job, QueueConfig
from seedance.slicer.core.satisfiable import NodePool
from seedance.slicer.core.snapshot import RequestShape

if TYPE_CHECKING:  # draining places jobs with `core_job` below
    from seedance.slicer.core.draining import ConsolidationConfig

__all__ = ["SchedulerConfig", "WorkloadWindow", "core_job", "pod_request", "shape_of"]

#: The target workload before any job was submitted: one whole GPU.
_DEFAULT_SHAPE = RequestShape(0, 0, 1, 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerConfig:
    #: "seedance" (SeedancePolicy with backfill, reservations and preemption) or "first-fit"
    #: (first-fit, strict FIFO with head-of-line blocking: the foundation's behaviour).
    policy: str = "seedance"
    workload_window: int = 500
    workload_refresh: int = 100
    queue: QueueConfig = field(default_factory=QueueConfig)
    #: Node label keys naming topology domains, innermost first (say, a multi-node NVLink
    #: clique, a rack, a block): a gang goes to the tightest domain that holds it whole.
    topology_levels: tuple[str, ...] = ()
    #: Node types of pools that may have no node now (scaled to zero): a request one of them
    #: could hold is not `unsatisfiable` (`seedance.slicer.core.satisfiable`).
    node_pools: tuple[NodePool, ...] = ()
    #: Consolidation rounds (`Scheduler.consolidate`); None: the slicer never moves work.
    consolidation: ConsolidationConfig | None = None
    #: The placement term that leaves nodes empty (`LeaveEmpty` around `SeedancePolicy`: the
    #: fullest nodes in use that fit first, so the least used empty as their work ends and
    #: the fleet can release them). False: `SeedancePolicy` alone. Not for first-fit. The
    #: service's default is its setting's (`SEEDANCE_SLICER_LEAVE_EMPTY`).
    leave_empty: bool = False
    #: At most this many jobs of one tenant wait (queued or held); a submit past it is refused
    #: `too_many_waiting` (`seedance.slicer.core.tenant_waiting`). 0: no bound. The service's
    #: default is its setting's (`SEEDANCE_SLICER_MAX_WAITING_PER_TENANT`).
    max_waiting_per_tenant: int = 1000

    def __post_init__(self) -> None:
        if self.policy not in ("seedance", "first-fit"):
            raise ValueError(f"policy must be seedance or first-fit, got {self.policy!r}")
        if len(self.topology_levels) > MAX_TOPOLOGY_LEVELS:
            raise ValueError(
                f"topology_levels={self.topology_levels!r}: at most {MAX_TOPOLOGY_LEVELS} levels"
            )

    @property
    def queue_config(self) -> QueueConfig:
        if self.policy == "first-fit":
            return QueueConfig(backfill=False, preemption=self.queue.preemption)
        return self.queue


class WorkloadWindow:
    def __init__(
        self,
        *,
        size: int,
        refresh_every: int,
        leave_empty: bool = False,
        window: Iterable[RequestShape] = (),
        policy_shapes: Iterable[RequestShape] = (),
        since_refresh: int = 0,
    ) -> None:
        self._size = size
        self._refresh_every = refresh_every
        self._leave_empty = leave_empty
        self.window: list[RequestShape] = list(window)
        self.policy_shapes: list[RequestShape] = list(policy_shapes)
        self.since_refresh = since_refresh
        #: Shapes ever added (the window holds the last `size`): the ordinal of the next one.
        self.learned = len(self.window)
        # Whether `policy_shapes` is the window as it is now (a refresh would change nothing):
        # unknown for a window handed in, so its first refresh says "changed".
        self._shapes_current = False

    def learn(self, job: JobSpec) -> bool:
        """Add a request to the window; whether the policy's shapes were refreshed."""
        self.window.append(shape_of(job))
        del self.window[: -self._size]
        self.learned += 1
        self._shapes_current = False
        self.since_refresh += 1
        if self.since_refresh >= self._refresh_every or not self.policy_shapes:
            self.refresh()
            return True
        return False

    def refresh(self) -> bool:
        """The policy's shapes become the window's; whether they changed (when not, the
        policy built from them still stands: a fleet's thousands of nodes joining build it
        once, not once per node)."""
        self.since_refresh = 0
        changed = not self._shapes_current
        if changed:
            self.policy_shapes = list(self.window)
            self._shapes_current = True
        return changed

    def policy(self, name: str) -> Policy:
        """The policy called `name` ("seedance" or "first-fit") for the current shapes;
        "seedance" behind `LeaveEmpty` when the window was made with `leave_empty`."""
        if name == "first-fit":
            return FirstFit()
        inner = self._seedance()
        return LeaveEmpty(inner) if self._leave_empty else inner

    def _seedance(self) -> SeedancePolicy:
        # Each distinct shape once, with how often the window holds it (in first-seen order,
        # as the pods would be counted): a refresh costs the shapes, not the window's length.
        counts = Counter(self.policy_shapes or [_DEFAULT_SHAPE])
        pods = [(pod_request(s), c) for s, c in counts.items()]
        if not any(p.num_gpu for p, _ in pods):
            pods.append((pod_request(_DEFAULT_SHAPE), 1))
        gpu = sum(p.gpu_milli_total * c for p, c in pods)
        return SeedancePolicy(
            TargetWorkload.from_counts(pods, coverage=1.0),
            # A workload that asks no CPU (or memory) strands nothing through it.
            cpu_per_gpu_milli=max(sum(p.cpu_milli * c for p, c in pods) / gpu, 1e-9),
            mem_mib_per_gpu_milli=max(sum(p.memory_mib * c for p, c in pods) / gpu, 1e-9),
        )


def shape_of(job: JobSpec) -> RequestShape:
    return RequestShape(
        job.cpu_milli,
        job.memory_mib,
        job.gpus,
        job.gpu_milli if job.gpus else 0,
        tuple(sorted(job.gpu_models)),
    )


def pod_request(s: RequestShape) -> PodRequest:
    return PodRequest(
        cpu_milli=s.cpu_milli,
        memory_mib=s.memory_mib,
        num_gpu=s.num_gpu,
        gpu_milli=s.gpu_milli,
        gpu_models=frozenset(s.gpu_models),
    )


def core_job(job: JobSpec) -> Job:
    """The placement queue's job for `job` (keyed by tenant and job id)."""
    return Job(
        job_id=job.key,
        request=pod_request(shape_of(job)),
        replicas=job.gang_size,
        priority=job.priority,
        tenant=job.tenant,
        expected_duration_s=job.expected_duration_s,
        movable=job.movable,
        restart_s=job.restart_s,
    )
