"""No decision about a job is dated before that job's own trusted submit (the per-job floor,
`Scheduler.publish_at_s`), whatever input caused it: a trusted observer's report keeps its own
time (the past it reports is billed there) but cannot place a job before it was asked for.

On the scheduler before the change, an observer's end dated between the holder's placement
and the waiting job's submit started the waiting job at the report's time (`started_s`, where
consolidation's `max_lost_s` counts from, and the placement's `at`, where billing starts)."""

from __future__ import annotations

from seedance.slicer.core import (
    Effect,
    Ended,
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    Scheduler,
    Waiting,
)
from seedance.slicer.core.consolidation import DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.workload import SchedulerConfig
from tests.unit.slicer.nodes import node_spec as node


def job(jid: str, tenant: str) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=1)


def test_a_back_dated_report_places_the_waiting_job_no_earlier_than_its_submit() -> None:
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0.0)
    (held,) = s.submit(job("holder", "acme"), 10.0)
    assert isinstance(held, Placed)
    (waits,) = s.submit(job("waiting", "globex"), 100.0)
    assert isinstance(waits, Waiting)
    assert s.publish_at_s(waits, 100.0) == 100.0
    # An observer reports acme's job ended at 50 s: after it was placed, before globex asked.
    end, placed = s.finish("acme", "holder", 50.0)
    assert isinstance(end, Ended)
    assert isinstance(placed, Placed)
    assert placed.job.key == "globex/waiting"
    assert s.publish_at_s(end, 50.0) == 50.0  # the observer's past, for what it reports
    assert s.publish_at_s(placed, 50.0) == 100.0  # globex's job: from its own submit
    (run,) = s.snapshot().running
    assert run.started_s == 100.0
    # Later inputs are later than every submit: their own time stands.
    assert s.publish_at_s(placed, 120.0) == 120.0


def test_a_job_reported_ended_before_its_own_submit_ends_at_that_submit() -> None:
    """A report of the past about a job the slicer took later (its submit at 100 s, a trusted
    observer's end dated 60 s): its release is never dated before it was asked for."""
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0.0)
    s.submit(job("holder", "acme"), 10.0)
    (waits,) = s.submit(job("late", "acme"), 100.0)
    assert isinstance(waits, Waiting)
    (end,) = s.finish("acme", "late", 60.0)
    assert isinstance(end, Ended)
    assert end.floor_s == 100.0
    assert s.publish_at_s(end, 60.0) == 100.0
    # Another tenant's job of the same id is another job: its floor is its own.
    (other,) = s.submit(job("late", "globex"), 200.0)
    assert s.publish_at_s(other, 150.0) == 200.0


def job_of(jid: str, tenant: str, priority: int = 0, movable: bool = False) -> JobSpec:
    return JobSpec(
        job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=1, priority=priority, movable=movable
    )


def published(s: Scheduler, effects: list[Effect], now_s: float) -> list[tuple[Effect, float]]:
    """Each effect with the time it is published at, in order, as the decider dates them."""
    return [(e, s.publish_at_s(e, now_s)) for e in effects]


def waiting_then_placed(s: Scheduler, jid: str, priority: int = 0) -> float:
    """`jid` (acme's) asks at 20 s while acme's holder fills n0, waits, and is placed at 100 s
    on a node added then (an ordinary input); the time its placement is published at."""
    s.upsert_node(node("n0", 1), 0.0)
    s.submit(job_of("holder", "acme", priority=99), 10.0)
    ((w, _),) = published(s, s.submit(job_of(jid, "acme", priority), 20.0), 20.0)
    assert isinstance(w, Waiting)
    out = published(s, s.upsert_node(node("n1", 1), 100.0), 100.0)
    ((_, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed) and e.job.job_id == jid]
    return placed_at


