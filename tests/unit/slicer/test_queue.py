from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core.model import Node, PodRequest
from seedance.slicer.core.policies import FirstFit, SeedancePolicy
from seedance.slicer.core.queue import (
    Job,
    JobPlaced,
    JobPreempted,
    JobUnschedulable,
    PlacementQueue,
    QueueConfig,
)


def node(name: str, gpus: int = 1, cpu: int = 32_000) -> Node:
    return Node(name=name, cpu_milli=cpu, memory_mib=64_000, gpu_count=gpus, gpu_model="G2")


def gpu_job(jid: str, k: int = 1, prio: int = 0, replicas: int = 1) -> Job:
    req = PodRequest(cpu_milli=1000, memory_mib=1000, num_gpu=k, gpu_milli=1000)
    return Job(job_id=jid, request=req, priority=prio, replicas=replicas)


def cpu_job(jid: str) -> Job:
    return Job(job_id=jid, request=PodRequest(cpu_milli=1000, memory_mib=1000))


def placed(decisions: list) -> list[str]:
    return [d.job_id for d in decisions if isinstance(d, JobPlaced)]


def test_fifo_blocks_behind_the_head_and_backfill_does_not() -> None:
    for backfill, expect in ((False, []), (True, ["c"])):
        s = PlacementQueue([node("n")], FirstFit(), QueueConfig(backfill=backfill))
        s.submit(gpu_job("a"), 0.0)
        assert placed(s.schedule(0.0)) == ["a"]
        s.submit(gpu_job("b"), 1.0)
        s.submit(cpu_job("c"), 2.0)
        assert placed(s.schedule(2.0)) == expect
        s.finish("a", 10.0)
        out = s.schedule(10.0)
        assert "b" in placed(out)
        d = next(d for d in out if isinstance(d, JobPlaced) and d.job_id == "b")
        assert d.waited_s == 9.0


def test_unschedulable_reason_is_published_once() -> None:
    s = PlacementQueue([node("n")], FirstFit())
    s.submit(gpu_job("big", k=2), 0.0)
    first = s.schedule(0.0)
    assert first == [JobUnschedulable("big", "insufficient_gpu", 0.0)]
    assert s.schedule(5.0) == []
    assert s.pending_ids == ["big"]


def test_gang_is_all_or_nothing_across_nodes() -> None:
    s = PlacementQueue([node("x"), node("y")], FirstFit())
    s.submit(gpu_job("solo"), 0.0)
    s.schedule(0.0)
    s.submit(gpu_job("gang", replicas=2), 1.0)
    out = s.schedule(1.0)
    assert placed(out) == []
    assert s.state.gpu_allocated_milli == 1000  # the failed replica was rolled back
    assert any(isinstance(d, JobUnschedulable) and d.reason.startswith("gang_") for d in out)
    s.finish("solo", 2.0)
    assert placed(s.schedule(2.0)) == ["gang"]
    assert sorted(p.node for p in s.placements_of("gang")) == [0, 1]


def test_reservation_stops_small_jobs_from_starving_a_large_one() -> None:
    cfg = QueueConfig(reserve_after_s=60.0, max_reserved_nodes=1, preemption=False)
    s = PlacementQueue([node("a", gpus=2), node("b", gpus=2)], FirstFit(), cfg)
    s.submit(gpu_job("s1"), 0.0)
    s.submit(gpu_job("s2"), 0.0)
    s.schedule(0.0)  # one GPU used on each node? first-fit puts both on a
    s.submit(gpu_job("s3"), 0.0)
    s.schedule(0.0)
    s.submit(gpu_job("big", k=2), 1.0)
    assert placed(s.schedule(1.0)) == []
    s.schedule(100.0)  # blocked > 60 s: a node is reserved for it
    reserved = [n for n in range(2) if s.reservations.holders[n] >= 0]
    assert len(reserved) == 1
    # Small jobs keep coming; none may land on the reserved node.
    for i, t in enumerate((101.0, 102.0)):
        for jid in list(s.running_ids):
            if jid.startswith("s") and s.placements_of(jid)[0].node == reserved[0]:
                s.finish(jid, t)
        s.submit(gpu_job(f"late{i}"), t)
        for d in s.schedule(t):
            if isinstance(d, JobPlaced) and d.job_id.startswith("late"):
                assert d.placements[0].node != reserved[0]
    assert "big" in s.running_ids
    assert s.placements_of("big")[0].node == reserved[0]


def test_higher_priority_preempts_the_lowest_and_victim_requeues() -> None:
    s = PlacementQueue([node("n", gpus=2)], FirstFit())
    s.submit(gpu_job("low", prio=0), 0.0)
    s.submit(gpu_job("mid", prio=5), 0.0)
    s.schedule(0.0)
    s.submit(gpu_job("high", prio=10), 1.0)
    out = s.schedule(1.0)
    # mid (the higher priority, placed first) took GPU 0: low freed GPU 1, which high takes.
    assert JobPreempted("low", "high", 1.0, node=0, gpus=((0, 1),)) in out
    assert "high" in placed(out)
    assert "mid" in s.running_ids
    assert s.pending_ids == ["low"]
    # Equal priority never preempts: "mid" (5) stays when a second 5 arrives.
    s.submit(gpu_job("peer", prio=5), 2.0)
    assert not any(isinstance(d, JobPreempted) for d in s.schedule(2.0))


def test_finish_is_idempotent_and_cancels_pending() -> None:
    s = PlacementQueue([node("n")], FirstFit())
    s.submit(gpu_job("a"), 0.0)
    s.submit(gpu_job("b"), 0.0)
    s.schedule(0.0)
    s.finish("b", 1.0)  # cancel while waiting
    assert s.pending_ids == []
    s.finish("a", 2.0)
    s.finish("a", 2.0)
    assert s.state.gpu_allocated_milli == 0
    s.submit(gpu_job("c"), 3.0)
    with pytest.raises(ValueError, match="already known"):
        s.submit(gpu_job("c"), 3.0)


def test_random_churn_keeps_the_books_straight_with_the_seedance_policy() -> None:
    rng = np.random.default_rng(3)
    kinds = [
        PodRequest(cpu_milli=2000, memory_mib=1000, num_gpu=1, gpu_milli=300),
        PodRequest(cpu_milli=4000, memory_mib=1000, num_gpu=1, gpu_milli=810),
        PodRequest(cpu_milli=8000, memory_mib=1000, num_gpu=2, gpu_milli=1000),
        PodRequest(cpu_milli=6000, memory_mib=1000),
    ]
    nodes = [node(f"n{i}", gpus=4) for i in range(4)]
    s = PlacementQueue(nodes, SeedancePolicy.for_trace(kinds), QueueConfig(reserve_after_s=5.0))
    jobs: dict[str, Job] = {}
    for t in range(300):
        if rng.random() < 0.6:
            jid = f"j{t}"
            jobs[jid] = Job(
                job_id=jid,
                request=kinds[int(rng.integers(len(kinds)))],
                priority=int(rng.integers(3)),
            )
            s.submit(jobs[jid], float(t))
        elif s.running_ids:
            s.finish(s.running_ids[int(rng.integers(len(s.running_ids)))], float(t))
        s.schedule(float(t))
        running = s.running_ids
        want = sum(jobs[j].request.gpu_milli_total * jobs[j].replicas for j in running)
        assert s.state.gpu_allocated_milli == want
        assert int(s.state.cpu_free.sum()) == sum(n.cpu_milli for n in nodes) - sum(
            jobs[j].request.cpu_milli for j in running
        )
        assert set(running).isdisjoint(s.pending_ids)
