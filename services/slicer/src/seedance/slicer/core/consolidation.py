"""Consolidation: which running, movable jobs to move so whole nodes empty and can be released.

Owns the planner (`plan_consolidation`) and what bounds it: the disruption budget
(`DisruptionBudget`: moves per window, per job, per tenant) and the record of moves made
(`MoveHistory`). A move is a preemption with reason `consolidation` plus the job's
re-placement by the queue; this module only names the jobs and why.

Rules it keeps, whatever the caller asks:
  * a job that did not say it is movable is never moved (a node holding one is never drained);
  * a drain is all of a node's jobs or none: a half-emptied node frees nothing; a node that
    takes moved jobs in a round is not drained in it;
  * every job of a drained node must fit on the nodes that stay busy (checked by a trial
    placement on a copy of the free resources, tightest fit first), so no drain creates demand
    for a new node, and the free whole GPUs left must stay at or above `keep_free_gpus` (the
    capacity plan's headroom);
  * a drain is made only when the capacity it frees is worth more than the restarts cost it:
    freed GPU-seconds (the node's GPUs × how long it would otherwise stay up: its longest job's
    expected remaining time, at least `prior_remaining_s`, Lindy's rule past it) ≥
    `worth_ratio` × lost GPU-seconds (each job's GPUs × (progress lost + its restart time));
  * the budget holds: no more than `moves_per_window` moves in any `window_s`, per tenant
    `moves_per_tenant`, and no job moved more than `moves_per_job` times, nor one that has run
    longer than `max_lost_s` (its restart would lose more of its progress than that: the
    GPU-seconds rule alone would move a CPU-only job, or a sliver of a GPU, after hours).

It must not read a clock, touch the bus or change the cluster state: the caller passes `now_s`
and applies the moves.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from seedance.slicer.core.model import GPU_MILLI, ClusterState, PodRequest

__all__ = [
    "CONSOLIDATION",
    "DisruptionBudget",
    "Drain",
    "MovableJob",
    "MoveHistory",
    "light_nodes",
    "plan_consolidation",
    "trial_place",
]

#: The preemption reason of a move (beside `priority` and `quota_reclaim`).
CONSOLIDATION = "consolidation"


@dataclass(frozen=True, slots=True, kw_only=True)
class DisruptionBudget:
    """How much moving is allowed. A window's allowance scales with the running jobs
    (`window_fraction` of them, at least `min_per_window`), so the bound does not need
    re-tuning per fleet size; `moves_per_tenant` caps one tenant's share of a window."""

    window_s: float = 600.0
    window_fraction: float = 0.01
    min_per_window: int = 1
    moves_per_tenant: int | None = None
    moves_per_job: int = 1
    #: A job that has run longer than this is not moved (None: no bound). A move restarts it:
    #: this bounds the delay a move adds to its end, whatever GPUs it holds.
    max_lost_s: float | None = 3600.0

    def per_window(self, running_jobs: int) -> int:
        return max(self.min_per_window, int(self.window_fraction * running_jobs))

    def may_move(self, history: MoveHistory, job_id: str, started_s: float, now_s: float) -> bool:
        """Whether the job started at `started_s` may move at `now_s` (it said it is movable):
        it has moves left (`moves_per_job`) and would lose at most `max_lost_s` of progress."""
        if history.per_job[job_id] >= self.moves_per_job:
            return False
        return self.max_lost_s is None or now_s - started_s <= self.max_lost_s


@dataclass(slots=True)
class MoveHistory:
    """Moves made: (time, tenant) in the current window and a count per job. Part of the
    caller's state; `record` after a move is applied."""

    recent: deque[tuple[float, str]] = field(default_factory=deque)
    per_job: Counter[str] = field(default_factory=Counter)

    def record(self, now_s: float, tenant: str, job_id: str) -> None:
        self.recent.append((now_s, tenant))
        self.per_job[job_id] += 1

    def forget(self, job_id: str) -> None:
        """A job ended: its count is no longer needed."""
        self.per_job.pop(job_id, None)

    def in_window(self, now_s: float, window_s: float) -> Counter[str]:
        while self.recent and self.recent[0][0] <= now_s - window_s:
            self.recent.popleft()
        return Counter(t for _, t in self.recent)


