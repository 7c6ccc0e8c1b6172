"""Every run of a job is closed exactly once, also when an end is dated at the very instant a
later run of the job started: the slicer dates a late end no earlier than the job's latest
placement (its per-job floor), so a moved job's release, or a resumed gang's, lands at that
placement. An end at a run's start ends the run before it while that run is open, else this
one; each part of a gang takes the same end.

On the facts before the change (an end at a non-first allocation's start read only as the
previous run's) the later run, or a gang's second part, stayed open: billed for ever.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from seedance.cost_ledger.core.facts import Facts, GpuAllocation, JobEnded
from seedance.cost_ledger.core.mapping import facts_of
from seedance.events.base import new_event_id
from seedance.events.jobs import JobCancelled
from seedance.slicer.core import GpuSpec, JobSpec, NodeSpec, Scheduler
from seedance.slicer.core.consolidation import DisruptionBudget
from seedance.slicer.core.draining import ConsolidationConfig
from seedance.slicer.core.workload import SchedulerConfig
from seedance.slicer.mapping import published

J = "a/e"


def alloc(eid: str, start_ms: int, node: str = "n1") -> GpuAllocation:
    return GpuAllocation(
        event_id=eid, job_id=J, tenant="a", node=node, gpu_model="T4", gpu_indices=(0,),
        start_ms=start_ms,
    )  # fmt: skip


def end(eid: str, end_ms: int) -> JobEnded:
    return JobEnded(event_id=eid, job_id=J, end_ms=end_ms)


def apply_all(f: Facts, facts: list[GpuAllocation | JobEnded]) -> None:
    for x in facts:
        if isinstance(x, GpuAllocation):
            f.add_allocation(x)
        else:
            f.add_end(x)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    ("move_id", "release_id"), [("p-move", "r-release"), ("z-move", "b-release")]
)
def test_a_moved_jobs_release_at_the_move_closes_the_new_run(
    move_id: str, release_id: str, reverse: bool
) -> None:
    """Placed at 3 s, moved at 100 s (ended there, placed again there); its release, reported
    late, is dated at the move: both runs close, at 100 s, whatever the ids or order."""
    facts = [
        alloc("old", 3_000, "n2"), end(move_id, 100_000), alloc("new", 100_000, "n1"),
        end(release_id, 100_000),
    ]  # fmt: skip
    f = Facts()
    apply_all(f, list(reversed(facts)) if reverse else facts)
    assert {a: e.end_ms for a, e in f.alloc_end.items()} == {"old": 100_000, "new": 100_000}
    assert {f.alloc_end["old"].event_id, f.alloc_end["new"].event_id} == {move_id, release_id}
    assert J in f.job_end


def test_the_move_alone_leaves_the_new_run_open() -> None:
    f = Facts()
    apply_all(f, [alloc("old", 3_000, "n2"), end("move", 100_000), alloc("new", 100_000)])
    assert f.alloc_end["old"].event_id == "move"
    assert "new" not in f.alloc_end  # running on n1 until its own end
    assert J not in f.job_end


def test_a_resumed_single_job_ended_at_its_resume_closes_the_resumed_run() -> None:
    f = Facts()
    apply_all(f, [alloc("p1", 0), end("preempt", 40_000), alloc("p2", 100_000),
                  end("release", 100_000)])  # fmt: skip
    assert f.alloc_end["p2"].event_id == "release"


def test_a_resumed_gang_ended_at_its_resume_closes_every_part() -> None:
    f = Facts()
    apply_all(f, [
        alloc("a1", 0, "n1"), alloc("b1", 0, "n2"), end("preempt", 40_000),
        alloc("a2", 100_000, "n1"), alloc("b2", 100_000, "n2"), end("release", 100_000),
    ])  # fmt: skip
    assert {a: e.event_id for a, e in f.alloc_end.items()} == {
        "a1": "preempt",
        "b1": "preempt",
        "a2": "release",
        "b2": "release",
    }


# --- end to end: the slicer's decisions as published, read by the ledger -----------------


def publish(s: Scheduler, f: Facts, effects: list[object], now_s: float) -> None:
    """Each decision as the decider publishes it (dated ``publish_at_s``), into ``f``."""
    for e in effects:
        at_s = s.publish_at_s(e, now_s)  # type: ignore[arg-type]
        cause = JobCancelled(
            id=new_event_id(int(now_s * 1000)), at=datetime.fromtimestamp(now_s, UTC),
            job_id="x", tenant="a",
        )  # fmt: skip
        _, ev, _ = published(  # type: ignore[arg-type]
            e, cause, datetime.fromtimestamp(at_s, UTC), pool="p", policy="x", key=None
        )
        for fact in facts_of(ev, int(at_s * 1000), frozenset(), {})[0]:
            if isinstance(fact, (GpuAllocation, JobEnded)):
                apply_all(f, [fact])


def t4_node(name: str, gpus: int) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000, gpus=(GpuSpec(model="T4"),) * gpus
    )


def test_a_moved_job_ended_late_is_closed_end_to_end() -> None:
    s = Scheduler(SchedulerConfig(consolidation=ConsolidationConfig(
        interval_s=60.0, hold_s=600.0, budget=DisruptionBudget(min_per_window=4))))  # fmt: skip
    f = Facts()
    publish(s, f, s.upsert_node(t4_node("n1", 4), 0.0), 0.0)
    for jid in "abcd":
        spec = JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", gpus=1)
        publish(s, f, s.submit(spec, 1.0), 1.0)
    publish(s, f, s.upsert_node(t4_node("n2", 4), 2.0), 2.0)
    spec = JobSpec(job_id="e", tenant="a", cause_id="c-e", gpus=1, movable=True)
    publish(s, f, s.submit(spec, 3.0), 3.0)
    for jid in "cd":
        publish(s, f, s.finish("a", jid, 4.0), 4.0)
    publish(s, f, s.consolidate(100.0), 100.0)
    assert len(f.job_allocs[J]) == 2  # moved
    publish(s, f, s.finish("a", "e", 50.0), 50.0)  # a trusted observer's end, reported late
    assert set(f.job_allocs[J]) <= f.alloc_end.keys()
    assert J in f.job_end


def test_a_resumed_gang_ended_late_is_closed_end_to_end() -> None:
    s = Scheduler()
    f = Facts()
    publish(s, f, s.upsert_node(t4_node("n1", 1), 0.0), 0.0)
    publish(s, f, s.upsert_node(t4_node("n2", 1), 0.0), 0.0)
    gang = JobSpec(job_id="g", tenant="a", cause_id="c-g", gpus=1, gang_size=2)
    publish(s, f, s.submit(gang, 1.0), 1.0)
    urgent = JobSpec(job_id="p", tenant="a", cause_id="c-p", gpus=1, priority=10)
    publish(s, f, s.submit(urgent, 10.0), 10.0)  # preempts the gang
    publish(s, f, s.finish("a", "p", 100.0), 100.0)  # the gang placed again
    assert len(f.job_allocs["a/g"]) == 4
    publish(s, f, s.finish("a", "g", 50.0), 50.0)  # reported late: dated at the resume
    assert set(f.job_allocs["a/g"]) <= f.alloc_end.keys()
