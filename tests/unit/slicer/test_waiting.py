"""The placement queue's pass visits what changed, not the waiting queue (`core.waiting`).

A pass visits only the waiting jobs that may do something; these tests hold it to deciding
exactly as a pass over every waiting job in queue order (the queue before the index), under
churn with priorities, preemption, gangs and reservations, and while the capacity changes
(nodes join, GPUs are masked, nodes closed, host room held and freed, shared jobs resized), and
to a cost that does not grow with the number of jobs waiting.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


class Twins:
    """The indexed pass and the pass over every waiting job, on the same fleet, given the same
    inputs (drawn from `rng`): `step` checks after each that both decide alike."""

    def __init__(
        self, rng: np.random.Generator, nodes: list[Node], policy: str, config: QueueConfig
    ) -> None:
        def make(cls: type[PlacementQueue]) -> PlacementQueue:
            pol = SeedancePolicy.for_trace(KINDS) if policy == "seedance" else FirstFit()
            return cls(nodes, pol, config)

        self.rng = rng
        self.indexed, self.every = make(PlacementQueue), make(EveryJobQueue)
        self.held: list[int] = []  # nodes where `hold_host` took host room, in order

    def both(self, call: Callable[[PlacementQueue], object]) -> None:
        for q in (self.indexed, self.every):
            call(q)

    def step(self, t: int, ops: Sequence[tuple[float, Op]]) -> None:
        """The first op whose bound is above the roll and that applies (an `elif` chain; maybe
        none), then a pass of each queue."""
        now, roll = float(t), self.rng.random()
        next((op for bound, op in ops if roll < bound and op(self, t)), None)
        assert self.indexed.schedule(now) == self.every.schedule(now), f"pass at t={t}"
        assert self.indexed.pending_records() == self.every.pending_records()


Op = Callable[[Twins, int], bool]


def submit(replicas: list[int]) -> Op:
    def op(tw: Twins, t: int) -> bool:
        rng = tw.rng
        job = Job(
            job_id=f"j{t}",
            request=KINDS[int(rng.integers(len(KINDS)))],
            priority=int(rng.integers(3)),
            replicas=int(rng.choice(replicas)),
            tenant=str(rng.choice(["a", "b"])),
        )
        tw.both(lambda q: q.submit(job, float(t)))
        return True

    return op


def _end_one(tw: Twins, ids: list[str], t: int) -> bool:
    """One of ``ids`` (drawn at random) ended in both queues; False where there is none."""
    if not ids:
        return False
    gone = ids[int(tw.rng.integers(len(ids)))]
    tw.both(lambda q: q.finish(gone, float(t)))
    return True


def finish(tw: Twins, t: int) -> bool:
    """A running job finished."""
    return _end_one(tw, tw.every.running_ids, t)


def cancel(tw: Twins, t: int) -> bool:
    """A waiting job cancelled."""
    return _end_one(tw, tw.every.pending_ids, t)


def add_node(tw: Twins, t: int) -> bool:
    joined = node(f"x{t}", gpus=int(tw.rng.choice([2, 4])))
    tw.both(lambda q: q.add_node(joined))
    return True


def mask(tw: Twins, t: int) -> bool:
    """GPUs masked (unhealthy, MIG mode) and maybe a node closed (cordoned, held empty)."""
    rng, n = tw.rng, len(tw.every.state)
    gpus = {(int(rng.integers(n)), int(rng.integers(2))) for _ in range(int(rng.integers(0, 4)))}
    closed = [int(rng.integers(n))] if rng.random() < 0.5 else []
    tw.both(lambda q: q.set_masked(gpus, closed))
    return True


def hold_or_free_host(tw: Twins, t: int) -> bool:
    """Host room taken by work placed outside the queue (a MIG job's), or given back."""
    rng, st = tw.rng, tw.every.state
    n = int(rng.integers(len(st)))
    if rng.random() < 0.5 or not tw.held:
        if st.cpu_free[n] >= 4000 and st.mem_free[n] >= 1000:
            tw.both(lambda q: q.hold_host(n, 4000, 1000))
            tw.held.append(n)
    else:
        freed = tw.held.pop()
        tw.both(lambda q: q.free_host(freed, 4000, 1000))
    return True


def resize(tw: Twins, t: int) -> bool:
    """A running shared job right-sized; both queues refuse the same sizes."""
    if not tw.every.running_ids:
        return False
    shared = [
        j
        for j in tw.every.running_ids
        if (r := tw.every.running_record(j)) is not None
        and r.job.request.is_shared
        and r.job.replicas == 1
    ]
    if shared:
        job, milli = shared[int(tw.rng.integers(len(shared)))], int(tw.rng.integers(100, 900))
        fits = []
        for q in (tw.indexed, tw.every):
            try:
                q.resize(job, milli)
            except ValueError:
                fits.append(False)
            else:
                fits.append(True)
        assert fits[0] == fits[1], f"resize of {job} to {milli} at t={t}"
    return True


#: Jobs come, end and are cancelled.
CHURN: list[tuple[float, Op]] = [
    (0.55, submit([1, 1, 1, 1, 2, 3])),
    (0.9, finish),
    (1.0, cancel),
]
#: The same, with the capacity changing under them: nodes join, GPUs are masked and nodes
#: closed, host room is held outside the queue, shared jobs are right-sized.
CAPACITY_CHANGES: list[tuple[float, Op]] = [
    (0.45, submit([1, 1, 1, 2])),
    (0.7, finish),
    (0.75, add_node),
    (0.82, mask),
    (0.87, hold_or_free_host),
    (0.93, resize),
    (1.0, cancel),
]


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
    twins = Twins(rng, nodes, policy, config)
    waited = 0
    for t in range(600):
        twins.step(t, CHURN)
        waited += twins.indexed.pending_count
    assert waited > 600  # jobs did wait (reasons, reservations and preemption were exercised)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("policy", ["seedance", "first-fit"])
def test_the_indexed_pass_decides_alike_while_the_capacity_changes(seed: int, policy: str) -> None:
    """Every input that frees or takes room outside a job's start and end (the review's cases,
    issue 31's index): each must reopen the shapes that failed, as a pass over every job sees."""
    rng = np.random.default_rng(seed)
    nodes = [node(f"n{i}", gpus=int(rng.choice([2, 4, 8]))) for i in range(4)]
    config = QueueConfig(
        reserve_after_s=float(rng.integers(2, 6)), max_reserved_nodes=int(rng.integers(1, 4))
    )
    twins = Twins(rng, nodes, policy, config)
    for t in range(500):
        twins.step(t, CAPACITY_CHANGES)
    assert len(twins.every.state) > len(nodes)  # nodes did join


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
