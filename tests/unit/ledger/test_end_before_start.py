"""An end dated before the start of the allocation it ends (a producer's defect: the slicer once
released a job at a trusted observer's time, before the placement it ended) closes that
allocation at its start, a zero-length span, rather than leaving it open and billed for ever;
an allocation placed again after an earlier run's end is never closed by that end.

On the facts before the change, each test left the last allocation open (no end after its
start), billed for ever."""

from __future__ import annotations

import pytest

from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded


def alloc(eid: str, start_ms: int, node: str = "n1", job: str = "globex/y") -> GpuAllocation:
    return GpuAllocation(
        event_id=eid, job_id=job, tenant=job.split("/")[0], node=node, gpu_model="T4",
        gpu_indices=(0,), start_ms=start_ms,
    )  # fmt: skip


def end(eid: str, end_ms: int, job: str = "globex/y") -> JobEnded:
    return JobEnded(event_id=eid, job_id=job, end_ms=end_ms)


@pytest.mark.parametrize("end_first", [False, True])
def test_an_end_dated_before_the_start_closes_the_allocation_at_its_start(
    end_first: bool,
) -> None:
    f = Facts()
    facts = [alloc("p", 100_000), end("e", 50_000)]
    for x in reversed(facts) if end_first else facts:
        if isinstance(x, GpuAllocation):
            f.add_allocation(x)
        else:
            f.add_end(x)
    assert f.alloc_end["p"].event_id == "e"
    assert f.alloc_end["p"].end_ms == 100_000  # at its start: a zero-length span
    assert f.overlap_ms("p", 0, 200_000) == 0
    assert f.job_end["globex/y"].event_id == "e"
    assert f.ended_before_start == {"p": "e"}
    assert [(a.event_id, e.event_id) for a, e in f.clamped] == [("p", "e")]


def test_an_end_reported_while_the_job_waited_again_closes_the_later_run_at_its_start() -> None:
    """A run evicted, placed again later; the end before that placement is the first run's,
    the later run stays open, until an end dated while the job waited again arrives."""
    f = Facts()
    f.add_allocation(alloc("p1", 0))
    f.add_end(end("evicted", 40_000))
    f.add_allocation(alloc("p2", 100_000))
    assert "p2" not in f.alloc_end
    f.add_end(end("released", 60_000))
    assert f.alloc_end["p1"].event_id == "evicted"
    assert (f.alloc_end["p2"].event_id, f.alloc_end["p2"].end_ms) == ("released", 100_000)


def test_a_gangs_parts_evicted_at_one_instant_are_no_end_of_its_next_run() -> None:
    """Each part's eviction is an end of its own at the same instant: the parts' runs take
    them, and neither is the end of the run placed after them (it stays open until its own
    end, here one dated before its start)."""
    f = Facts()
    f.add_allocation(alloc("a", 0, node="n1"))
    f.add_allocation(alloc("b", 0, node="n2"))
    f.add_end(end("ev-n1", 40_000))
    f.add_end(end("ev-n2", 40_000))
    f.add_allocation(alloc("again", 100_000, node="n3"))
    assert "again" not in f.alloc_end
    f.add_end(end("released", 60_000))
    assert (f.alloc_end["again"].event_id, f.alloc_end["again"].end_ms) == ("released", 100_000)
    assert [(a.event_id, e.event_id) for a, e in f.clamped] == [("again", "released")]
