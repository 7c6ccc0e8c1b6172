"""An end dated before every run of its job the ledger holds (its CPU-only and refused runs
included: ``UnbilledRun``) is the end of no run, a producer's defect: it closes the job's
first run at its start (a zero-length span, billed nothing; noted in ``Facts.clamped`` for the
service to log and count) when no end at or after that start does, and the run's own end,
arriving later, takes over. An end dated while the job waited between two runs is the earlier
run's (a second end of it): it closes no later run.

On main's facts before this change (the clamp withdrawn, since a CPU-only run, not recorded
then, could not be told from a defect: ``test_job_id_reuse.py``) each first run here stayed
open, billed for ever until an end at or after its start arrived."""

from __future__ import annotations

from itertools import permutations

import msgspec
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
def test_an_end_of_no_run_closes_the_run_at_its_start(end_first: bool) -> None:
    f = Facts()
    facts = [alloc("p", 100_000), end("e", 50_000)]
    for x in reversed(facts) if end_first else facts:
        if isinstance(x, GpuAllocation):
            f.add_allocation(x)
        else:
            f.add_end(x)
    assert (f.alloc_end["p"].event_id, f.alloc_end["p"].end_ms) == ("e", 100_000)
    assert f.overlap_ms("p", 0, 200_000) == 0  # closed at its start: billed nothing
    assert f.job_end["globex/y"].event_id == "e"
    assert f.ended_before_start == {"p": "e"}
    assert [(a.event_id, e.event_id) for a, e in f.clamped] == [("p", "e")]
    f.add_end(end("own", 150_000))  # its own end, late: takes over
    assert f.ended_before_start == {}
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


def test_a_gang_whose_end_is_of_no_run_is_closed_at_its_start_part_by_part() -> None:
    f = Facts()
    f.add_allocation(alloc("a", 100_000, node="n1"))
    f.add_end(end("r", 50_000))
    f.add_allocation(alloc("b", 100_000, node="n2"))
    assert {a: (e.event_id, e.end_ms) for a, e in f.alloc_end.items()} == {
        "a": ("r", 100_000),
        "b": ("r", 100_000),
    }


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


def test_a_run_closed_at_its_start_is_billed_again_to_its_own_end(book: PriceBook) -> None:
    """Windows closed while the run is closed at its start bill it nothing; its own end,
    arriving later, re-bills them: the incremental totals equal a recompute of the same facts
    (30 minutes of one GPU)."""
    t0, minute = 1_700_000_000_000 - 1_700_000_000_000 % 900_000, 60_000
    config = LedgerConfig(window_s=900, lateness_s=0)
    node = NodeInfo(event_id="inv", node="n0", gpu_model="X", gpu_count=1, at_ms=t0)
    run = GpuAllocation(event_id="p", job_id="globex/y", tenant="globex", node="n0",
                        gpu_model="X", gpu_indices=(0,), start_ms=t0 + 30 * minute)  # fmt: skip
    early, own = end("early", t0 + 15 * minute), end("own", t0 + 60 * minute)
    led = Ledger(book, config)
    led.apply_many([node, run, early])
    led.advance(t0 + 70 * minute)  # [30, 60) min closed with the run closed at its start
    assert "globex/y" not in led.totals().by_job
    led.apply(own)
    led.advance(t0 + 90 * minute)
    expected = recompute([node, run, early, own], book, t0 + 90 * minute, config)
    assert expected.by_job["globex/y"].gpu_hours_micro == 500_000
    assert led.totals() == expected


def test_retention_seals_no_window_of_a_run_closed_at_its_start(book: PriceBook) -> None:
    """A run closed at its start whose own end arrives more than the retention later: its
    windows were kept (the seal waits at the run's start while it is so closed), so that end
    bills the run in full (170 minutes), and the seal moves on once it has.

    Before the fix retention sealed them (``assert 5908062 == 5908034``, ``sealed_until`` past
    the run's start): its end re-billed only the windows still open to change, 499,998
    µGPU-h against the recompute's 2,833,322 (``late_facts`` 1)."""
    t0, minute = 1_772_409_600_000, 60_000
    config = LedgerConfig(window_s=300, lateness_s=0, retention_windows=6)
    node = NodeInfo(event_id="inv", node="n", gpu_model="X", gpu_count=1, at_ms=t0)
    gpu = alloc("gpu", t0 + 10 * minute, node="n", job="acme/train")
    defect = end("cpu-release", t0 + 5 * minute, job="acme/train")
    own = end("gpu-release", t0 + 180 * minute, job="acme/train")
    led = Ledger(book, config)
    led.apply_many([node, defect, gpu])
    for m in range(10, 181, 5):
        led.advance(t0 + m * minute)
    assert led.facts.ended_before_start == {"gpu": "cpu-release"}
    assert led.sealed_until == (t0 + 10 * minute) // config.window_ms  # held at its start
    led.apply(own)
    led.advance(t0 + 200 * minute)
    expected = recompute([node, defect, gpu, own], book, t0 + 200 * minute, config)
    assert led.totals().by_job["acme/train"].gpu_hours_micro == 2_833_322
    assert led.totals() == expected
    assert led.late_facts == 0
    assert led.sealed_until == (t0 + 200 * minute) // config.window_ms - 6  # moves on


