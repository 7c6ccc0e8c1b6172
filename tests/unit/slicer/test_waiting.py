"""The placement queue's pass visits what changed, not the waiting queue (`core.waiting`).

A pass visits only the waiting jobs that may do something; these tests hold it to deciding
exactly as a pass over every waiting job in queue order (the queue before the index), under
churn with priorities, preemption, gangs and reservations, and to a cost that does not grow
with the number of jobs waiting.
"""

from __future__ import annotations

import numpy as np
import pytest

from seedance.slicer.core.model import Node, PodRequest
from seedance.slicer.core.policies import FirstFit, SeedancePolicy
from seedance.slicer.core.queue import Job, PlacementQueue, QueueConfig, QueueDecision


class EveryJobQueue(PlacementQueue):
    """The pass as it was before the index: every waiting job visited, in queue order."""

    def schedule(self, now_s: float) -> list[QueueDecision]:
        out: list[QueueDecision] = []
        self._queued_in_pass = []
        self._waiting.mature(now_s)
        try:
            for e in list(self._order):
                pend = self._pending.get(e[1])
                if pend is None:
                    continue
                if not self._visit(pend, e, now_s, out, []) and not self.config.backfill:
                    break
        finally:
            queued, self._queued_in_pass = self._queued_in_pass, None
            for p in queued:
                self._index(p)
        return out


class CountingQueue(PlacementQueue):
    """Counts the waiting jobs each pass visits."""

    visits = 0

    def _visit(self, *args, **kw):  # type: ignore[no-untyped-def]
        self.visits += 1
        return super()._visit(*args, **kw)


KINDS = [
    PodRequest(cpu_milli=2000, memory_mib=1000, num_gpu=1, gpu_milli=300),
    PodRequest(cpu_milli=4000, memory_mib=1000, num_gpu=1, gpu_milli=810),
    PodRequest(cpu_milli=8000, memory_mib=1000, num_gpu=2, gpu_milli=1000),
    PodRequest(cpu_milli=16000, memory_mib=1000, num_gpu=4, gpu_milli=1000),
    PodRequest(cpu_milli=6000, memory_mib=1000),
    PodRequest(cpu_milli=30000, memory_mib=1000),
]


def node(name: str, gpus: int = 4, cpu: int = 32_000) -> Node:
    return Node(name=name, cpu_milli=cpu, memory_mib=64_000, gpu_count=gpus, gpu_model="G2")


@pytest.mark.parametrize(
    ("seed", "policy", "config"),
    [
        (1, "seedance", QueueConfig(reserve_after_s=5.0, max_reserved_nodes=3)),
        (2, "seedance", QueueConfig(reserve_after_s=2.0, max_reserved_nodes=2)),
        (3, "first-fit", QueueConfig(reserve_after_s=4.0, max_reserved_nodes=4)),
        (4, "seedance", QueueConfig(reserve_after_s=3.0, preemption=False)),
        (5, "first-fit", QueueConfig(backfill=False)),
    ],
)
def test_the_indexed_pass_decides_as_a_pass_over_every_waiting_job(
    seed: int, policy: str, config: QueueConfig
) -> None:
    rng = np.random.default_rng(seed)
    nodes = [node(f"n{i}", gpus=int(rng.choice([2, 4, 8]))) for i in range(6)]

    def make(cls: type[PlacementQueue]) -> PlacementQueue:
        pol = SeedancePolicy.for_trace(KINDS) if policy == "seedance" else FirstFit()
        return cls(nodes, pol, config)

    indexed, every = make(PlacementQueue), make(EveryJobQueue)
    waited = 0
    for t in range(600):
        now = float(t)
        roll = rng.random()
        if roll < 0.55:
            job = Job(
                job_id=f"j{t}",
                request=KINDS[int(rng.integers(len(KINDS)))],
                priority=int(rng.integers(3)),
                replicas=int(rng.choice([1, 1, 1, 1, 2, 3])),
                tenant=str(rng.choice(["a", "b"])),
            )
            for q in (indexed, every):
                q.submit(job, now)
        elif roll < 0.9 and every.running_ids:
            victim = every.running_ids[int(rng.integers(len(every.running_ids)))]
            for q in (indexed, every):
                q.finish(victim, now)
        elif every.pending_ids:  # a waiting job cancelled
            gone = every.pending_ids[int(rng.integers(len(every.pending_ids)))]
            for q in (indexed, every):
                q.finish(gone, now)
        assert indexed.schedule(now) == every.schedule(now), f"pass at t={t}"
        assert indexed.pending_records() == every.pending_records()
        waited += indexed.pending_count
    assert waited > 600  # jobs did wait (reasons, reservations and preemption were exercised)


def test_a_pass_costs_what_changed_not_the_length_of_the_waiting_queue() -> None:
    def visits_per_pass(waiting: int) -> list[int]:
        q = CountingQueue([node(f"n{i}") for i in range(4)], FirstFit(), QueueConfig())
        for i in range(16):  # the fleet full: 4 GPUs on each of 4 nodes
            q.submit(Job(job_id=f"r{i}", request=KINDS[1]), 0.0)
        big = PodRequest(cpu_milli=31_000, memory_mib=1000)  # only an emptied node holds one
        for i in range(waiting):
            q.submit(Job(job_id=f"w{i}", request=big), 1.0)
        q.schedule(1.0)
        # Old enough to reserve: the reservations fill up, the rest may not reserve.
        q.schedule(1000.0)
        assert q.pending_count == waiting
        counts = []
        for i in range(16):  # a finish and a submit per step, each followed by a pass
            q.finish(f"r{i}", 1000.0 + i)
            q.submit(Job(job_id=f"s{i}", request=KINDS[1]), 1000.0 + i)
            q.visits = 0
            q.schedule(1000.0 + i)
            counts.append(q.visits)
        return counts

    few, many = visits_per_pass(10), visits_per_pass(5000)
    # The same visits with 10 or 5,000 jobs waiting: the reservation holders, the new job,
    # the shapes the finish may have made placeable (and what the emptied nodes then start).
    assert many == few
    assert max(many) < 30
