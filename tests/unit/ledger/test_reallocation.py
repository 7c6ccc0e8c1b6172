"""A job preempted (or evicted, or moved) and placed again is billed for every run: each
allocation from its placement to its own end, the first end at or after its start.

Before, the ledger kept one end per job, and a run placed after the job's first end was free.
The figures below are by hand: model X costs $2 per GPU-hour on demand (``conftest``).
"""

from __future__ import annotations

import random
from pathlib import Path

from seedance.cost_ledger import core
from seedance.cost_ledger.core import (
    GpuAllocation,
    JobCost,
    JobEnded,
    Ledger,
    LedgerConfig,
    NodeInfo,
    PriceBook,
    recompute,
)

from .fixtures import make_checkpoint_2a21cb4 as old

T0 = old.START_MS
MIN = old.MIN_MS
CONFIG = LedgerConfig(window_s=900, lateness_s=0)  # 15 min: a quarter GPU-hour per window
OLD_CONFIG = LedgerConfig(window_s=300, lateness_s=0)  # the fixture's
FIXTURES = Path(__file__).parent / "fixtures"


def node(name: str) -> NodeInfo:
    return NodeInfo(event_id=f"inv-{name}", node=name, gpu_model="X", gpu_count=2, at_ms=T0)


def run(eid: str, on: str, start_min: int, gpu: int = 0, job: str = "acme/a") -> GpuAllocation:
    return GpuAllocation(
        event_id=eid, job_id=job, tenant=job.split("/")[0], node=on, gpu_model="X",
        gpu_indices=(gpu,), start_ms=T0 + start_min * MIN,
    )  # fmt: skip


def end(eid: str, at_min: int, job: str = "acme/a") -> JobEnded:
    return JobEnded(event_id=eid, job_id=job, end_ms=T0 + at_min * MIN)


def replaced() -> list[core.LedgerInput]:
    """Placed on n0 at 0, preempted at 15 min, placed on n1 at 30 min, finished at 60 min:
    15 + 30 minutes of one GPU."""
    return [
        node("n0"), node("n1"),
        run("p1", "n0", 0), end("preempted", 15), run("p2", "n1", 30), end("released", 60),
    ]  # fmt: skip


def test_a_job_placed_again_is_billed_for_both_runs(book: PriceBook) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many(replaced())
    out = led.advance(T0 + 90 * MIN)
    job = led.totals().by_job["acme/a"]
    assert job.gpu_hours_micro == 750_000  # 0.25 h on n0 + 0.5 h on n1
    assert job.cost_usd_micro == 1_500_000
    by_node = {
        n: sum(o.amounts.gpu_hours_micro for o in out if getattr(o, "node", "") == n
               and o.kind == "usage")
        for n in ("n0", "n1")
    }  # fmt: skip
    assert by_node == {"n0": 250_000, "n1": 500_000}
    # one report, at the last end, naming both runs and both ends
    (report,) = [o for o in out if isinstance(o, JobCost)]
    assert (report.start_ms, report.end_ms) == (T0, T0 + 60 * MIN)
    assert report.amounts.gpu_hours_micro == 750_000
    assert set(report.source_event_ids) == {"p1", "p2", "preempted", "released"}


def test_a_move_in_one_instant_bills_both_runs(book: PriceBook) -> None:
    # Consolidation: ended on n0 and placed on n1 at the same millisecond.
    facts = [node("n0"), node("n1"), run("p1", "n0", 0), end("moved", 20), run("p2", "n1", 20),
             end("released", 50)]  # fmt: skip
    led = Ledger(book, CONFIG)
    led.apply_many(facts)
    led.advance(T0 + 90 * MIN)
    assert led.totals().by_job["acme/a"].gpu_hours_micro == 833_333  # 50 min, rounded per line


def test_a_run_placed_and_ended_at_once_costs_nothing_and_ends(book: PriceBook) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many([node("n0"), run("p1", "n0", 10), end("e", 10)])
    led.advance(T0 + 60 * MIN)
    assert "acme/a" not in led.totals().by_job
    assert led.facts.job_end["acme/a"].event_id == "e"  # ended, not billed on and on


def test_a_job_waiting_to_be_placed_again_is_not_ended(book: PriceBook) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many([node("n0"), run("p1", "n0", 0), end("preempted", 15)])
    first = [o for o in led.advance(T0 + 20 * MIN) if isinstance(o, JobCost)]
    assert [r.revision for r in first] == [0]  # it looked finished
    led.apply_many([run("p2", "n0", 30, gpu=1)])
    assert "acme/a" not in led.facts.job_end  # running again
    led.apply(end("released", 40))
    reports = [o for o in led.advance(T0 + 60 * MIN) if isinstance(o, JobCost)]
    assert [(r.revision, r.amounts.gpu_hours_micro) for r in reports] == [(1, 416_667)]


def test_any_order_duplicates_and_restarts_bill_the_runs_once(book: PriceBook) -> None:
    facts = replaced()
    expected = recompute(facts, book, T0 + 90 * MIN, CONFIG)
    assert expected.by_job["acme/a"].gpu_hours_micro == 750_000
    rng = random.Random(7)
    for _ in range(20):
        stream = facts + rng.sample(facts, k=3)  # redelivered
        rng.shuffle(stream)
        led = Ledger(book, CONFIG)
        for i, e in enumerate(stream):
            led.apply(e)
            led.advance(T0 + rng.randrange(0, 90) * MIN)
            if i % 3 == 2:  # a restart from the checkpoint
                led = Ledger.from_bytes(led.to_bytes(), book)
        led.advance(T0 + 90 * MIN)
        assert led.totals() == expected


def test_a_checkpoint_of_today_round_trips_unchanged(book: PriceBook) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many(replaced())
    led.advance(T0 + 45 * MIN)
    again = Ledger.from_bytes(led.to_bytes(), book)
    assert again.to_bytes() == led.to_bytes()
    assert again.dirty == set()


def test_a_checkpoint_written_before_bills_the_free_run_as_adjustments(book: PriceBook) -> None:
    led = Ledger.from_bytes((FIXTURES / "checkpoint-2a21cb4.bin").read_bytes(), book)
    # as written: the second run (from +30 min) went unbilled; 3 windows of 5 min, each
    # 83,333 micro GPU-hours (rounded per line)
    assert led.totals().by_job["acme/a"].gpu_hours_micro == 3 * 83_333
    out = led.advance(T0 + 60 * MIN)
    adjustments = [o for o in out if isinstance(o, core.CostLine) and o.kind == "usage"]
    assert adjustments
    assert {o.node for o in adjustments} == {"n1"}
    assert all(o.revision == 0 for o in adjustments)  # never billed before: first lines
    # now what the same facts cost
    assert led.totals() == recompute(old.facts(), book, T0 + 60 * MIN, OLD_CONFIG)  # type: ignore[arg-type]
    assert led.totals().by_job["acme/a"].gpu_hours_micro == (3 + 6) * 83_333
