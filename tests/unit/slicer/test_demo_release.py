"""The demo's consolidation line (`seedance.bench.demo_release`) on hand-made events: a node is
released from a move off it until the next placement on it or the end of billing; its idle
lines count pro rata inside; a second move while released is the same release; the moved run's
own lines from its placement to the move are its loss; other preemptions move nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from seedance.bench.demo_release import released
from seedance.events import new_event_id
from seedance.events.cost import CostEntry, CostKind
from seedance.events.slicing import Placement, PlacementKind, Preempted

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
MODEL = "NVIDIA A100-SXM4-80GB"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def placed(job: str, node: str, minute: float) -> Placement:
    return Placement(
        id=new_event_id(), at=at(minute), job_id=job, tenant="acme", node=node,
        gpu_model=MODEL, kind=PlacementKind.WHOLE,
    )  # fmt: skip


def moved(job: str, node: str, minute: float, reason: str = "consolidation") -> Preempted:
    return Preempted(
        id=new_event_id(), at=at(minute), job_id=job, tenant="acme", node=node, reason=reason
    )


def line(node: str, start: float, end: float, usd: float, *, job: str = "") -> CostEntry:
    """A cost line over [start, end) minutes: idle (no job) or the job's, at `usd` for it."""
    return CostEntry(
        id=new_event_id(), at=at(end), tenant="acme" if job else "", job_id=job,
        kind=CostKind.COMPUTE if job else CostKind.IDLE, node=node, gpu_model=MODEL,
        period_start=at(start), period_end=at(end), cost_micro_usd=round(usd * 1e6),
        gpu_hours_micro=round((end - start) / 60 * 8 * 1e6),
    )  # fmt: skip


def test_a_release_runs_from_the_move_to_the_next_placement_priced_by_its_idle_lines() -> None:
    slicing = [
        placed("a", "n1", 0),
        moved("a", "n1", 30),  # n1 released at 30 ...
        placed("a", "n2", 30),  # ... its job lands elsewhere at once
        moved("b", "n1", 40),  # a second move off n1 while released: the same release
        moved("c", "n3", 50, reason="priority"),  # not a consolidation: nothing released
        placed("d", "n1", 90),  # work comes back to n1 at 90
    ]
    entries = [
        line("n1", 0, 30, 3.0, job="a"),  # a's run on n1 before the move: lost
        line("n1", 30, 60, 6.0),  # idle, all inside the release
        line("n1", 60, 120, 12.0),  # idle, half inside (60-90)
        line("n3", 30, 60, 6.0),  # another node's idle: not released
        line("n2", 100, 120, 1.0),  # billing ends at 120
    ]
    r = released(slicing, entries)
    assert (r.moves, r.jobs_moved, r.nodes) == (2, 2, 1)
    assert r.intervals == (("n1", at(30).timestamp(), at(90).timestamp()),)
    assert r.node_hours == 1.0
    assert r.usd == 6.0 + 6.0
    assert r.idle_gpu_hours == 4.0 + 4.0  # 8 GPUs × (30 + 30) min
    assert (r.lost_usd, r.lost_gpu_hours) == (3.0, 4.0)
    assert "2 moves (2 of 5 movable jobs); 1 nodes released for 1.00 node-hours" in r.line(5)
    assert "net $9.00" in r.line(5)


def test_a_release_no_work_ends_runs_to_the_end_of_billing() -> None:
    slicing = [placed("a", "n1", 0), moved("a", "n1", 30), placed("a", "n2", 30)]
    entries = [line("n1", 30, 60, 6.0), line("n2", 0, 75, 1.0, job="a")]
    r = released(slicing, entries)
    assert r.intervals == (("n1", at(30).timestamp(), at(75).timestamp()),)
    assert r.node_hours == 0.75
    assert r.usd == 6.0


def test_no_move_no_release() -> None:
    r = released([placed("a", "n1", 0)], [line("n1", 0, 30, 1.0)])
    assert (r.moves, r.nodes, r.node_hours, r.usd, r.lost_usd) == (0, 0, 0.0, 0.0, 0.0)