@dataclass(frozen=True, slots=True, kw_only=True)
class MovableJob:
    """A running job as the planner sees it (one node; gangs are not moved)."""

    job_id: str
    tenant: str
    node: int
    request: PodRequest
    started_s: float
    movable: bool
    #: What a restart costs the job beyond its lost progress (the request's restart-cost hint).
    restart_s: float = 180.0
    #: The submitter's expected run time, where it gave one.
    expected_duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class Drain:
    """Empty `node`: move each of `jobs` (reason `consolidation`), then release it."""

    node: int
    jobs: tuple[MovableJob, ...]
    freed_gpu_s: float
    lost_gpu_s: float


def plan_consolidation(
    state: ClusterState,
    jobs_on: Mapping[int, Sequence[MovableJob]],
    now_s: float,
    budget: DisruptionBudget,
    history: MoveHistory,
    *,
    busy: np.ndarray | None = None,
    running_jobs: int | None = None,
    keep_free_gpus: float = 0.0,
    max_used_fraction: float = 0.5,
    worth_ratio: float = 2.0,
    prior_remaining_s: float = 1800.0,
) -> list[Drain]:
    """The drains worth making now, least-used node first. `jobs_on` maps each node that may be
    drained to its running jobs; only the jobs of nodes light enough to drain are read from it
    (a mapping may build them on demand: a round then costs the light nodes' jobs, not every
    running job's). Where it holds only some of the busy nodes (the candidates), `busy` (a bool
    per node: something runs there) and `running_jobs` say what the whole pool holds; by
    default they are taken from `jobs_on`."""
    running = sum(len(v) for v in jobs_on.values()) if running_jobs is None else running_jobs
    used_window = history.in_window(now_s, budget.window_s)
    left = budget.per_window(running) - sum(used_window.values())
    if left <= 0:
        return []
    cpu, mem, gpu = state.cpu_free.copy(), state.mem_free.copy(), state.gpu_free.copy()
    busy = _busy(state, jobs_on) if busy is None else busy
    out: list[Drain] = []
    drained = np.zeros(len(state), dtype=bool)
    receiving = np.zeros(len(state), dtype=bool)
    per_tenant = Counter(used_window)
    for n in _light_first(state, jobs_on, max_used_fraction):
        jobs = jobs_on[n]
        if receiving[n] or not jobs or len(jobs) > left:
            continue
        if not _allowed(jobs, budget, history, per_tenant, now_s):
            continue
        freed, lost = _worth(jobs, int(state.gpu_count[n]), now_s, prior_remaining_s)
        if freed < worth_ratio * lost:
            continue
        # The node's own free whole GPUs go with it; the moved jobs take some elsewhere.
        target = busy & ~drained
        target[n] = False
        trial = trial_place(state, jobs, target, cpu, mem, gpu)
        if trial is None:
            continue
        cpu2, mem2, gpu2 = trial
        after = float((gpu2[target] == GPU_MILLI).sum()) + float(
            (gpu2[~busy & ~drained] == GPU_MILLI).sum()
        )
        if after < keep_free_gpus:
            continue
        # A node that takes moved jobs is not drained later in the round: its jobs as listed
        # would no longer be all it holds.
        receiving |= (gpu2 != gpu).any(axis=1) | (cpu2 != cpu) | (mem2 != mem)
        cpu, mem, gpu = cpu2, mem2, gpu2
        drained[n] = True
        left -= len(jobs)
        for j in jobs:
            per_tenant[j.tenant] += 1
        out.append(Drain(n, tuple(jobs), freed, lost))
        if left <= 0:
            break
    return out


