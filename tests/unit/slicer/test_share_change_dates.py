"""A right-sizing share change, dated as the ledger bills it (`core.resize`, `publish_at_s`).

The right-sizing loop publishes a `ShareChanged`; the cost ledger bills it from its `at` (the
reading's time that decided it), 1 ms after the share it changes began at the earliest
(`Facts.resized`), and the slicer reads it back afterwards. What the slicer decides about the
job and about the room the change frees is dated no earlier than that bill: these tests read
the bill (the loop's event and the slicer's, through the ledger's `facts_of` and `Facts`), as
`tests/unit/slicer/test_no_gpu_billed_twice.py` found each case.
"""

from __future__ import annotations

from datetime import UTC, datetime

from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded, ShareResize
from seedance.cost_ledger.core.mapping import facts_of
from seedance.events.base import new_event_id
from seedance.events.jobs import JobCancelled
from seedance.events.slicing import ShareChanged, ShareChangeReason
from seedance.slicer.core import Effect, JobSpec, Scheduler, ShareChange, ShareSet
from seedance.slicer.mapping import published, share_change
from tests.unit.slicer.nodes import node_spec as node


def _apply(ledger: Facts, ev: object, at_s: float) -> None:
    for fact in facts_of(ev, round(at_s * 1000), frozenset(), {})[0]:  # type: ignore[arg-type]
        if isinstance(fact, GpuAllocation):
            ledger.add_allocation(fact)
        elif isinstance(fact, JobEnded):
            ledger.add_end(fact)
        elif isinstance(fact, ShareResize) and (both := ledger.resized(fact)) is not None:
            ledger.add_allocation(both[0])  # as `Ledger._resize`: the new share, then the end
            ledger.add_end(both[1])


def bill(s: Scheduler, ledger: Facts, effects: list[Effect], now_s: float) -> list[Effect]:
    """Publish `effects` (caused by an input at `now_s`) as the decider does, into `ledger`."""
    cause = JobCancelled(
        id=new_event_id(), at=datetime.fromtimestamp(now_s, UTC), job_id="cause", tenant="t"
    )
    for e in effects:
        at_s = s.publish_at_s(e, now_s)
        _, ev, _ = published(
            e, cause, datetime.fromtimestamp(at_s, UTC), pool="p", policy="x", key=None
        )
        _apply(ledger, ev, at_s)
    return effects


def resize(
    s: Scheduler, ledger: Facts, jid: str, frm: int, to: int, now_s: float, read_s: float = 0.0
) -> list[Effect]:
    """The loop's change of `jid`'s share of n0's GPU 0, read at `read_s` (default: `now_s`),
    billed by the ledger, then applied by the slicer at `now_s` (its latest decided time)."""
    ev = ShareChanged(
        id=new_event_id(), at=datetime.fromtimestamp(read_s or now_s, UTC), job_id=jid,
        tenant="t", node="n0", gpu_index=0, from_milli=frm, to_milli=to,
        reason=ShareChangeReason.RIGHTSIZED if to < frm else ShareChangeReason.ROLLED_BACK,
    )  # fmt: skip
    _apply(ledger, ev, read_s or now_s)
    return bill(s, ledger, s.resize_share(share_change(ev), now_s), now_s)


def shared(jid: str, milli: int, movable: bool = False) -> JobSpec:
    return JobSpec(
        job_id=jid, tenant="t", cause_id=f"c-{jid}", gpus=1, gpu_milli=milli, movable=movable
    )


def runs(ledger: Facts, jid: str) -> list[tuple[str, int, int, int | None]]:
    """(node, milli, start ms, end ms or None while open) of each of the job's allocations."""
    out = []
    for a in ledger.job_allocs[f"t/{jid}"]:
        x, end = ledger.allocations[a], ledger.alloc_end.get(a)
        out.append((x.node, x.gpu_milli, x.start_ms, None if end is None else end.end_ms))
    return sorted(out, key=lambda r: (r[2], r[0]))


