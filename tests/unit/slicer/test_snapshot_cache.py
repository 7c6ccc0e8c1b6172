"""The scheduler keeps each running job's saved record between snapshots; what it writes must
equal a snapshot computed afresh, through placements, ends, preemptions and node changes."""

from __future__ import annotations

import random

from seedance.slicer.core import Evicted, GpuSpec, JobSpec, NodeSpec, Scheduler, SchedulerConfig
from seedance.slicer.core.snapshot import saved_pending, saved_running


def node(name: str, gpus: int, cpu_milli: int = 32_000) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=256_000,
        gpus=tuple(GpuSpec(model="T4") for _ in range(gpus)),
    )


def fresh(s: Scheduler) -> object:
    """`s.snapshot()` with every record built now, from the queue's records and nothing kept."""
    names = s.node_names
    q = s._queue
    running = tuple(saved_running(r, names) for r in q.running_records())
    pending = tuple(saved_pending(p, names) for p in q.pending_records())
    return (running, pending)


def test_the_kept_running_records_equal_a_fresh_snapshot_at_every_step() -> None:
    rng = random.Random(11)
    cfg = SchedulerConfig(workload_refresh=5)
    s = Scheduler(cfg)
    for i in range(3):
        s.upsert_node(node(f"n{i}", rng.choice([2, 4])), 0)
    active: list[str] = []
    evictions = ends = node_changes = 0
    for step_i in range(400):
        step = float(step_i)
        roll = rng.random()
        if roll < 0.05:
            # A new node, or an idle one reshaped in place (a busy one keeps its shape).
            name = f"n{rng.randrange(6)}"
            s.upsert_node(node(name, rng.choice([2, 4, 8]), rng.choice([16_000, 32_000])), step)
            node_changes += 1
        elif active and roll < 0.45:
            jid = active.pop(rng.randrange(len(active)))
            s.finish("a", jid, step)
            ends += 1
        else:
            jid = f"j{step_i}"
            active.append(jid)
            gpus = rng.choice([1, 1, 2, 4])
            spec = JobSpec(
                job_id=jid,
                tenant="a",
                cause_id=f"c-{jid}",
                priority=rng.choice([0, 0, 0, 5, 9]),
                gpus=gpus,
                gpu_milli=rng.choice([250, 500, 1000]) if gpus == 1 else 1000,
                cpu_milli=rng.choice([0, 2000, 8000]),
            )
            out = s.submit(spec, step)
            evictions += sum(isinstance(e, Evicted) for e in out)
        snap = s.snapshot()
        assert (snap.running, snap.pending) == fresh(s), f"step {step}"
        again = Scheduler.from_bytes(s.to_bytes(), cfg)
        assert again.snapshot() == snap, f"step {step}"
    # The stream really did each thing the kept records must survive.
    assert evictions > 0
    assert ends > 0
    assert node_changes > 0
    assert len(s.snapshot().running) > 0


def test_a_preempted_and_replaced_job_is_saved_with_its_new_placement() -> None:
    s = Scheduler()
    s.upsert_node(node("n0", 1), 0)
    s.submit(JobSpec(job_id="low", tenant="a", gpus=1), 1)
    (before,) = s.snapshot().running
    assert before.job_id == "a/low"
    assert before.started_s == 1
    out = s.submit(JobSpec(job_id="top", tenant="a", gpus=1, priority=5), 2)
    assert any(isinstance(e, Evicted) for e in out)
    s.finish("a", "top", 3)
    (after,) = s.snapshot().running
    assert after.job_id == "a/low"
    assert after.started_s == 3
    assert (s.snapshot().running, s.snapshot().pending) == fresh(s)