def _busy(state: ClusterState, jobs_on: Mapping[int, Sequence[MovableJob]]) -> np.ndarray:
    busy = np.zeros(len(state), dtype=bool)
    busy[[n for n, js in jobs_on.items() if js]] = True
    return busy


def _light_first(state: ClusterState, nodes: Iterable[int], max_used_fraction: float) -> list[int]:
    """Of `nodes`, those with GPUs and at most `max_used_fraction` of their share in use, least
    used first (then the lower node); the fleet's shares summed once, not per node."""
    held = state.gpu_cap.sum(axis=1)
    used = (held - state.gpu_free.sum(axis=1)).tolist()
    cap = held.tolist()
    light = (n for n in nodes if cap[n] > 0 and used[n] <= max_used_fraction * cap[n])
    return sorted(light, key=lambda n: (used[n], n))


def light_nodes(state: ClusterState, max_used_fraction: float) -> np.ndarray:
    """`_light` of every node at once (a bool per node): the only nodes the planner may drain,
    so a caller lists the candidates of these alone."""
    cap: np.ndarray = state.gpu_cap.sum(axis=1, dtype=np.int64)
    used: np.ndarray = cap - state.gpu_free.sum(axis=1, dtype=np.int64)
    light: np.ndarray = (cap > 0) & (used <= max_used_fraction * cap)
    return light


def _allowed(
    jobs: Sequence[MovableJob],
    budget: DisruptionBudget,
    history: MoveHistory,
    per_tenant: Counter[str],
    now_s: float,
) -> bool:
    """Whether every job may move: it said it is movable, it has moves left, it would lose at
    most `max_lost_s` of progress, and its tenant has room in the window."""
    if not all(j.movable and budget.may_move(history, j.job_id, j.started_s, now_s) for j in jobs):
        return False
    if budget.moves_per_tenant is None:
        return True
    want = Counter(j.tenant for j in jobs)
    return all(per_tenant[t] + k <= budget.moves_per_tenant for t, k in want.items())


def _worth(
    jobs: Sequence[MovableJob], node_gpus: int, now_s: float, prior_remaining_s: float
) -> tuple[float, float]:
    """(GPU-seconds freed by releasing the node, GPU-seconds the restarts lose)."""
    remaining = 0.0
    lost = 0.0
    for j in jobs:
        ran = max(0.0, now_s - j.started_s)
        if j.expected_duration_s is not None:
            left = max(j.expected_duration_s - ran, 0.0)
        else:
            left = max(ran, prior_remaining_s)  # Lindy: a job that ran long runs on
        remaining = max(remaining, left)
        lost += j.request.gpu_milli_total / GPU_MILLI * (ran + j.restart_s)
    return node_gpus * remaining, lost


def trial_place(
    state: ClusterState,
    jobs: Sequence[MovableJob],
    target: np.ndarray,
    cpu: np.ndarray,
    mem: np.ndarray,
    gpu: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Place `jobs` (largest first) on `target` nodes of copies of the free resources, the
    tightest node first; the copies after, or None when one does not fit."""
    cpu, mem, gpu = cpu.copy(), mem.copy(), gpu.copy()
    for j in sorted(jobs, key=lambda j: -j.request.gpu_milli_total):
        p = j.request
        ok = target & (cpu >= p.cpu_milli) & (mem >= p.memory_mib)
        if p.num_gpu:
            ok &= (gpu >= p.gpu_milli).sum(axis=1) >= p.num_gpu
            if p.gpu_models:
                ok &= state.model_mask(p.gpu_models)
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return None
        n = int(rows[np.argmin(gpu[rows].sum(axis=1))])
        cpu[n] -= p.cpu_milli
        mem[n] -= p.memory_mib
        if p.num_gpu:
            free = gpu[n]
            fits = np.flatnonzero(free >= p.gpu_milli)
            # Shared requests take the tightest GPU; whole ones the first free ones.
            picks = fits[np.argsort(free[fits], kind="stable")][: p.num_gpu]
            free[picks] -= p.gpu_milli
    return cpu, mem, gpu
