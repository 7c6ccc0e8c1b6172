"""A shared job's granted share changed by the slicer's right-sizing (``slice.share_changed.v1``)
is billed from the change's time on: the allocation in force ends there and a copy at the new
share starts there (``Facts.resized``), so a rollback bills the previous share again. A change
about an allocation that is gone, or from another share, bills nothing different; a duplicate
changes nothing; a checkpoint keeps it. Model X costs $2 per GPU-hour (``conftest``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from seedance.cost_ledger.core import (
    GpuAllocation,
    JobEnded,
    Ledger,
    LedgerConfig,
    NodeInfo,
    PriceBook,
    recompute,
)
from seedance.cost_ledger.core.facts import LedgerInputError, ShareResize
from seedance.cost_ledger.core.mapping import facts_of
from seedance.events.slicing import ShareChanged, ShareChangeReason

MIN = 60_000
CONFIG = LedgerConfig(window_s=900, lateness_s=0)  # a quarter GPU-hour per window


def placed(milli: int = 600) -> GpuAllocation:
    return GpuAllocation(
        event_id="p1", job_id="acme/a", tenant="acme", node="n", gpu_model="X",
        gpu_indices=(0,), start_ms=0, kind="shared", gpu_milli=milli,
    )  # fmt: skip


def resize(eid: str, frm: int, to: int, at_min: int, gpu: int = 0) -> ShareResize:
    return ShareResize(
        event_id=eid, job_id="acme/a", node="n", gpu_index=gpu, from_milli=frm, gpu_milli=to,
        at_ms=at_min * MIN,
    )  # fmt: skip


def facts(*changes: ShareResize) -> list[object]:
    return [
        NodeInfo(event_id="inv", node="n", gpu_model="X", gpu_count=1, at_ms=0),
        placed(),
        *changes,
        JobEnded(event_id="released", job_id="acme/a", end_ms=60 * MIN),
    ]


def billed_hours_micro(led: Ledger) -> int:
    led.advance(90 * MIN)
    return led.totals().by_job["acme/a"].gpu_hours_micro


def test_a_rightsized_then_rolled_back_share_is_billed_at_each_share_in_its_time(
    book: PriceBook,
) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many(facts(resize("s1", 600, 300, 15), resize("s2", 300, 600, 30)))  # type: ignore[arg-type]
    # 0.6 x 15 min + 0.3 x 15 min + 0.6 x 30 min = 0.525 GPU-hours
    assert billed_hours_micro(led) == 525_000
    assert led.totals().by_job["acme/a"].cost_usd_micro == 1_050_000
    allocs = [led.facts.allocations[a] for a in led.facts.job_allocs["acme/a"]]
    assert [(p.start_ms // MIN, p.gpu_milli) for p in allocs] == [(0, 600), (15, 300), (30, 600)]


@pytest.mark.parametrize(
    "stale",
    [resize("s1", 500, 300, 15), resize("s1", 600, 300, 15, gpu=1), resize("s1", 600, 300, 75)],
)
def test_a_change_about_an_allocation_that_is_gone_bills_nothing_different(
    book: PriceBook, stale: ShareResize
) -> None:
    led = Ledger(book, CONFIG)
    led.apply_many(facts(stale))  # type: ignore[arg-type]
    assert billed_hours_micro(led) == 600_000  # 0.6 x 60 min, as without it


def test_a_duplicate_change_and_a_checkpoint_bill_it_once(book: PriceBook) -> None:
    stream = facts(resize("s1", 600, 300, 15))
    led = Ledger(book, CONFIG)
    for e in stream[:3]:
        led.apply(e)  # type: ignore[arg-type]
    restored = Ledger.from_bytes(led.to_bytes(), book)
    assert restored.apply(resize("s1", 600, 300, 15)) is False
    restored.apply(stream[3])  # type: ignore[arg-type]
    assert billed_hours_micro(restored) == 375_000  # 0.6 x 15 + 0.3 x 45 min
    assert recompute(stream, book, 90 * MIN, CONFIG).by_job["acme/a"].gpu_hours_micro == 375_000  # type: ignore[arg-type]


def test_the_slicers_share_change_is_the_fact_and_a_bad_share_is_refused(book: PriceBook) -> None:
    ev = ShareChanged(
        id="sc1", at=datetime.fromtimestamp(900, UTC), job_id="a", tenant="acme", node="n",
        gpu_index=0, from_milli=600, to_milli=300, reason=ShareChangeReason.RIGHTSIZED,
    )  # fmt: skip
    (fact,), _ = facts_of(ev, 900_000, frozenset({"acme"}), {})
    assert fact == resize("sc1", 600, 300, 15)
    with pytest.raises(LedgerInputError, match="gpu_milli = 0"):
        Ledger(book, CONFIG).apply(resize("bad", 600, 0, 15))


def test_a_change_at_the_very_instant_of_another_takes_effect_a_millisecond_later(
    book: PriceBook,
) -> None:
    # A rollback to 600 at 30 min, the slicer's answer (it holds 300) at the same instant, and
    # the rest given back at that instant too (a neighbour ended then).
    led = Ledger(book, CONFIG)
    changes = (
        resize("s1", 600, 300, 15), resize("s2", 300, 600, 30), resize("s3", 600, 300, 30),
        resize("s4", 300, 600, 30),
    )  # fmt: skip
    led.apply_many(facts(*changes))  # type: ignore[arg-type]
    allocs = [led.facts.allocations[a] for a in led.facts.job_allocs["acme/a"]]
    assert [(p.start_ms, p.gpu_milli) for p in allocs] == [
        (0, 600), (15 * MIN, 300), (30 * MIN, 600), (30 * MIN + 1, 300), (30 * MIN + 2, 600)
    ]  # fmt: skip
    # 0.6 x 15 min + 0.3 x 15 min + 0.6 x 30 min (the two 1 ms parts round away)
    assert billed_hours_micro(led) == 525_000


def test_a_change_is_about_the_latest_run_by_start_whatever_order_the_runs_arrived_in(
    book: PriceBook,
) -> None:
    # Placed at 0, preempted at 10 min, placed again at 20 min on the same GPU; right-sized at
    # 30 min. The second run's placement may reach the ledger before the first's.
    first = placed()
    ended = JobEnded(event_id="preempted", job_id="acme/a", end_ms=10 * MIN)
    again = GpuAllocation(
        event_id="p2", job_id="acme/a", tenant="acme", node="n", gpu_model="X",
        gpu_indices=(0,), start_ms=20 * MIN, kind="shared", gpu_milli=600,
    )  # fmt: skip
    inv = NodeInfo(event_id="inv", node="n", gpu_model="X", gpu_count=1, at_ms=0)
    end = JobEnded(event_id="released", job_id="acme/a", end_ms=60 * MIN)
    billed = []
    for runs in ([first, ended, again], [again, first, ended]):
        led = Ledger(book, CONFIG)
        led.apply_many([inv, *runs, resize("s1", 600, 300, 30), end])  # type: ignore[list-item]
        billed.append(billed_hours_micro(led))
    # 0.6 x 10 min + 0.6 x 10 min + 0.3 x 30 min = 0.35 GPU-hours, in either order
    assert billed == [350_000, 350_000]
