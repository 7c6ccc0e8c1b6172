"""What the slicer publishes about one placement, followed into the cost ledger (the slicer's
mapping, then the ledger's `facts_of` and `Facts`): the harm of a wrong date or share is a
wrong bill, so these tests read the bill.

* One date per placement: a gang's parts are dated at the highest floor over all its parts'
  GPUs (`SchedulerState.publish_at_s`, `Placed.placement`). The ledger takes a gang's parts to
  start at one instant and ends them together; before, a part on a GPU the same input's
  release freed was dated at that release and the other part at the input's own time, and
  after the gang's end the later part stayed open: billed for ever.
* The share published is the one the queue holds: a right-sized shared job preempted and
  placed again was published at the share it was submitted with (`Placed` built from the
  `JobSpec`) while the queue held the smaller one, and a second job placed in the room between
  them: more than one GPU billed on one GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import msgspec
import pytest

from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded
from seedance.cost_ledger.core.mapping import facts_of
from seedance.events.base import new_event_id
from seedance.events.jobs import JobCancelled
from seedance.slicer.core import Effect, GpuSpec, JobSpec, NodeSpec, Placed, Scheduler
from seedance.slicer.core.resize import ShareChange
from seedance.slicer.mapping import published
from tests.unit.slicer.nodes import node_spec as node


def bill(s: Scheduler, ledger: Facts, effects: list[Effect], now_s: float) -> list[Placed]:
    """Publish `effects` (caused by an input at `now_s`) as the decider does, into `ledger`."""
    placed = []
    for e in effects:
        at_s = s.publish_at_s(e, now_s)
        cause = JobCancelled(
            id=new_event_id(int(now_s * 1000)),
            at=datetime.fromtimestamp(now_s, UTC),
            job_id="cause",
            tenant="a",
        )
        _, ev, _ = published(
            e, cause, datetime.fromtimestamp(at_s, UTC), pool="p", policy="seedance", key=None
        )
        for fact in facts_of(ev, int(at_s * 1000), frozenset(), {})[0]:
            if isinstance(fact, GpuAllocation):
                ledger.add_allocation(fact)
            elif isinstance(fact, JobEnded):
                ledger.add_end(fact)
        placed += [e] if isinstance(e, Placed) else []
    return placed


def gang_bill(ledger: Facts, key: str) -> list[tuple[str, int, int | None]]:
    """(node, start ms, end ms or None while open) of each of the job's allocations."""
    allocs = [ledger.allocations[a] for a in ledger.job_allocs[key]]
    ends = {a: ledger.alloc_end[a].end_ms for a in ledger.job_allocs[key] if a in ledger.alloc_end}
    return sorted((x.node, x.start_ms, ends.get(x.event_id)) for x in allocs)


def test_a_gang_freed_by_a_late_report_starts_and_ends_at_one_instant() -> None:
    """x (20 CPUs) waits from 10 s, placed on n1 when it comes (100 s); the gang g (two GPUs,
    one per node) is submitted at 60 s and waits for n1's CPUs. An observer reports x ended
    at 50 s: x's end is dated at its placement (100 s), g's part on n1 (the GPU x freed) no
    earlier, and so its part on n0 too. Before: n0's part at 60 s, n1's at 100 s, and after
    g's end at 200 s the n1 part was never closed (`[..., ('n1', 100000, None)]`)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n9", 0, 1_000), 0.0), 0.0)
    x = JobSpec(job_id="x", tenant="a", cause_id="c-x", gpus=1, cpu_milli=20_000)
    bill(s, ledger, s.submit(x, 10.0), 10.0)
    up = s.upsert_node(node("n0", 1, 8_000), 100.0) + s.upsert_node(node("n1", 1, 32_000), 100.0)
    bill(s, ledger, up, 100.0)
    g = JobSpec(job_id="g", tenant="a", cause_id="c-g", gpus=1, gang_size=2)
    assert bill(s, ledger, s.submit(g, 60.0), 60.0) == []  # n1's CPUs are x's
    parts = bill(s, ledger, s.finish("a", "x", 50.0), 50.0)
    assert sorted((p.node, p.part) for p in parts) == [("n0", 0), ("n1", 1)]
    bill(s, ledger, s.finish("a", "g", 200.0), 200.0)
    assert gang_bill(ledger, "a/g") == [("n0", 100_000, 200_000), ("n1", 100_000, 200_000)]
    assert "a/g" in ledger.job_end


def test_a_back_dated_gang_preemptor_starts_and_ends_at_one_instant() -> None:
    """v holds the GPU of `held` from 100 s; a gang p of higher priority, submitted at 60 s (a
    report of the past), evicts it: the eviction is dated at v's placement (100 s), p's part on
    v's GPU no earlier, and its part on `free` with it. Before: `free` at 60 s, `held` at
    100 s, the `held` part open after p's end at 200 s."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n9", 0, 1_000), 0.0), 0.0)
    v = JobSpec(job_id="v", tenant="a", cause_id="c-v", gpus=1, cpu_milli=20_000)
    bill(s, ledger, s.submit(v, 20.0), 20.0)
    up = s.upsert_node(node("free", 1, 8_000), 100.0)
    up += s.upsert_node(node("held", 1, 32_000), 100.0)
    bill(s, ledger, up, 100.0)
    p = JobSpec(job_id="p", tenant="a", cause_id="c-p", gpus=1, gang_size=2, priority=10)
    bill(s, ledger, s.submit(p, 60.0), 60.0)
    bill(s, ledger, s.finish("a", "p", 200.0), 200.0)
    assert gang_bill(ledger, "a/p") == [("free", 100_000, 200_000), ("held", 100_000, 200_000)]