def peak_milli(ledger: Facts, node_name: str) -> int:
    """The most milli billed at once on GPU 0 of `node_name`."""
    points = []
    for a, x in ledger.allocations.items():
        if x.node == node_name and 0 in x.gpu_indices:
            end = ledger.alloc_end.get(a)
            if end is None or end.end_ms > x.start_ms:
                points.append((x.start_ms, 1, x.gpu_milli))
                points += [(end.end_ms, 0, -x.gpu_milli)] if end is not None else []
    total = peak = 0
    for _, _, d in sorted(points):
        total += d
        peak = max(peak, total)
    return peak


def test_an_end_reported_before_a_share_change_is_dated_at_the_change() -> None:
    """a (200) runs from 10 s; the loop raises it to 700 at 40 s; an observer then reports a
    ended at 30 s: the end is dated at the change (40 s), the latest decision about a that
    the ledger bills, as an end reported before a job's latest placement is dated at that
    placement (`job_floor_s`). Before, the end was dated 30 s, before the 700 run the ledger
    had started (it then closed that run at 30 s: a run holding nothing)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 200), 10.0), 10.0)
    assert resize(s, ledger, "a", 200, 700, 40.0) == []
    bill(s, ledger, s.finish("t", "a", 30.0), 30.0)
    assert runs(ledger, "a") == [("n0", 200, 10_000, 40_000), ("n0", 700, 40_000, 40_000)]


def test_a_job_placed_in_a_lowered_share_s_room_starts_when_the_ledger_lowers_it() -> None:
    """a (700) runs from 0 s; lowered to 500 at 10 s, w1 (400) takes the room; lowered again to
    100 at the same instant, billed 1 ms later (1 ms after the 500 share began): w2 (400),
    placed in that room, starts then. Before, w2 started at 10 s: 1,300 milli billed on the
    GPU for 1 ms."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 700), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("w1", 400), 1.0), 1.0)
    bill(s, ledger, s.submit(shared("w2", 400), 2.0), 2.0)
    resize(s, ledger, "a", 700, 500, 10.0)
    resize(s, ledger, "a", 500, 100, 10.0)
    assert [r[2] for r in runs(ledger, "w1") + runs(ledger, "w2")] == [10_000, 10_001]
    assert peak_milli(ledger, "n0") == 900


def test_a_kept_share_is_dated_after_the_raise_it_answers() -> None:
    """a (200, not movable) shares the GPU with b (500); a rollback to 700 at 67 s is kept at
    the 500 the GPU has, answered 1 ms after the ledger's raise (its earliest); an observer's
    end of a at 65 s is dated at that answer and ends the kept share. Before, the answer and
    the end were dated 67 s: the ledger took the answer 1 ms later, after the end. Alone that
    leaves a kept share holding nothing; among several changes at one instant (the property
    test's seed 49) the next share given back or placed was dated before the ledger's."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("b", 500), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 200), 57.0), 57.0)
    (kept,) = resize(s, ledger, "a", 200, 700, 67.0)
    assert isinstance(kept, ShareSet)
    assert (kept.from_milli, kept.to_milli) == (700, 500)
    bill(s, ledger, s.finish("t", "a", 65.0), 65.0)
    assert runs(ledger, "a")[-1] == ("n0", 500, 67_001, 67_001)


def test_a_raise_takes_no_room_freed_after_it_is_billed() -> None:
    """a (500) and b (500) share the GPU; b is placed again at 140 s (a move: 500, then lowered
    to 100 at once, billed 1 ms later) and a rollback of a to 900 comes at 140 s too, billed
    at 140 s: b's 400 milli were not free then, so a keeps 500. Before, a got 900 from 140 s
    beside b's 500 until 140.001 s: 1,400 milli billed."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 500), 100.0), 100.0)
    bill(s, ledger, s.submit(shared("b", 500), 140.0), 140.0)
    resize(s, ledger, "b", 500, 100, 140.0)
    (kept,) = resize(s, ledger, "a", 500, 900, 140.0)
    assert isinstance(kept, ShareSet)
    assert (kept.from_milli, kept.to_milli) == (900, 500)


