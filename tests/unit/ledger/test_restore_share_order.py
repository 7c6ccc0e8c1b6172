"""A replica restored from its checkpoint bills the slicer's share changes as one that ran on.

A rollback the scheduler could restore only in part is two changes at one instant: the rollback
S and the share it ``kept`` K, whose id is derived from S's (``derived_event_id``: S's time
bits, hash bits after), so the two ids sort either way. A checkpoint lists allocations by event
id; which allocation a later change is about must not depend on that order (it did: a
restored replica dropped the later ``given_back`` change on about half such pairs and published
entries under the same ids with other amounts). Here a ledger that ran on and one restored at
every point of the same stream, advanced as the service does after each input, must publish
the same entries and end with the same knowledge. Model X costs $2 per GPU-hour."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from seedance.cost_ledger.core import (
    GpuAllocation,
    JobEnded,
    Ledger,
    LedgerConfig,
    LedgerOutput,
    NodeInfo,
    PriceBook,
)
from seedance.cost_ledger.core.facts import LedgerInput
from seedance.cost_ledger.core.lines import output_id
from seedance.cost_ledger.core.mapping import event_time_ms, facts_of
from seedance.events import derived_event_id
from seedance.events.slicing import ShareChanged, ShareChangeReason

MIN = 60_000
CONFIG = LedgerConfig(window_s=900, lateness_s=0)
KEPT = "share-kept/acme/a"  # the slicer's role for a kept share (slicer mapping ``_share_set``)


def rollback_pair(kept_first: bool) -> tuple[str, str]:
    """Ids of a rollback at 15 min and of its kept share, the kept one sorting first or not
    (the first such pair of a fixed series: deterministic)."""
    for n in range(64):
        rollback = derived_event_id(f"reading-{n}", "share-rolled_back/acme/a", 15 * MIN)
        kept = derived_event_id(rollback, KEPT)
        if (kept < rollback) == kept_first:
            return rollback, kept
    raise AssertionError("no pair of that order in 64 draws")


def uuid7(what: str, at_min: int) -> str:
    """A UUIDv7 of ``at_min`` as the services' ids are (ids of different instants sort by time)."""
    return derived_event_id(what, "test", at_min * MIN)


def change(eid: str, frm: int, to: int, at_min: int, reason: ShareChangeReason) -> LedgerInput:
    """The slicer's ``ShareChanged`` as the ledger takes it off the bus (``facts_of``)."""
    ev = ShareChanged(
        id=eid, at=datetime.fromtimestamp(at_min * 60, UTC), job_id="a", tenant="acme",
        node="n", gpu_index=0, from_milli=frm, to_milli=to, reason=reason,
    )  # fmt: skip
    (fact,), _ = facts_of(ev, event_time_ms(ev), frozenset({"acme"}), {})
    return fact


def stream(kept_first: bool) -> list[tuple[LedgerInput, int]]:
    """Each input with the time the service advances the ledger to after it: placed at 600,
    right-sized to 300 at 10 min, rolled back to 600 at 15 min of which 450 was kept, the rest
    given back at 30 min (a neighbour left), released at 60 min."""
    rollback, kept = rollback_pair(kept_first)
    rs, rb = ShareChangeReason.RIGHTSIZED, ShareChangeReason.ROLLED_BACK
    inventory = NodeInfo(
        event_id=uuid7("inventory", 0), node="n", gpu_model="X", gpu_count=1, at_ms=0
    )
    placed = GpuAllocation(
        event_id=uuid7("placed", 0), job_id="acme/a", tenant="acme", node="n", gpu_model="X",
        gpu_indices=(0,), start_ms=0, kind="shared", gpu_milli=600,
    )  # fmt: skip
    released = JobEnded(event_id=uuid7("released", 60), job_id="acme/a", end_ms=60 * MIN)
    return [
        (inventory, 0),
        (placed, 0),
        (change(uuid7("rightsized", 10), 600, 300, 10, rs), 10 * MIN),
        (change(rollback, 300, 600, 15, rb), 15 * MIN),
        (change(kept, 600, 450, 15, rb), 15 * MIN),
        (change(uuid7("given_back", 30), 450, 600, 30, rb), 30 * MIN),
        (released, 60 * MIN),
        (released, 90 * MIN),  # a redelivery
    ]


def run(led: Ledger, steps: list[tuple[LedgerInput, int]]) -> Iterator[LedgerOutput]:
    for fact, now_ms in steps:
        led.apply(fact)
        yield from led.advance(now_ms)


def published(outputs: Iterator[LedgerOutput]) -> dict[str, LedgerOutput]:
    out: dict[str, LedgerOutput] = {}
    for o in outputs:
        assert out.setdefault(output_id(o), o) == o, f"{output_id(o)} published twice, unequal"
    return out


@pytest.mark.parametrize("kept_first", [True, False], ids=["kept-id-first", "kept-id-last"])
def test_a_restored_ledger_publishes_the_entries_of_one_that_ran_on(
    book: PriceBook, kept_first: bool
) -> None:
    steps = stream(kept_first)
    ran_on = Ledger(book, CONFIG)
    expected = published(run(ran_on, steps))
    # 0.6 x 10 min + 0.3 x 5 min + 0.45 x 15 min + 0.6 x 30 min (the 1 ms the kept share
    # takes effect after the rollback rounds away) = 0.5375 GPU-hours
    assert ran_on.totals().by_job["acme/a"].gpu_hours_micro == 537_500
    for cut in range(len(steps) + 1):
        before = Ledger(book, CONFIG)
        outputs = list(run(before, steps[:cut]))
        restored = Ledger.from_bytes(before.to_bytes(), book)
        outputs += run(restored, steps[cut:])
        got = published(iter(outputs))
        differ = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k))
        assert not differ, f"restored after {cut} inputs, these entries differ: {differ}"
        assert restored.fingerprint() == ran_on.fingerprint(), f"restored after {cut} inputs"
        # What "the job's latest" and "first" allocation read, in the same order on both
        assert restored.facts.job_allocs == ran_on.facts.job_allocs, f"restored after {cut}"