RESTARTS: dict[str, Callable[[Scheduler], Scheduler]] = {
    "live": lambda s: s,
    "snapshot": lambda s: Scheduler.from_bytes(s.to_bytes()),
    "entries": lambda s: Scheduler.from_entries(s.state_entries()),
}


@pytest.mark.parametrize("restart", RESTARTS)
def test_a_right_sized_share_placed_again_is_billed_at_the_share_the_queue_holds(
    restart: str,
) -> None:
    """a (700 milli) is right-sized to 200, preempted by a whole-GPU job, and placed again
    when that ends, with b (500 milli) beside it, restarted or not while a waits. Before, a
    was published (and billed) at 700: 1,200 milli billed on one GPU; and a restart queued it
    again at 700 (the pending record kept no share), so b no longer fit beside it."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1, 32_000), 0.0), 0.0)
    a = JobSpec(job_id="a", tenant="t", cause_id="c-a", gpus=1, gpu_milli=700)
    bill(s, ledger, s.submit(a, 1.0), 1.0)
    change = ShareChange(
        tenant="t", job_id="a", node="n0", gpu=0, from_milli=700, to_milli=200, reason="rightsized"
    )
    bill(s, ledger, s.resize_share(change, 2.0), 2.0)
    hi = JobSpec(job_id="hi", tenant="t", cause_id="c-hi", gpus=1, priority=10)
    bill(s, ledger, s.submit(hi, 3.0), 3.0)
    b = JobSpec(job_id="b", tenant="t", cause_id="c-b", gpus=1, gpu_milli=500)
    bill(s, ledger, s.submit(b, 4.0), 4.0)
    s = RESTARTS[restart](s)
    placed = bill(s, ledger, s.finish("t", "hi", 5.0), 5.0)
    assert sorted((p.job.job_id, p.gpus[0].milli) for p in placed) == [("a", 200), ("b", 500)]
    on_gpu = [
        x.gpu_milli for x in ledger.allocations.values()
        if x.start_ms == 5_000 and x.gpu_indices == (0,)
    ]  # fmt: skip
    assert sorted(on_gpu) == [200, 500]


def spans_on(ledger: Facts, node_name: str, gpu: int) -> list[tuple[str, int, int | None]]:
    """(job, start ms, end ms or None while open) of the allocations billed on one GPU."""
    return sorted(
        (x.job_id, x.start_ms, ledger.alloc_end[a].end_ms if a in ledger.alloc_end else None)
        for a, x in ledger.allocations.items()
        if x.node == node_name and gpu in x.gpu_indices
    )


@pytest.mark.parametrize("restart", RESTARTS)
def test_a_report_of_the_past_is_not_placed_inside_an_allocation_an_earlier_input_released(
    restart: str,
) -> None:
    """x held n0's one GPU over [100 s, 150 s) as published (a tenant's submit and end; n1
    cordoned); then a trusted observer reports w submitted at 120 s, restarted or not in
    between: w is dated at x's end, not inside x's allocation. Before, w was dated 120 s and
    the ledger billed x and w on one GPU over [120 s, 150 s). Once n1 is open, a report of
    50 s (z) keeps its time on n1, whose GPU no allocation held: the past it reports is billed
    there (tests/e2e/test_job_to_cost.py). The next report of 50 s (v) fits only n0: it is
    dated at the latest end there (w's 300 s, not x's 150 s). Before, z was placed on n0 at
    50 s, open from then: billed beside x and w (this test asserted that overlap)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1, 32_000), 0.0), 0.0)
    n1 = NodeSpec(name="n1", cpu_milli=32_000, memory_mib=256_000, gpus=(GpuSpec(model="T4"),))
    bill(s, ledger, s.upsert_node(msgspec.structs.replace(n1, state="cordoned"), 0.0), 0.0)
    x = JobSpec(job_id="x", tenant="a", cause_id="c-x", gpus=1)
    bill(s, ledger, s.submit(x, 100.0), 100.0)
    bill(s, ledger, s.finish("a", "x", 150.0), 150.0)
    s = RESTARTS[restart](s)
    w = JobSpec(job_id="w", tenant="a", cause_id="c-w", gpus=1)
    bill(s, ledger, s.submit(w, 120.0), 120.0)
    bill(s, ledger, s.finish("a", "w", 300.0), 300.0)
    assert spans_on(ledger, "n0", 0) == [("a/w", 150_000, 300_000), ("a/x", 100_000, 150_000)]
    bill(s, ledger, s.upsert_node(n1, 300.0), 300.0)
    s = RESTARTS[restart](s)
    z = JobSpec(job_id="z", tenant="a", cause_id="c-z", gpus=1)
    assert [(p.job.job_id, p.node) for p in bill(s, ledger, s.submit(z, 50.0), 50.0)] == [
        ("z", "n1")
    ]
    assert spans_on(ledger, "n1", 0) == [("a/z", 50_000, None)]
    v = JobSpec(job_id="v", tenant="a", cause_id="c-v", gpus=1)
    assert [p.job.job_id for p in bill(s, ledger, s.submit(v, 50.0), 50.0)] == ["v"]
    assert spans_on(ledger, "n0", 0) == [
        ("a/v", 300_000, None), ("a/w", 150_000, 300_000), ("a/x", 100_000, 150_000)
    ]  # fmt: skip