def test_an_end_reported_between_submit_and_placement_is_dated_at_the_placement() -> None:
    """A trusted observer (the bridge, delayed) reports the job cancelled at 50 s, after it
    asked (20 s) but before the slicer placed it (100 s). Dated at its submit, the release
    came before the placement, and the ledger (whose end ends only allocations started
    before it) billed the allocation for ever."""
    s = Scheduler()
    placed_at = waiting_then_placed(s, "y")
    assert placed_at == 100.0
    ((end, ended_at),) = published(s, s.finish("acme", "y", 50.0), 50.0)
    assert isinstance(end, Ended)
    assert end.was_placed
    assert ended_at == placed_at


def test_a_back_dated_submit_evicts_a_later_placed_job_no_earlier_than_its_placement() -> None:
    """The replayer reports a priority-10 submit at 50 s: it preempts v, placed at 100 s."""
    s = Scheduler()
    placed_at = waiting_then_placed(s, "v")
    out = published(s, s.submit(job_of("p", "acme", priority=10), 50.0), 50.0)
    (evicted_at,) = [t for e, t in out if isinstance(e, Evicted) and e.job.job_id == "v"]
    assert evicted_at == placed_at
    # Its next decision (waiting again) is not dated before its eviction either.
    assert all(t >= evicted_at for e, t in out if getattr(e, "job", None) and e.job.job_id == "v")


def test_an_end_reported_before_a_move_is_dated_at_the_move() -> None:
    """A consolidation move places the job again at 100 s; an end reported at 50 s (after its
    first placement at 3 s) ends the allocation the move started, so it is dated at the move."""
    s = Scheduler(
        SchedulerConfig(
            consolidation=ConsolidationConfig(
                interval_s=60.0, hold_s=600.0, budget=DisruptionBudget(min_per_window=4)
            )
        )
    )
    s.upsert_node(node("n1", 4), 0.0)
    for jid in "abcd":
        s.submit(job_of(jid, "a"), 1.0)
    s.upsert_node(node("n2", 4), 2.0)
    published(s, s.submit(job_of("e", "a", movable=True), 3.0), 3.0)
    for jid in "cd":
        s.finish("a", jid, 4.0)
    out = published(s, s.consolidate(100.0), 100.0)
    assert [(e.node, t) for e, t in out if isinstance(e, Placed)] == [("n1", 100.0)]
    ((end, ended_at), *_) = published(s, s.finish("a", "e", 50.0), 50.0)
    assert isinstance(end, Ended)
    assert ended_at == 100.0


def test_the_floor_survives_the_durable_state() -> None:
    """Restored from the whole snapshot, or from entries kept up to date by the changes the
    shell writes after each batch (the leader's failover), the job's latest placement still
    floors its end."""
    s = Scheduler()
    entries = s.state_entries()
    s.state_changes()
    placed_at = waiting_then_placed(s, "y")
    for k, v in s.state_changes().items():
        if v is None:
            entries.pop(k, None)
        else:
            entries[k] = v
    for r in (Scheduler.from_bytes(s.to_bytes()), Scheduler.from_entries(entries)):
        ((end, ended_at),) = published(r, r.finish("acme", "y", 50.0), 50.0)
        assert isinstance(end, Ended)
        assert ended_at == placed_at


def test_an_end_reported_before_a_mig_placement_is_dated_at_that_placement() -> None:
    """A MIG job waits for its instance (asked at 3 s) and is placed at 100 s, once the GPU
    drained and was repartitioned; an end reported at 50 s is dated at that placement."""
    s = Scheduler()
    h100 = NodeSpec(
        name="h", cpu_milli=32_000, memory_mib=256_000,
        gpus=(GpuSpec(model="H100-80GB", mig_capable=True, mig_enabled=True),),
    )  # fmt: skip
    s.upsert_node(h100, 0.0)
    (small,) = s.submit(JobSpec(job_id="m", tenant="a", cause_id="c-m", mig_profile="3g.40gb"), 1)
    assert isinstance(small, Placed)
    big = JobSpec(job_id="big", tenant="a", cause_id="c-big", mig_profile="7g.80gb")
    ((w, _),) = published(s, s.submit(big, 3.0), 3.0)
    assert isinstance(w, Waiting)
    out = published(s, s.finish("a", "m", 100.0), 100.0)
    assert [(e.kind, t) for e, t in out if isinstance(e, Placed)] == [("mig", 100.0)]
    ((end, ended_at), *_) = published(s, s.finish("a", "big", 50.0), 50.0)
    assert isinstance(end, Ended)
    assert ended_at == 100.0


