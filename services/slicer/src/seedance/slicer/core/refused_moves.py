"""A consolidation move the cluster refused, undone (issue 30).

On Kubernetes a move's pod is evicted through the Eviction API, which a PodDisruptionBudget may
refuse, or an unavailable API server may never answer within the bridge's tries: the pod then
still runs on the node the move was to empty. The k8s-bridge reports that
(`seedance.events.jobs.JobMoveRefused`, once per move) and `undo_refused_move` makes the
slicer's state say what really runs where: the job back on the GPUs it held on its old node
(recorded when the move was made: `Moves.moved`), billed there from the refusal's trusted time on
(its placement on the new GPUs ends there: an eviction of reason `MOVE_REFUSED`, which the bridge
does nothing to, then its placement on the old GPUs), the new GPUs given back to the queue, and the
old node no longer held empty (a pod the fleet may not move keeps it). A refusal reported after the
node's hold ended is undone the same way (the move is remembered while the job runs): the pod still
runs there whatever the hold said. The job is not moved again: the move stays in the disruption
budget's record (`MoveHistory.per_job`). Where the old GPUs are no longer free, nothing is changed
and the outcome says so.

Owns the undo; must not decide moves (`seedance.slicer.core.draining`). No clock, no bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from seedance.slicer.core.effects import Effect, Evicted
from seedance.slicer.core.jobs import JobPlaced, RunningRecord
from seedance.slicer.core.model import NodeGpus

if TYPE_CHECKING:
    from seedance.slicer.core.scheduler import Scheduler

__all__ = ["MOVE_REFUSED", "UNDONE", "undo_refused_move"]

#: The eviction reason that ends the placement a refused move never took (the bridge's
#: ``notices.MOVE_REFUSED``: the wire value is the contract).
MOVE_REFUSED = "move_refused"

#: The outcome of an undo that put the job back; the others say why nothing was changed:
#: ``no_move`` (no move of this job off that node is remembered: unknown, or the node was
#: removed; a move is remembered past its node's hold while the job runs, see `Moves.moved`),
#: ``job_ended`` and ``old_gpus_taken``.
UNDONE = "undone"


def undo_refused_move(s: Scheduler, key: str, node: str, now_s: float) -> tuple[list[Effect], str]:
    """Undo the move of job `key` (``<tenant>/<job id>``) off `node`, refused at trusted time
    `now_s`: the effects and the outcome (`UNDONE` or why not)."""
    m = s._moves
    was = m.moved.get(key)
    if was is None or was[0] != node or s._nodes[s._index[node]].state == "removed":
        return [], "no_move"
    queue = s._queue
    if not (queue.is_running(key) or queue.is_pending(key)):
        del m.moved[key]
        return [], "job_ended"
    i = s._index[node]
    # The node keeps a pod that may not move: it is not held empty any longer (its GPUs
    # unmasked, which is also what shows whether the old ones are free).
    until = m.drained.pop(node, None)
    _hold(s, i)
    job = s._jobs[key]
    rec = queue.running_record(key)
    src = rec or queue.pending_record(key)
    assert src is not None  # running or pending, checked above
    back = NodeGpus(i, was[1])
    if not queue.state.fits(src.job.request, back):
        if until is not None:  # left as it was: the hold too
            m.drained[node] = until
            _hold(s, i)
        return [], "old_gpus_taken"
    del m.moved[key]
    out: list[Effect] = []
    if rec is not None:  # placed again elsewhere: that placement ends now
        (new,) = rec.placements
        name = s._nodes[new.node].name
        freed = tuple((name, g) for g in new.gpus)
        out.append(Evicted(job, name, "", MOVE_REFUSED, detail=_DETAIL, gpus=freed))
    queue.finish(key, now_s)
    queue.adopt(RunningRecord(src.job, (back,), was[2], src.submitted_s, src.seq))
    queue.resources_changed()
    out.extend(s._placed(job, JobPlaced(key, (back,), now_s, 0.0, src.job.request.gpu_milli)))
    out.extend(s._pass(now_s))
    return out, UNDONE


def _hold(s: Scheduler, i: int) -> None:
    """Node `i`'s hold changed: its cordon and masked GPUs follow."""
    s._cordon(i)
    s._queue.set_masked(s._masked(), s._cordoned)


_DETAIL = (
    "move_refused: the cluster did not carry out the consolidation move (a PodDisruptionBudget "
    "allowed no disruption, or the API server never answered the eviction); the job runs on "
    "where it was"
)