def _raise_after_a_neighbour_ended(movable: bool, restored: bool = False) -> tuple:
    """a (300), b (200), c (100) on n0's GPU 0; b ends at 50 s; the loop raises a to 400 from
    a reading of 49 s, read back at 50 s (`restored`: by a slicer restored from entries)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 300, movable=movable), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("b", 200), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("c", 100), 0.0), 0.0)
    bill(s, ledger, s.finish("t", "b", 50.0), 50.0)
    if restored:
        s = Scheduler.from_entries(s.state_entries())
    return s, ledger, resize(s, ledger, "a", 300, 400, 50.0, read_s=49.0)


def test_a_raise_counts_the_room_free_at_its_bill_beside_a_later_release() -> None:
    """At 49 s the GPU had 400 milli free with b still there: the raise to 400 is granted,
    whether a may move or not, live or restored. Before, b's end after the bill counted none
    of the room free: a movable a was evicted and placed again at 300 (its rollback lost, the
    job restarted), a fixed one kept at 300 with a detail saying 300 were free (700 were)."""
    for movable, restored in ((True, False), (False, False), (True, True)):
        _, ledger, out = _raise_after_a_neighbour_ended(movable, restored)
        assert out == []
        assert runs(ledger, "a") == [("n0", 300, 0, 49_000), ("n0", 400, 49_000, None)]
        assert peak_milli(ledger, "n0") == 700


def test_a_raise_refused_for_room_freed_after_its_bill_says_what_was_free() -> None:
    """As above, but the raise asks 950: 400 milli were free at 49 s (b's 200 were freed only
    at 50 s), so a fixed a keeps 700 = 300 + 400, and the detail names those figures."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 300), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("b", 200), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("c", 100), 0.0), 0.0)
    bill(s, ledger, s.finish("t", "b", 50.0), 50.0)
    (kept,) = resize(s, ledger, "a", 300, 950, 50.0, read_s=49.0)
    assert isinstance(kept, ShareSet)
    assert (kept.from_milli, kept.to_milli) == (950, 700)
    assert "had 400 milli free besides its 300 at 49.000 s" in kept.detail
    assert "200 more were freed only after it" in kept.detail


def test_a_share_change_is_billed_from_its_reading_s_time() -> None:
    """a (700) is lowered to 200 by a reading of 20 s, read back when the slicer's latest
    decided time is 10 s: the ledger lowers it at 20 s, so w (500), waiting, is placed in the
    room at 20 s. Before, w was placed at 10 s: 1,200 milli billed over [10 s, 20 s)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("a", 700), 0.0), 0.0)
    bill(s, ledger, s.submit(shared("w", 500), 1.0), 1.0)
    resize(s, ledger, "a", 700, 200, 10.0, read_s=20.0)
    assert runs(ledger, "w") == [("n0", 500, 20_000, None)]
    assert peak_milli(ledger, "n0") == 700


def test_the_change_s_reading_time_reaches_the_core() -> None:
    """The mapping carries the change's own `at` as the time it is billed from."""
    at = datetime.fromtimestamp(20.0, UTC)
    ev = ShareChanged(
        id=new_event_id(), at=at, job_id="a", tenant="t", node="n0", gpu_index=0,
        from_milli=700, to_milli=200, reason=ShareChangeReason.RIGHTSIZED,
    )  # fmt: skip
    assert share_change(ev) == ShareChange(
        tenant="t", job_id="a", node="n0", gpu=0, from_milli=700, to_milli=200,
        reason="rightsized", billed_at_s=20.0,
    )  # fmt: skip
