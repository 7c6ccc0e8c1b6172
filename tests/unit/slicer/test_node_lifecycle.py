"""Nodes come and go in the slicer's scheduler: a cordoned node gets nothing new and keeps what
runs there; a removed node's jobs are evicted (reason `node_removed`) and queued again at their
original place; a node of the same name comes back; all of it survives a snapshot."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from seedance.slicer.core import Evicted, GpuSpec, JobSpec, NodeSpec, Placed, Scheduler, Waiting
from seedance.slicer.core.scheduler import NODE_REMOVED


def node(name: str, gpus: int = 2, state: str = "ready") -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=32_000,
        memory_mib=256_000,
        gpus=tuple(GpuSpec(model="T4") for _ in range(gpus)),
        state=state,
    )


def job(jid: str, tenant: str = "a", gpus: int = 1) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, cause_id=f"c-{jid}", gpus=gpus)


def placed_on(effects: Sequence[object]) -> dict[str, str]:
    return {e.job.job_id: e.node for e in effects if isinstance(e, Placed)}


def test_a_cordoned_node_gets_nothing_new_and_keeps_what_runs() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    assert placed_on(s.submit(job("j1"), 1.0)) == {"j1": "n1"}
    # Cordoned while busy: the shape is kept, nothing is evicted.
    assert s.upsert_node(node("n1", state="cordoned"), 2.0) == []
    assert s.running_jobs == [("a", "j1")]
    out = s.submit(job("j2"), 3.0)
    assert placed_on(out) == {}
    assert any(isinstance(e, Waiting) for e in out)
    # Another node joins: the waiting job goes there, not to the cordoned node's free GPU.
    assert placed_on(s.upsert_node(node("n2"), 4.0)) == {"j2": "n2"}
    # Made ready again: its free GPU takes the next job.
    s.upsert_node(node("n2", state="cordoned"), 5.0)
    assert placed_on(s.upsert_node(node("n1"), 6.0)) == {}
    assert placed_on(s.submit(job("j3"), 7.0)) == {"j3": "n1"}


def test_a_removed_node_s_jobs_are_evicted_and_queued_again_in_their_place() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    s.submit(job("old"), 1.0)
    s.submit(job("older", tenant="b"), 1.5)
    assert sorted(s.running_jobs) == [("a", "old"), ("b", "older")]
    s.submit(job("late"), 2.0)  # waits: n1 is full
    out = s.upsert_node(node("n1", state="removed"), 10.0)
    evicted = [e for e in out if isinstance(e, Evicted)]
    assert sorted((e.job.job_id, e.reason, e.node) for e in evicted) == [
        ("old", NODE_REMOVED, "n1"),
        ("older", NODE_REMOVED, "n1"),
    ]
    assert s.running_jobs == []
    # A node joins with room for two: the evicted jobs (submitted first) go before `late`.
    out = s.upsert_node(node("n2"), 20.0)
    assert placed_on(out) == {"old": "n2", "older": "n2"}
    assert [e.attempt for e in out if isinstance(e, Placed)] == [2, 2]
    # Removing it again is answered once; a node that never was is ignored.
    assert s.upsert_node(node("n1", state="removed"), 21.0) == []
    assert s.upsert_node(node("ghost", state="removed"), 21.0) == []


def test_a_removed_node_comes_back_under_its_name() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    s.upsert_node(node("n1", state="removed"), 1.0)
    assert placed_on(s.submit(job("j"), 2.0)) == {}
    assert placed_on(s.upsert_node(node("n1", gpus=4), 3.0)) == {"j": "n1"}
    assert s.node_names == ["n1"]


def test_node_states_survive_a_snapshot() -> None:
    s = Scheduler()
    s.upsert_node(node("n1"), 0.0)
    s.upsert_node(node("n2"), 0.0)
    s.submit(job("j1"), 1.0)
    s.upsert_node(node("n1", state="cordoned"), 2.0)
    s.upsert_node(node("n2", state="removed"), 3.0)
    back = Scheduler.from_bytes(s.to_bytes())
    assert msgspec.json.encode(back.snapshot()) == msgspec.json.encode(s.snapshot())
    # The restored scheduler still keeps the cordoned node closed and the removed one empty.
    assert placed_on(back.submit(job("j2"), 4.0)) == {}
    assert placed_on(back.upsert_node(node("n1"), 5.0)) == {"j2": "n1"}


def mig_node(name: str, state: str = "ready") -> NodeSpec:
    gpu = GpuSpec(model="NVIDIA A100-SXM4-80GB", mig_capable=True, mig_enabled=True)
    return NodeSpec(name=name, cpu_milli=32_000, memory_mib=256_000, gpus=(gpu,), state=state)


def mig_job(jid: str) -> JobSpec:
    return JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", mig=True, mig_profile="1g.10gb")


def test_a_cordoned_node_gets_no_new_mig_instance_either() -> None:
    """The MIG pool chose among every node's MIG GPUs, cordoned ones included: a MIG job
    landed on a node the bridge had cordoned (draining, NotReady, about to be deleted)."""
    s = Scheduler()
    s.upsert_node(mig_node("n1", state="cordoned"), 0.0)
    out = s.submit(mig_job("m1"), 1.0)
    assert placed_on(out) == {}
    assert any(isinstance(e, Waiting) for e in out)  # it waits: the profile is known
    assert placed_on(s.upsert_node(mig_node("n2"), 2.0)) == {"m1": "n2"}
    # Made ready again: the cordoned node takes the next one.
    s.upsert_node(mig_node("n2", state="cordoned"), 3.0)
    s.upsert_node(mig_node("n1"), 4.0)
    assert placed_on(s.submit(mig_job("m2"), 5.0)) == {"m2": "n1"}
