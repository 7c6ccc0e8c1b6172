"""Consolidation in the running slicer: a round of the planner over the scheduler's own state.

Owns when a round runs (at most once per `ConsolidationConfig.interval_s` of trusted time, as
the shell calls `Scheduler.consolidate` after a batch), what it reads (the running jobs of the
ready nodes: a gang member, a MIG instance's job and a job on a cordoned or drained node is
never a candidate), and how its drains are applied: the node is held empty (its GPUs masked
like a cordoned node's) for `hold_s`, each job on it is evicted with reason `consolidation` and
an explanation, queued again at its original submit time and placed again by the queue's own
pass. A drained node that the fleet did not remove in `hold_s` takes work again; where each
moved job ran is remembered past the hold, while the job runs, for a refusal reported late
(`Moves.moved`). Its state (`Moves`) is part of the scheduler's and persisted with it
(`MovesRecord`).

It must not decide which jobs move or whether a move is worth it: that is the planner's
(`seedance.slicer.core.consolidation`), which keeps the rules (only jobs that said they are
movable; all of a node or none; the disruption budget; worth more than it costs). No clock,
no bus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from seedance.slicer.core.capacity_plan import Forecasts, PlanConfig, plan_pools
from seedance.slicer.core.consolidation import (
    CONSOLIDATION,
    DisruptionBudget,
    MovableJob,
    MoveHistory,
    light_nodes,
    plan_consolidation,
)
from seedance.slicer.core.effects import CapacityPlanned, Effect, Evicted
from seedance.slicer.core.snapshot import MovesRecord
from seedance.slicer.core.workload import core_job

if TYPE_CHECKING:
    from seedance.slicer.core.scheduler import Scheduler

__all__ = ["ConsolidationConfig", "Moves", "consolidation_round", "round_due"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsolidationConfig:
    """When rounds run and what bounds them (the planner's knobs, `plan_consolidation`)."""

    #: Seconds of trusted time between rounds: a round costs a pass over the busy nodes.
    interval_s: float = 60.0
    budget: DisruptionBudget = field(default_factory=DisruptionBudget)
    #: How long a drained node is held empty for the fleet to release it: about a node's
    #: start-up time, so a node not released is not idle longer than a new one takes to come.
    #: At least `seedance.events.jobs.MOVE_REFUSED_WITHIN_S` in a deployment (the slicer warns
    #: at start-up, `config.short_hold`): a refusal reported in time finds the old GPUs free.
    hold_s: float = 600.0
    #: A restart's cost where the job gave no hint (`JobSubmitted.restart_s`).
    restart_s: float = 180.0
    worth_ratio: float = 2.0
    max_used_fraction: float = 0.5
    prior_remaining_s: float = 1800.0
    #: Whole GPUs to keep free on the busy nodes after the moves (headroom).
    keep_free_gpus: float = 0.0
    #: The capacity plan published at each round (`core.capacity_plan`).
    plan: PlanConfig = field(default_factory=PlanConfig)

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.hold_s > 0:
            raise ValueError(
                f"consolidation interval_s={self.interval_s} and hold_s={self.hold_s} must be > 0"
            )


@dataclass(slots=True)
class Moves:
    """Consolidation's live state: the last round's time, the moves made (the budget's
    record), the nodes held empty (name: until when) and the capacity plan's forecasts."""

    last_round_s: float | None = None
    history: MoveHistory = field(default_factory=MoveHistory)
    drained: dict[str, float] = field(default_factory=dict)
    #: Where each job moved off a held node ran (node, GPUs, start): a refused move is undone
    #: there (`seedance.slicer.core.refused_moves`). Kept past the node's hold, while the job
    #: still runs or waits: a refusal can be reported after the hold (the bridge's tries, a
    #: bridge down meanwhile; `seedance.events.jobs.MOVE_REFUSED_WITHIN_S`), and the pod then
    #: still runs there. Forgotten at the first round after the job ends or the node is removed.
    moved: dict[str, tuple[str, tuple[int, ...], float]] = field(default_factory=dict)
    forecasts: Forecasts = field(default_factory=Forecasts)

    def record(self) -> MovesRecord:
        return MovesRecord(
            last_round_s=self.last_round_s,
            recent=tuple(self.history.recent),
            per_job=tuple(sorted(self.history.per_job.items())),
            drained=tuple(sorted(self.drained.items())),
            moved=tuple((k, *v) for k, v in sorted(self.moved.items())),
            forecasts=self.forecasts.saved(),
        )

    @classmethod
    def of(cls, rec: MovesRecord) -> Moves:
        m = cls(
            last_round_s=rec.last_round_s,
            drained=dict(rec.drained),
            moved={k: (node, gpus, started) for k, node, gpus, started in rec.moved},
            forecasts=Forecasts.of(rec.forecasts),
        )
        m.history.recent.extend((t, tenant) for t, tenant in rec.recent)
        m.history.per_job.update(dict(rec.per_job))
        return m


def consolidation_round(s: Scheduler, cfg: ConsolidationConfig, now_s: float) -> list[Effect]:
    """One round at trusted time `now_s`, if one is due: lapsed holds end, then the planner's
    drains are applied. The effects: each move's eviction, then what the queue's pass decides
    (the moved jobs' new placements among them), then each pool's capacity plan."""
    m = s._moves
    if not _due(m, cfg, now_s):
        return []
    m.last_round_s = now_s
    lapsed = [name for name, until in m.drained.items() if now_s >= until]
    for name in lapsed:
        del m.drained[name]
        s._cordon(s._index[name])
    for key in [k for k, (node, _, _) in m.moved.items() if _settled(s, k, node)]:
        del m.moved[key]
    ready_busy = _ready_busy(s)
    drains = plan_consolidation(
        s._queue.state,
        _candidates(s, cfg, ready_busy),
        now_s,
        cfg.budget,
        m.history,
        busy=_busy(s, ready_busy),
        running_jobs=len(s._queue.running_ids),
        keep_free_gpus=cfg.keep_free_gpus,
        max_used_fraction=cfg.max_used_fraction,
        worth_ratio=cfg.worth_ratio,
        prior_remaining_s=cfg.prior_remaining_s,
    )
    out: list[Effect] = []
    for d in drains:
        name = s._nodes[d.node].name
        m.drained[name] = now_s + cfg.hold_s
        s._cordon(d.node)
        detail = (
            f"consolidation: node {name} is being emptied so the fleet can release it "
            f"({d.freed_gpu_s / 3600:.1f} GPU-hours freed against {d.lost_gpu_s / 3600:.1f} "
            f"lost to {len(d.jobs)} restart(s)); the job is placed again"
        )
        for j in d.jobs:
            job = s._jobs[j.job_id]
            (was,) = s._queue.placements_of(j.job_id)  # one node: gangs are never moved
            m.moved[j.job_id] = (name, was.gpus, j.started_s)
            s._queue.finish(j.job_id, now_s)
            s._queue.submit(core_job(job), s._submitted_s.get(j.job_id, now_s))
            s._dirty_jobs.add(j.job_id)
            m.history.record(now_s, job.tenant, j.job_id)
            freed = tuple((name, g) for g in was.gpus)
            out.append(Evicted(job, name, "", CONSOLIDATION, detail=detail, gpus=freed))
    if lapsed or drains:
        s._queue.set_masked(s._masked(), s._cordoned)
        s._queue.resources_changed()
        out.extend(s._pass(now_s))
    # The plan after the round's moves and placements: what the fleet needs now.
    s.capacity_plans = plan_pools(s, cfg.plan, now_s)
    out.extend(CapacityPlanned(p) for p in s.capacity_plans)
    return out


def _settled(s: Scheduler, key: str, node: str) -> bool:
    """Whether no refusal of job `key`'s move off `node` can be undone any more: the job ended,
    or the node left the fleet (what runs there ended with it). Not the hold's end: a refusal
    reported after it still says where the pod runs."""
    queue = s._queue
    if not (queue.is_running(key) or queue.is_pending(key)):
        return True
    return s._nodes[s._index[node]].state == "removed"


def round_due(s: Scheduler, now_s: float) -> bool:
    """Whether `Scheduler.consolidate(now_s)` would run a round: consolidation is configured,
    the pool has nodes and `interval_s` has passed since the last round. (The shell's quiet
    rounds ask first, so a quiet fleet's poll writes nothing when none is due.)"""
    cfg = s.config.consolidation
    return cfg is not None and bool(s._nodes) and _due(s._moves, cfg, now_s)


def _due(m: Moves, cfg: ConsolidationConfig, now_s: float) -> bool:
    return m.last_round_s is None or now_s - m.last_round_s >= cfg.interval_s


def _candidates(
    s: Scheduler, cfg: ConsolidationConfig, ready_busy: list[int]
) -> dict[int, list[MovableJob]]:
    """The running jobs of each node of `ready_busy` (ready, busy) the planner could drain:
    one at most `max_used_fraction` used (`light_nodes`) whose every running job may move. A
    node holding a job that cannot be moved here (not movable, a gang's) is left out, as the
    planner would skip it: a round's cost follows the nodes that could be drained, not every
    running job (44,634 MovableJobs and a sort of 16,249 nodes took 0.3-0.7 s of the slicer's
    loop at the x4 fleet, none of them drainable)."""
    light = light_nodes(s._queue.state, cfg.max_used_fraction)
    out = {i: jobs for i in ready_busy if light[i] and (jobs := _movable_jobs(s, cfg, i))}
    # A MIG instance's job is not the queue's to move: its node is never drained.
    for m in s._mig.held_slots():
        out.pop(s._index[m.node], None)
    return out


def _movable_jobs(s: Scheduler, cfg: ConsolidationConfig, node: int) -> list[MovableJob]:
    """The running jobs on `node` as the planner sees them, or none where one of them cannot
    be moved here (it did not say it is movable, or it is a gang's)."""
    queue = s._queue
    jobs: list[MovableJob] = []
    for key in queue.jobs_on(node):
        rec = queue.running_record(key)
        job = s._jobs[key]
        if rec is None:
            continue
        if not (job.movable and rec.job.replicas == 1):
            return []
        jobs.append(
            MovableJob(
                job_id=key,
                tenant=job.tenant,
                node=node,
                request=rec.job.request,
                started_s=rec.started_s,
                movable=True,
                restart_s=cfg.restart_s if job.restart_s is None else job.restart_s,
                expected_duration_s=job.expected_duration_s,
            )
        )
    return jobs


def _ready_busy(s: Scheduler) -> list[int]:
    """The nodes, not cordoned or drained, that run something in the queue (a pass over the
    node rows, once a round)."""
    return [i for i in range(len(s._nodes)) if i not in s._cordoned and s._queue.busy(i)]


def _busy(s: Scheduler, ready_busy: list[int]) -> np.ndarray:
    """A bool per node: ready and running something (where moved jobs may go)."""
    busy = np.zeros(len(s._queue.state), dtype=bool)
    busy[ready_busy] = True
    return busy