def test_an_end_at_the_next_runs_start_is_that_runs_where_the_first_has_no_end(
    book: PriceBook,
) -> None:
    """The first run's end misdated before it (an end of no run) and the next run's release
    dated at that run's placement (the slicer's per-job floor): that release is the next
    run's, the first run is closed at its start by the end of no run, and neither is billed
    for ever, in every order of arrival, with a restart after each fact.

    Before the fix the first run took the release (the first end from its start up to the
    next run's start) and the next run stayed open, billed over the day: ``assert 'acme/j' not
    in {'acme/j': Amounts(... gpu_hours_micro=23833333 ...)}``; the next test: ``KeyError:
    'B'``."""
    t0, minute = 1_772_409_600_000, 60_000
    config = LedgerConfig(window_s=900, lateness_s=0)
    node = NodeInfo(event_id="inv", node="n", gpu_model="X", gpu_count=2, at_ms=t0 - 60 * minute)
    a = alloc("A", t0 + 10 * minute, node="n", job="acme/j")
    b = msgspec.structs.replace(
        alloc("B", t0 + 40 * minute, node="n", job="acme/j"), gpu_indices=(1,)
    )
    facts = [a, end("A-end-misdated", t0 + 5 * minute, job="acme/j"), b,
             end("B-end", t0 + 40 * minute, job="acme/j")]  # fmt: skip
    as_of = t0 + 24 * 60 * minute
    expected = recompute([node, *facts], book, as_of, config)
    assert "acme/j" not in expected.by_job  # both closed: A at its start, B at its release
    for order in permutations(facts):
        led = Ledger(book, config)
        led.apply(node)
        for x in order:
            led.apply(x)
            led.advance(x.end_ms if isinstance(x, JobEnded) else x.start_ms)
            led = Ledger.from_bytes(led.to_bytes(), book)
        f = led.facts
        assert "B" in f.alloc_end
        assert f.alloc_end["B"].event_id == "B-end"
        assert f.ended_before_start == {"A": "A-end-misdated"}
        led.advance(as_of)
        assert led.totals() == expected


def test_a_first_runs_end_at_the_next_runs_start_stays_its_own_if_that_run_has_one() -> None:
    """With an end of no run as well, an end at the next run's start is still the first run's
    (a move) where the next run has its own end: each run keeps its own."""
    f = Facts()
    for x in (alloc("A", 100_000), end("orphan", 50_000), alloc("B", 400_000)):
        f.add_allocation(x) if isinstance(x, GpuAllocation) else f.add_end(x)
    f.add_end(end("moved", 400_000))
    assert f.alloc_end["B"].event_id == "moved"  # alone: the next run's (floored release)
    f.add_end(end("released", 700_000))
    assert f.alloc_end["A"].event_id == "moved"
    assert f.alloc_end["B"].event_id == "released"
    assert f.ended_before_start == {}


def test_a_run_closed_at_its_start_is_noted_once_whatever_ends_of_no_run_arrive() -> None:
    """Two ends of no run, the later first: the run is closed at its start by the earliest,
    and noted (logged and counted by the stepper) once.

    Before the fix the earlier end moved the close and noted the run again: ``assert
    [('gpu', 'e5'), ('gpu', 'e2')] == [('gpu', 'e5')]``."""
    f = Facts()
    f.add_allocation(alloc("gpu", 600_000))
    f.add_end(end("e5", 300_000))
    f.add_end(end("e2", 120_000))
    assert [(a.event_id, e.event_id) for a, e in f.clamped] == [("gpu", "e5")]
    assert f.ended_before_start == {"gpu": "e2"}
    assert f.alloc_end["gpu"].event_id == "e2"
