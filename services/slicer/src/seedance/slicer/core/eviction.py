"""Which running jobs a job of higher priority may evict on one node, and at what cost.

Owns the read-only searches behind the placement queue's preemption
(`seedance.slicer.core.queue.PlacementQueue`): for a single pod, the victims on one node (the
tenant's own lower-priority preemptible jobs, lowest priority and most recently started first)
whose eviction frees its request, and the GPU share they hold; for a gang, what it may evict on
a node in eviction order (`seedance.slicer.core.gang` plans the reclaim). It must not evict
anything: the queue releases the victims it picks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

import numpy as np

from seedance.slicer.core.jobs import Job, RunningRecord
from seedance.slicer.core.model import ClusterState, PodRequest

__all__ = ["cheapest_eviction", "eviction_on", "gang_victims", "own_lower_priority"]


def own_lower_priority(job: Job, victim: Job) -> bool:
    """Priority orders a tenant's own work: it evicts only that tenant's preemptible jobs."""
    return victim.preemptible and victim.tenant == job.tenant and victim.priority < job.priority


def cheapest_eviction(
    state: ClusterState,
    job: Job,
    allowed: np.ndarray | None,
    runs_on: Callable[[int], Iterable[RunningRecord]],
) -> tuple[int, list[str]] | None:
    """The node (among `allowed`) where evicting the fewest GPU shares frees `job`'s request,
    and the victims there (`eviction_on`); None if no node would."""
    best: tuple[int, int, list[str]] | None = None
    for n in range(len(state)):
        if allowed is not None and not allowed[n]:
            continue
        found = eviction_on(state, n, job, runs_on(n))
        if found is not None and (best is None or found[0] < best[0]):
            best = (found[0], n, found[1])
    return None if best is None else (best[1], best[2])


def eviction_on(
    state: ClusterState, n: int, job: Job, runs: Iterable[RunningRecord]
) -> tuple[int, list[str]] | None:
    """The victims among `runs` (the running jobs on node `n`) whose eviction frees `job`'s
    request there (lowest priority, most recently started first) and the GPU share they hold;
    None if none do."""
    victims = sorted(
        (
            r
            for r in runs
            if r.job.priority < job.priority
            and r.job.preemptible
            # Priority is a tenant's own ordering of its work: it never evicts another
            # tenant's job (the quota's cohort reclaim is the one cross-tenant rule).
            and r.job.tenant == job.tenant
        ),
        # The seq last: jobs started together are taken in arrival order, not in the
        # set's (hash-seeded, so per-process) order.
        key=lambda r: (r.job.priority, -r.started_s, r.seq),
    )
    if not victims:
        return None
    pod = job.request
    cpu, mem, gpu = state.cpu_free[n], state.mem_free[n], state.gpu_free[n].copy()
    taken: list[str] = []
    cost = 0
    for v in victims:
        if _fits_raw(state, pod, n, cpu, mem, gpu):
            break
        taken.append(v.job.job_id)
        for p in v.placements:
            if p.node == n:
                cpu += v.job.request.cpu_milli
                mem += v.job.request.memory_mib
                gpu[list(p.gpus)] += v.job.request.gpu_milli
        cost += v.job.request.gpu_milli_total * v.job.replicas
    return (cost, taken) if _fits_raw(state, pod, n, cpu, mem, gpu) else None


def gang_victims(
    job: Job,
    n: int,
    runs: Iterable[RunningRecord],
    masked: Collection[tuple[int, int]],
    may_evict: Callable[[Job, Job], bool],
) -> list[tuple[str, PodRequest, tuple[int, ...]]]:
    """What gang `job` may evict among `runs` (the running jobs on node `n`), one entry per
    member there, in eviction order (lowest priority, most recently started, then arrival):
    GPUs masked stay masked."""
    ordered = sorted(
        (r for r in runs if may_evict(job, r.job)),
        key=lambda r: (r.job.priority, -r.started_s, r.seq),
    )
    return [
        (r.job.job_id, r.job.request, tuple(g for g in p.gpus if (n, g) not in masked))
        for r in ordered
        for p in r.placements
        if p.node == n
    ]


def _fits_raw(
    state: ClusterState, pod: PodRequest, n: int, cpu: int, mem: int, gpu: np.ndarray
) -> bool:
    if cpu < pod.cpu_milli or mem < pod.memory_mib:
        return False
    if not state.model_allows(n, pod.gpu_models):
        return False
    return int((gpu >= pod.gpu_milli).sum()) >= pod.num_gpu