def test_a_gpu_freed_by_a_late_end_is_taken_no_earlier_than_that_end() -> None:
    """x placed at 100 s on the one GPU, y waiting for it since 30 s; an observer reports x
    ended at 50 s: x's end is dated at its placement (100 s), and y, placed on the GPU x
    freed, no earlier. Before, y was placed at its own floor (50 s): two exclusive allocations
    of one GPU overlapped over [50 s, 100 s), billed twice, y's placement before the release
    that freed its GPU."""
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0.0)
    s.submit(job("h", "acme"), 10.0)
    s.submit(job("x", "acme"), 20.0)
    s.submit(job("y", "acme"), 30.0)
    out = published(s, s.finish("acme", "h", 100.0), 100.0)
    assert [(e.job.job_id, t) for e, t in out if isinstance(e, Placed)] == [("x", 100.0)]
    out = published(s, s.finish("acme", "x", 50.0), 50.0)
    ((end, ended_at),) = [(e, t) for e, t in out if isinstance(e, Ended)]
    ((placed, placed_at),) = [(e, t) for e, t in out if isinstance(e, Placed)]
    assert (placed.job.job_id, placed.node, ended_at) == ("y", "n0", 100.0)
    assert placed_at >= ended_at
    assert end.gpus == (("n0", 0),)  # the GPU it freed


def test_a_preemptor_is_placed_no_earlier_than_the_eviction_that_freed_its_gpu() -> None:
    """A back-dated priority submit (50 s) evicts v, placed at 100 s: the eviction is dated at
    v's placement, and the preemptor's placement on v's GPU no earlier."""
    s = Scheduler()
    waiting_then_placed(s, "v")
    out = published(s, s.submit(job_of("p", "acme", priority=10), 50.0), 50.0)
    ((evicted, evicted_at),) = [(e, t) for e, t in out if isinstance(e, Evicted)]
    placed = [(e.node, t) for e, t in out if isinstance(e, Placed) and e.job.job_id == "p"]
    assert placed
    assert all(t >= evicted_at for n, t in placed if n == evicted.node)


def test_a_release_floors_only_the_placements_of_the_input_that_published_it() -> None:
    """h placed at 60 s and ended at 100 s (an ordinary input); then an observer reports the
    past: z submitted at 50 s, before h's allocation began. z is placed on the node's GPU that
    h never took, at its own 50 s (the past it reports is billed there), not at h's release:
    that release freed nothing for z's input. Before, every later placement on a node was
    floored at its latest release, and a replayed job of the recent past was placed now
    (tests/e2e/test_job_to_cost.py). On a node whose only GPU h held, z is dated at h's end:
    an allocation is open from its date, so z at 50 s would have been billed beside h over
    [60 s, 100 s) (this test asserted that overlap before)."""
    s = Scheduler()
    s.upsert_node(node("n0", 2), 0.0)
    (h,) = [e for e, _ in published(s, s.submit(job("h", "acme"), 60.0), 60.0)]
    assert isinstance(h, Placed)
    out = published(s, s.finish("acme", "h", 100.0), 100.0)
    assert [(type(e).__name__, t) for e, t in out] == [("Ended", 100.0)]
    out = published(s, s.submit(job("z", "acme"), 50.0), 50.0)
    placed = [(e.job.job_id, e.node, e.gpus[0].index, t) for e, t in out if isinstance(e, Placed)]
    assert placed == [("z", "n0", 1 - h.gpus[0].index, 50.0)]

    one = Scheduler()
    one.upsert_node(node("n0", 1), 0.0)
    published(one, one.submit(job("h", "acme"), 60.0), 60.0)
    published(one, one.finish("acme", "h", 100.0), 100.0)
    out = published(one, one.submit(job("z", "acme"), 50.0), 50.0)
    assert [(e.job.job_id, t) for e, t in out if isinstance(e, Placed)] == [("z", 100.0)]
