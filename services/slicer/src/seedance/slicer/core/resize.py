"""Right-sizing taking effect in the scheduler: a running shared job's share changed.

Owns what the scheduler does with a `ShareChange` (the slicer's own right-sizing loop decided
it, `seedance.slicer.core.autosize`, and published it as `slice.share_changed.v1`; the shell
reads it back like any input, so the change is applied once, in the scheduler's order, and
persisted with its state):

- **Lowered** (`rightsized`): the job holds the new share of its GPU from now on; the
  thousandths freed are the pool's again, and the queue's pass may place a waiting job there.
- **Raised** (`rolled_back`): the previous share is restored where its GPU still has room.
  Where the freed thousandths were given to another job meanwhile:
  * a job that said it is movable, and that the disruption budget lets move
    (`DisruptionBudget.may_move`: moves left of `moves_per_job`, run no longer than
    `max_lost_s`; the consolidation config's budget, the default one where none is set), is
    moved (a preemption with reason `consolidation`, the detail says why), queued again at its
    submit time and placed by the same pass at its request, which is the share it had before
    right-sizing; the move counts in the budget's record like consolidation's own;
  * any other job is never moved: it gets back what its GPU has free now (at least the share
    it holds) and keeps running there, and the scheduler says so (`ShareSet` `kept`, published
    as a `ShareChanged` from the share asked to the share held), so the node agent's limit and
    the ledger's bill follow what it holds. The rest is owed to it (persisted with the running
    job): `give_back`, at the head of every scheduling pass (a neighbour ended, a share was
    lowered, ...), gives it what its GPU has free, before any waiting job, up to the share
    asked (`ShareSet` `given_back`). A later change of its share, its end or a move settles
    the debt.
- **Stale** (the job ended, moved, or holds another share than the change's `from_milli`):
  nothing changes. The change was decided on a placement that no longer exists; its own new
  placement starts a new right-sizing track.

It must not decide whether a share should change (the autosize loop does), read a clock or do
I/O: `now_s` is the change's trusted time (the reading's, checked by the loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from seedance.slicer.core.consolidation import CONSOLIDATION, DisruptionBudget
from seedance.slicer.core.effects import Effect, Evicted, ShareSet
from seedance.slicer.core.inputs import job_key
from seedance.slicer.core.model import GPU_MILLI, NodeGpus
from seedance.slicer.core.workload import core_job

if TYPE_CHECKING:
    from seedance.slicer.core.scheduler import Scheduler

__all__ = ["ShareChange", "give_back", "resize_share"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShareChange:
    """The share of GPU `gpu` of `node` that (tenant, job) holds goes from `from_milli` to
    `to_milli` thousandths (`reason`: rightsized | rolled_back)."""

    tenant: str
    job_id: str
    node: str
    gpu: int
    from_milli: int
    to_milli: int
    reason: str
    #: When the change is billed from: its `ShareChanged`'s own `at`, the reading's time
    #: that decided it (the ledger bills the loop's event there, whenever the slicer reads
    #: it). None: the time it is applied at.
    billed_at_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("from_milli", "to_milli"):
            v = getattr(self, name)
            if not 0 < v < GPU_MILLI:
                raise ValueError(f"{name}={v} not in 1..{GPU_MILLI - 1} (a share of one GPU)")


def resize_share(s: Scheduler, c: ShareChange, now_s: float) -> list[Effect]:
    """Apply `c` to the scheduler `s` (module docstring); the effects it causes."""
    key = job_key(c.tenant, c.job_id)
    queue = s._queue
    run = queue.running_record(key)
    i = s._index.get(c.node)
    if run is None or i is None or run.placements != (NodeGpus(i, (c.gpu,)),):
        return []  # ended or moved since: the change was about a placement that is gone
    held = run.job.request.gpu_milli
    if held != c.from_milli or not run.job.request.is_shared or held == c.to_milli:
        return []
    if s._owed.pop(key, None) is not None:
        s._dirty_jobs.add(key)  # a new change of its share settles what was owed
    billed_s = _billed_from(s, key, c, now_s)  # the ledger bills it whatever is made of it
    # A masked GPU (unhealthy, drained) shows no free share: it takes nothing more. Room
    # freed after the change is billed from (an end dated later, a lowered share's 1 ms) was
    # not free then: only the rest counts (all of it unknown: none).
    free = int(queue.state.gpu_free[i, c.gpu])
    late = s.freed_after((c.node, c.gpu), billed_s)
    room = held + (0 if late is None else max(0, free - late))
    why_room = (
        f"GPU {c.gpu} of {c.node} had {room - held} milli free besides its {held} at "
        f"{billed_s:.3f} s, the time the change is billed from"
        + ("" if late is None or not late else f" ({late} more were freed only after it)")
        + (
            ""
            if late is not None
            else " (room freed since is not counted: its releases are not all known)"
        )
    )
    if c.to_milli <= room:
        queue.resize(key, c.to_milli)
        # Freed room (a lowered share) may start a waiting job now.
        return s._pass(now_s) if c.to_milli < held else []
    job = s._jobs[key]
    if job.movable and _budget(s).may_move(s._moves.history, key, run.started_s, now_s):
        s._queue.finish(key, now_s)
        s._queue.submit(core_job(job), s._submitted_s.get(key, now_s))
        s._dirty_jobs.add(key)
        s._moves.history.record(now_s, job.tenant, key)
        detail = (
            f"consolidation: its share was rolled back to {c.to_milli} milli, but {why_room}; "
            "the job is placed again at its request"
        )
        freed = ((c.node, c.gpu),)
        out: list[Effect] = [Evicted(job, c.node, "", CONSOLIDATION, detail=detail, gpus=freed)]
        out.extend(s._pass(now_s))
        return out
    if room > held:
        queue.resize(key, room)
    s._owed[key] = c.to_milli
    s._dirty_jobs.add(key)
    why = (
        "the disruption budget does not let it move again (moves per job, or progress a "
        "restart would lose)"
        if job.movable
        else "the job did not say it may move"
    )
    detail = (
        f"rolled back to {c.to_milli} milli, but {why_room}, and {why}: it holds {room}, and "
        "gets the rest as room frees there"
    )
    return [ShareSet(job, c.node, c.gpu, c.to_milli, room, "kept", detail)]


def _billed_from(s: Scheduler, key: str, c: ShareChange, now_s: float) -> float:
    """The change is billed from `now_s` (the ledger bills the loop's `ShareChanged` at its
    time, the time it is applied at here), or 1 ms after the job's latest decision (its
    placement or previous change) where that is later: the ledger starts a change no earlier
    (`Facts.resized`). It is billed whatever the scheduler makes of it (granted, kept at the
    room there is, or a move), so like a decision published about the job that time floors
    what is decided about the job later (`SchedulerState.job_floor_s`): the next change (a
    second change at one instant is billed 1 ms after the first: the room a lowering frees,
    the share a `ShareSet` answers), an eviction, an observer's report of an end before it.
    A lowered share's room is free from then only (`SchedulerState.freed_at`): a job placed
    in it at the change's instant was billed beside the share before the change."""
    billed_s = now_s if c.billed_at_s is None else c.billed_at_s
    latest_s = s._published_s.get(key)
    if latest_s is not None:
        billed_s = max(billed_s, (round(latest_s * 1000) + 1) / 1000)
    s._published_s[key] = billed_s
    s._dirty_jobs.add(key)
    if c.to_milli < c.from_milli:
        s.freed_at((c.node, c.gpu), billed_s, now_s, milli=c.from_milli - c.to_milli)
    return billed_s


def _budget(s: Scheduler) -> DisruptionBudget:
    """The budget a rollback's move keeps: consolidation's, where it is configured."""
    cfg = s.config.consolidation
    return cfg.budget if cfg is not None else DisruptionBudget()


def give_back(s: Scheduler) -> list[Effect]:
    """Give the jobs owed part of a rolled-back share what their GPUs have free now, up to
    what they are owed; a job that ended, moved or holds its due already owes nothing more."""
    out: list[Effect] = []
    queue = s._queue
    for key in sorted(s._owed):
        want = s._owed[key]
        run = queue.running_record(key)
        held = run.job.request.gpu_milli if run is not None else 0
        if run is None or len(run.placements) != 1 or held >= want:
            del s._owed[key]
            s._dirty_jobs.add(key)
            continue
        (p,) = run.placements
        n, g = p.node, p.gpus[0]
        new = min(want, held + int(queue.state.gpu_free[n, g]))
        if new <= held:
            continue
        queue.resize(key, new)
        if new == want:
            del s._owed[key]
        s._dirty_jobs.add(key)
        detail = f"room freed on its GPU: {new} of the {want} milli its rollback asked"
        out.append(ShareSet(s._jobs[key], s._nodes[n].name, g, held, new, "given_back", detail))
    return out