@pytest.mark.parametrize("restart", RESTARTS)
def test_a_report_of_the_past_is_dated_after_every_allocation_released_on_its_gpu(
    restart: str,
) -> None:
    """x held the one GPU over [100 s, 150 s), then y over [160 s, 200 s); a report of w at
    120 s (restarted or not in between) is dated at 200 s, the latest end on the GPU. Before,
    only the last released span (y's) was kept: w at 120 s was before it, kept its time and
    was billed beside x over [120 s, 150 s) and beside y over [160 s, 200 s)."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 1, 32_000), 0.0), 0.0)
    for jid, start, end in (("x", 100.0, 150.0), ("y", 160.0, 200.0)):
        bill(
            s,
            ledger,
            s.submit(JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", gpus=1), start),
            start,
        )
        bill(s, ledger, s.finish("a", jid, end), end)
    s = RESTARTS[restart](s)
    w = JobSpec(job_id="w", tenant="a", cause_id="c-w", gpus=1)
    assert [p.job.job_id for p in bill(s, ledger, s.submit(w, 120.0), 120.0)] == ["w"]
    assert spans_on(ledger, "n0", 0) == [
        ("a/w", 200_000, None), ("a/x", 100_000, 150_000), ("a/y", 160_000, 200_000)
    ]  # fmt: skip


def test_the_preference_for_gpus_free_at_the_reported_time_evicts_nothing() -> None:
    """n0's GPU 0 was released at 150 s; low (priority 0) holds GPU 1. A report of hi
    (priority 10) at 120 s does not evict low to keep its date on GPU 1: it takes GPU 0 at
    150 s."""
    s, ledger = Scheduler(), Facts()
    bill(s, ledger, s.upsert_node(node("n0", 2, 32_000), 0.0), 0.0)
    x = JobSpec(job_id="x", tenant="a", cause_id="c-x", gpus=1)
    (px,) = bill(s, ledger, s.submit(x, 100.0), 100.0)
    low = JobSpec(job_id="low", tenant="a", cause_id="c-low", gpus=1)
    bill(s, ledger, s.submit(low, 110.0), 110.0)
    bill(s, ledger, s.finish("a", "x", 150.0), 150.0)
    hi = JobSpec(job_id="hi", tenant="a", cause_id="c-hi", gpus=1, priority=10)
    out = s.submit(hi, 120.0)
    assert [type(e).__name__ for e in out] == ["Placed"]
    (p,) = bill(s, ledger, out, 120.0)
    assert (p.job.job_id, p.gpus[0].index) == ("hi", px.gpus[0].index)
    assert spans_on(ledger, "n0", px.gpus[0].index)[0] == ("a/hi", 150_000, None)


def test_a_state_written_before_the_released_spans_were_kept_loads() -> None:
    """A snapshot without `released`, and node entries of two fields (index, spec), as written
    before: they load, with no span kept."""
    s = Scheduler()
    s.upsert_node(node("n0", 1, 32_000), 0.0)
    s.submit(JobSpec(job_id="x", tenant="a", cause_id="c-x", gpus=1), 100.0)
    s.publish_at_s(s.finish("a", "x", 150.0)[0], 150.0)
    assert s.snapshot().released == (("n0", 0, 100.0, 150.0),)
    old = msgspec.to_builtins(s.snapshot())
    del old["released"]
    assert Scheduler.from_bytes(msgspec.msgpack.encode(old)).snapshot().released == ()
    entries = s.state_entries()
    entries["n/n0"] = msgspec.msgpack.encode((0, msgspec.to_builtins(s.snapshot().nodes[0])))
    assert Scheduler.from_entries(entries).snapshot().nodes == s.snapshot().nodes
    assert Scheduler.from_entries(entries).snapshot().released == ()
