"""A job id used again (same tenant, same job) after a run that held no GPU: that run's end is
the end of no allocation the ledger holds, so the new GPU run is billed to its own end. While
the ledger closed an allocation at its start on an end dated before it (``_end_before``, a
defence behind the slicer's per-job floor, withdrawn), the CPU run's end (its ``JobReleased``,
dated before the new placement) closed the GPU run at its start: billed nothing until its own
end arrived (windows closed meanwhile were zero), logged as a producer's defect.

The merged stream's order decides nothing: ``SEEDANCE_LEDGER_IN`` sources placements,
preemptions and releases as separate sources of ``SEEDANCE_SLICING``, so a release may be
stepped after a placement the slicer published after it, or before its own placement
(``test_the_merged_streams_order_changes_nothing``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.events import Event, new_event_id
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
)
from seedance.events.subjects import slicing

BOOK = core.default_price_book()
T0 = datetime(2026, 3, 2, tzinfo=UTC)
MIN = timedelta(minutes=1)
JOB = "acme/train"


def _placed(at: datetime, gpu: bool, node: str = "n") -> Placement:
    return Placement(
        id=new_event_id(), at=at, job_id="train", tenant="acme", node=node, gpu_model="T4",
        kind=PlacementKind.WHOLE if gpu else PlacementKind.CPU,
        gpus=[GpuAssignment(index=0)] if gpu else [],
    )  # fmt: skip


def _released(at: datetime) -> JobReleased:
    return JobReleased(
        id=new_event_id(), at=at, job_id="train", tenant="acme", outcome=EndOutcome.FINISHED
    )


def _preempted(at: datetime, node: str) -> Preempted:
    return Preempted(id=new_event_id(), at=at, job_id="train", tenant="acme", node=node)


def _subject(e: Event) -> str:
    kind = {Placement: "placement", JobReleased: "released", Preempted: "preempted"}[type(e)]
    return slicing.subject("acme", kind)


def _run(events: list[Event], restore_at: int | None) -> LedgerReplica:
    """Step ``events`` in stream order; at ``restore_at`` go on in a replica restored from the
    checkpoint (None: no restart)."""
    replica = LedgerReplica(BOOK)
    for seq, e in enumerate(events, start=1):
        if seq == restore_at:
            data = replica.to_bytes()
            replica = LedgerReplica(BOOK)
            replica.restore(data)
        replica.step(seq, e, subject=_subject(e))
    return replica


# The CPU run: placed at 0, released at 10 min; the GPU run of the same id: placed at 20 min,
# released at 50 min (30 minutes of one GPU).
REUSE = [
    _placed(T0, gpu=False),
    _released(T0 + 10 * MIN),
    _placed(T0 + 20 * MIN, gpu=True),
    _released(T0 + 50 * MIN),
]


@pytest.mark.parametrize("restore_at", [None, 2, 3, 4])
def test_a_gpu_run_after_a_cpu_run_of_the_same_id_bills_to_its_own_end(
    restore_at: int | None,
) -> None:
    replica = _run(REUSE, restore_at)
    f = replica.ledger.facts
    (gpu_run,) = f.job_allocs[JOB]
    assert f.alloc_end[gpu_run].event_id == REUSE[3].id
    assert f.alloc_end[gpu_run].end_ms == core.epoch_ms(T0 + 50 * MIN)
    as_of = core.epoch_ms(T0 + 3 * 60 * MIN)
    # Billed as the GPU run alone would be (a fresh id): about 30 minutes of one GPU (each
    # window's share rounded down to the micro-hour).
    alone = core.recompute(ledger_inputs(REUSE[2:], BOOK), BOOK, as_of).by_job[JOB]
    assert 499_990 <= alone.gpu_hours_micro <= 500_000
    assert core.recompute(ledger_inputs(REUSE, BOOK), BOOK, as_of).by_job[JOB] == alone
    # And while it runs (its own end not yet in), the windows closed bill it as they would a
    # fresh id's run: the CPU run's end does not close it.
    running = core.recompute(ledger_inputs(REUSE[:3], BOOK), BOOK, as_of).by_job.get(JOB)
    fresh = core.recompute(ledger_inputs(REUSE[2:3], BOOK), BOOK, as_of).by_job[JOB]
    assert fresh.gpu_hours_micro > alone.gpu_hours_micro
    assert running == fresh


def test_the_gpu_run_stays_open_until_its_own_end() -> None:
    replica = _run(REUSE[:3], restore_at=3)
    f = replica.ledger.facts
    (gpu_run,) = f.job_allocs[JOB]
    assert gpu_run not in f.alloc_end  # running: the CPU run's end is not its end
    assert JOB not in f.job_end


def test_each_part_end_of_a_cpu_gang_ends_nothing_billed() -> None:
    """A CPU-only gang evicted part by part (an end each), then the id placed on a GPU."""
    events: list[Event] = [
        _placed(T0, gpu=False, node="a"), _placed(T0, gpu=False, node="b"),
        _preempted(T0 + 10 * MIN, "a"), _preempted(T0 + 10 * MIN, "b"),
        _placed(T0 + 20 * MIN, gpu=True), _released(T0 + 50 * MIN),
    ]  # fmt: skip
    for restore_at in (None, 4, 5):
        f = _run(events[:5], restore_at).ledger.facts
        (gpu_run,) = f.job_allocs[JOB]
        assert gpu_run not in f.alloc_end  # running: no part's end is its end
        f = _run(events, restore_at).ledger.facts
        assert f.alloc_end[gpu_run].event_id == events[5].id


def test_the_merged_streams_order_changes_nothing() -> None:
    """Placements and releases reach the merged stream through separate sources: the GPU
    placement stepped before the CPU run's release, the GPU run's release before its own
    placement, the CPU run stepped last, each across a restart: the GPU run is billed to its
    own end in every order, and is open while that end is not in."""
    for order in ((0, 2, 1, 3), (0, 1, 3, 2), (2, 3, 0, 1), (3, 2, 1, 0)):
        for restore_at in (None, 3):
            f = _run([REUSE[i] for i in order if i != 3], restore_at).ledger.facts
            (gpu_run,) = f.job_allocs[JOB]
            assert gpu_run not in f.alloc_end, (order, restore_at)
            f = _run([REUSE[i] for i in order], restore_at).ledger.facts
            (gpu_run,) = f.job_allocs[JOB]
            assert f.alloc_end[gpu_run].event_id == REUSE[3].id, (order, restore_at)
            assert f.job_end[JOB].event_id == REUSE[3].id
