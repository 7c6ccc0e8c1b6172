"""An end dated before the start of every run of its job it could end is the end of none of
them: ignored, the run stays open until an end at or after its start. The ledger cannot tell
such an end from the end of a run it holds no allocation for (a CPU-only run of the same job
id: ``test_job_id_reuse.py``), and the slicer dates no end before the job's latest placement.

On the facts with the end-before-start clamp (withdrawn), each run here was closed at its start
by that end (a zero-length span, billed nothing, logged as a producer's defect)."""

from __future__ import annotations

import pytest

from seedance.cost_ledger.core import Ledger, LedgerConfig, PriceBook, recompute
from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded, NodeInfo


def alloc(eid: str, start_ms: int, node: str = "n1", job: str = "globex/y") -> GpuAllocation:
    return GpuAllocation(
        event_id=eid, job_id=job, tenant=job.split("/")[0], node=node, gpu_model="T4",
        gpu_indices=(0,), start_ms=start_ms,
    )  # fmt: skip


def end(eid: str, end_ms: int, job: str = "globex/y") -> JobEnded:
    return JobEnded(event_id=eid, job_id=job, end_ms=end_ms)


@pytest.mark.parametrize("end_first", [False, True])
def test_an_end_dated_before_the_start_is_no_end_of_the_run(end_first: bool) -> None:
    f = Facts()
    facts = [alloc("p", 100_000), end("e", 50_000)]
    for x in reversed(facts) if end_first else facts:
        if isinstance(x, GpuAllocation):
            f.add_allocation(x)
        else:
            f.add_end(x)
    assert "p" not in f.alloc_end
    assert f.overlap_ms("p", 0, 200_000) == 100_000  # held from its start on
    assert "globex/y" not in f.job_end
    f.add_end(end("own", 150_000))
    assert f.alloc_end["p"].event_id == "own"
    assert f.overlap_ms("p", 0, 200_000) == 50_000


def test_an_end_reported_while_the_job_waited_again_ends_neither_run() -> None:
    """A run evicted, placed again later: the end before that placement is the first run's;
    another end dated while the job waited is no end of the later run either."""
    f = Facts()
    f.add_allocation(alloc("p1", 0))
    f.add_end(end("evicted", 40_000))
    f.add_allocation(alloc("p2", 100_000))
    assert "p2" not in f.alloc_end
    f.add_end(end("released", 60_000))
    assert f.alloc_end["p1"].event_id == "evicted"
    assert "p2" not in f.alloc_end
    assert "globex/y" not in f.job_end


def test_a_gangs_parts_evicted_at_one_instant_are_no_end_of_its_next_run() -> None:
    """Each part's eviction is an end of its own at the same instant: the parts' runs take
    them, and neither is the end of the run placed after them, nor is an end dated between."""
    f = Facts()
    f.add_allocation(alloc("a", 0, node="n1"))
    f.add_allocation(alloc("b", 0, node="n2"))
    f.add_end(end("ev-n1", 40_000))
    f.add_end(end("ev-n2", 40_000))
    f.add_allocation(alloc("again", 100_000, node="n3"))
    assert "again" not in f.alloc_end
    f.add_end(end("released", 60_000))
    assert set(f.alloc_end) == {"a", "b"}  # the next run open
    assert "globex/y" not in f.job_end


def test_a_run_with_an_earlier_end_bills_every_window_to_its_own_end(book: PriceBook) -> None:
    """Windows closed while the run is open bill it, and its own end, arriving later, leaves
    the incremental totals equal to a recompute of the same facts (30 minutes of one GPU)."""
    t0, minute = 1_700_000_000_000 - 1_700_000_000_000 % 900_000, 60_000
    config = LedgerConfig(window_s=900, lateness_s=0)
    node = NodeInfo(event_id="inv", node="n0", gpu_model="X", gpu_count=1, at_ms=t0)
    run = GpuAllocation(event_id="p", job_id="globex/y", tenant="globex", node="n0",
                        gpu_model="X", gpu_indices=(0,), start_ms=t0 + 30 * minute)  # fmt: skip
    early, own = end("early", t0 + 15 * minute), end("own", t0 + 60 * minute)
    led = Ledger(book, config)
    led.apply_many([node, run, early])
    led.advance(t0 + 70 * minute)  # [30, 60) min closed with the run open
    assert led.totals().by_job["globex/y"].gpu_hours_micro == 500_000
    led.apply(own)
    led.advance(t0 + 90 * minute)
    expected = recompute([node, run, early, own], book, t0 + 90 * minute, config)
    assert expected.by_job["globex/y"].gpu_hours_micro == 500_000
    assert led.totals() == expected
