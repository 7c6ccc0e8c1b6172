"""The queue's reservations (`core.reservation.Reservations`): the kept count of reserved nodes
is what a count over the fleet gives, and agrees with the waiting jobs' records, under every
input that makes, drops or carries a reservation (review finding 7)."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core.model import Node, PodRequest
from seedance.slicer.core.policies import FirstFit, SeedancePolicy
from seedance.slicer.core.queue import Job, JobPreempted, PlacementQueue, QueueConfig

KINDS = [
    PodRequest(cpu_milli=2000, memory_mib=1000, num_gpu=1, gpu_milli=400),
    PodRequest(cpu_milli=4000, memory_mib=1000, num_gpu=1, gpu_milli=1000),
    PodRequest(cpu_milli=8000, memory_mib=1000, num_gpu=2, gpu_milli=1000),
    PodRequest(cpu_milli=16000, memory_mib=1000, num_gpu=4, gpu_milli=1000),
    PodRequest(cpu_milli=30000, memory_mib=1000),
]


def node(name: str, gpus: int) -> Node:
    return Node(name=name, cpu_milli=32_000, memory_mib=64_000, gpu_count=gpus, gpu_model="G2")


def assert_count_kept(q: PlacementQueue) -> int:
    """The kept count against a pass over the fleet and against the waiting jobs' records."""
    res = q.reservations
    assert len(res.holders) == len(q.state)
    assert res.count == int((res.holders >= 0).sum())
    records = q.pending_records()
    reserved = [n for rec in records for n in rec.reserved]
    assert len(reserved) == len(set(reserved)) == res.count
    for rec in records:
        assert all(res.holders[n] == rec.seq for n in rec.reserved), rec.job.job_id
    return res.count


@pytest.mark.parametrize(("seed", "policy"), [(s, p) for s in range(6) for p in ("fgd", "ff")])
def test_the_kept_reserved_node_count_is_the_count_over_the_fleet(seed: int, policy: str) -> None:
    rng = np.random.default_rng(seed)
    config = QueueConfig(
        reserve_after_s=float(rng.integers(2, 6)), max_reserved_nodes=int(rng.integers(2, 5))
    )

    def make_policy() -> SeedancePolicy | FirstFit:
        return SeedancePolicy.for_trace(KINDS) if policy == "fgd" else FirstFit()

    q = PlacementQueue([node(f"n{i}", int(rng.choice([2, 4, 8]))) for i in range(5)],
                       make_policy(), config)  # fmt: skip
    closed: list[int] = []
    seen = {"reserved": 0, "preempted": 0, "restored_with": 0}
    for t in range(400):
        now, roll = float(t), rng.random()
        if roll < 0.5:
            job = Job(
                job_id=f"j{t}", request=KINDS[int(rng.integers(len(KINDS)))],
                priority=int(rng.integers(3)), replicas=int(rng.choice([1, 1, 1, 2, 3])),
            )  # fmt: skip
            q.submit(job, now)
        elif roll < 0.75 and q.running_ids:
            q.finish(q.running_ids[int(rng.integers(len(q.running_ids)))], now)
        elif roll < 0.82 and q.pending_ids:  # a waiting job cancelled: its nodes come back
            q.finish(q.pending_ids[int(rng.integers(len(q.pending_ids)))], now)
        elif roll < 0.87:
            q.add_node(node(f"x{t}", int(rng.choice([2, 4]))))
        elif roll < 0.9:
            idle = [i for i in range(len(q.state)) if not q.busy(i)]
            if idle:  # re-described while empty: a reservation on it stays
                i = idle[int(rng.integers(len(idle)))]
                q.replace_node(i, node(q.state.nodes[i].name, int(rng.choice([2, 4, 8]))))
        elif roll < 0.94:
            closed = [int(rng.integers(len(q.state)))] if rng.random() < 0.5 else []
            q.set_masked(set(), closed)
        else:  # a new leader: the queue rebuilt from its records
            seen["restored_with"] = max(seen["restored_with"], q.reservations.count)
            q = PlacementQueue.restore(
                q.state.nodes, make_policy(), config,
                running=q.running_records(), pending=q.pending_records(), seq=q.seq,
            )  # fmt: skip
            q.set_masked(set(), closed)
        assert_count_kept(q)
        decisions = q.schedule(now)
        seen["preempted"] += sum(isinstance(d, JobPreempted) for d in decisions)
        seen["reserved"] = max(seen["reserved"], assert_count_kept(q))
    # Every path was taken: nodes reserved, jobs preempted, a queue restored holding some.
    assert seen["reserved"] > 0
    assert seen["preempted"] > 0
    assert seen["restored_with"] > 0
