"""No decision about a job is dated before that job's own trusted submit (the per-job floor,
`Scheduler.decided_at_s`), whatever input caused it: a trusted observer's report keeps its own
time (the past it reports is billed there) but cannot place a job before it was asked for.

On the scheduler before the change, an observer's end dated between the holder's placement
and the waiting job's submit started the waiting job at the report's time (`started_s`, where
consolidation's `max_lost_s` counts from, and the placement's `at`, where billing starts)."""

from __future__ import annotations

from seedance.slicer.core import Ended, GpuSpec, JobSpec, NodeSpec, Placed, Scheduler, Waiting


def node(name: str, gpus: int) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000, gpus=(GpuSpec(model="T4"),) * gpus
    )


def job(jid: str, tenant: str) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=1)


def test_a_back_dated_report_places_the_waiting_job_no_earlier_than_its_submit() -> None:
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0.0)
    (held,) = s.submit(job("holder", "acme"), 10.0)
    assert isinstance(held, Placed)
    (waits,) = s.submit(job("waiting", "globex"), 100.0)
    assert isinstance(waits, Waiting)
    assert s.decided_at_s(waits, 100.0) == 100.0
    # An observer reports acme's job ended at 50 s: after it was placed, before globex asked.
    end, placed = s.finish("acme", "holder", 50.0)
    assert isinstance(end, Ended)
    assert isinstance(placed, Placed)
    assert placed.job.key == "globex/waiting"
    assert s.decided_at_s(end, 50.0) == 50.0  # the observer's past, for what it reports
    assert s.decided_at_s(placed, 50.0) == 100.0  # globex's job: from its own submit
    (run,) = s.snapshot().running
    assert run.started_s == 100.0
    # Later inputs are later than every submit: their own time stands.
    assert s.decided_at_s(placed, 120.0) == 120.0


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
    assert end.submitted_s == 100.0
    assert s.decided_at_s(end, 60.0) == 100.0
    # Another tenant's job of the same id is another job: its floor is its own.
    (other,) = s.submit(job("late", "globex"), 200.0)
    assert s.decided_at_s(other, 150.0) == 200.0
