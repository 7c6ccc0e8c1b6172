"""The consolidation planner (`seedance.slicer.core.consolidation`): a job that did not say it is
movable is never moved, the disruption budget holds under a burst, a drain is all of a node or
nothing and only where its jobs fit elsewhere, and only when the capacity freed is worth more
than the restarts."""

from __future__ import annotations

import random

from seedance.slicer.core.consolidation import (
    DisruptionBudget,
    MovableJob,
    MoveHistory,
    plan_consolidation,
)
from seedance.slicer.core.model import ClusterState, NodeGpus, PodRequest
from tests.unit.slicer.nodes import node

ONE = PodRequest(cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000)
NOW = 10_000.0


def cluster(
    layout: list[list[tuple[str, bool]]], *, gpus: int = 4, started_s: float = NOW - 60
) -> tuple[ClusterState, dict[int, list[MovableJob]]]:
    """Nodes of `gpus` GPUs; `layout[n]` the (job id, movable) of one-GPU jobs on node n."""
    state = ClusterState([node(f"n{i}", gpus=gpus) for i in range(len(layout))])
    jobs: dict[int, list[MovableJob]] = {}
    for n, row in enumerate(layout):
        for g, (jid, movable) in enumerate(row):
            state.apply(ONE, NodeGpus(n, (g,)))
            j = MovableJob(
                job_id=jid, tenant=jid.split("/")[0], node=n, request=ONE,
                started_s=started_s, movable=movable,
            )  # fmt: skip
            jobs.setdefault(n, []).append(j)
    return state, jobs


def plan(state: ClusterState, jobs: dict[int, list[MovableJob]], **kw: object) -> list[int]:
    budget = kw.pop("budget", DisruptionBudget(window_fraction=1.0))
    history = kw.pop("history", MoveHistory())
    drains = plan_consolidation(state, jobs, NOW, budget, history, **kw)  # type: ignore[arg-type]
    return [d.node for d in drains]


def test_a_node_whose_job_did_not_say_it_is_movable_is_never_drained() -> None:
    # Node 0 holds one GPU of four: the cheapest drain there is, but its job is not movable.
    state, jobs = cluster([[("a/x", False)], [("a/y", True)], [("a/z", True), ("a/w", True)]])
    drained = plan(state, jobs)
    assert 0 not in drained
    assert 1 in drained
    moved = {j.job_id for n in drained for j in jobs[n]}
    assert "a/x" not in moved


def test_a_node_mixing_movable_and_unmovable_jobs_is_not_drained() -> None:
    state, jobs = cluster([[("a/x", True), ("a/y", False)], [("a/z", True), ("a/w", True)]])
    assert 0 not in plan(state, jobs)


def test_nothing_is_drained_where_its_jobs_do_not_fit_elsewhere() -> None:
    # Two nodes, each three quarters full by the rule's own bound: nowhere to go.
    state, jobs = cluster([[("a/x", True)], [(f"a/{i}", False) for i in range(4)]])
    assert plan(state, jobs) == []


def test_the_budget_holds_under_a_burst() -> None:
    # Twenty nodes each holding one movable job (all drainable), one busy node to take them.
    layout = [[(f"t{i % 3}/j{i}", True)] for i in range(20)]
    layout.append([("a/anchor", False)])
    state, jobs = cluster(layout, gpus=32 // 4)
    budget = DisruptionBudget(window_s=600, window_fraction=0.25, min_per_window=1)
    history = MoveHistory()
    allowed = budget.per_window(21)  # 5
    made = 0
    for step in range(10):  # a burst of passes inside one window
        drains = plan_consolidation(state, jobs, NOW + step, budget, history)
        for d in drains:
            for j in d.jobs:
                history.record(NOW + step, j.tenant, j.job_id)
                made += 1
            jobs.pop(d.node)
    assert made == allowed
    # Once the window has passed, moving resumes.
    later = plan_consolidation(state, jobs, NOW + 601, budget, history)
    assert 0 < len(later) <= allowed


def test_the_per_tenant_bound_and_the_per_job_bound() -> None:
    layout = [[("t1/a", True)], [("t1/b", True)], [("t2/c", True)], [("z/anchor", False)]]
    state, jobs = cluster(layout)
    budget = DisruptionBudget(window_fraction=1.0, moves_per_tenant=1)
    drained = plan(state, jobs, budget=budget)
    tenants = [jobs[n][0].tenant for n in drained]
    assert sorted(tenants) == ["t1", "t2"]
    history = MoveHistory()
    history.record(NOW - 10_000, "t1", "t1/a")  # moved long ago: the window forgot, the job not
    drained = plan(state, jobs, history=history)
    assert 0 not in drained
    assert 1 in drained


def test_a_restart_that_costs_more_than_the_freed_capacity_is_not_made() -> None:
    # A two-GPU node holding one one-GPU job that has run for 10 h: the node freed is worth
    # 2 GPUs × ~10 h, the restart loses 1 GPU × 10 h; below the default worth ratio of 2.
    state, jobs = cluster(
        [[("a/old", True)], [("a/anchor", False)]], gpus=2, started_s=NOW - 36_000
    )
    assert plan(state, jobs) == []
    # The same node with a job that just started is worth draining.
    state, jobs = cluster([[("a/new", True)], [("a/anchor", False)]], gpus=2, started_s=NOW - 60)
    assert plan(state, jobs) == [0]


def test_the_headroom_is_kept() -> None:
    state, jobs = cluster([[("a/x", True)], [("a/y", False)]])
    # Draining node 0 moves its job onto node 1, leaving 2 whole GPUs free there; node 0's
    # go with it. Without a drain, 6 are free.
    assert plan(state, jobs, keep_free_gpus=2) == [0]
    assert plan(state, jobs, keep_free_gpus=3) == []


def test_a_node_that_takes_moved_jobs_is_not_drained_in_the_same_round() -> None:
    # Four 2-GPU nodes, each half used by a movable job. Draining n0 moves its job to n1; n1,
    # still listed with its own job alone, must not be drained too (m0 would be stranded on a
    # node being emptied). n2's job goes to n3.
    layout = [[(f"a/m{i}", True)] for i in range(4)]
    state, jobs = cluster(layout, gpus=2)
    assert plan(state, jobs) == [0, 2]


def test_a_job_that_ran_longer_than_the_bound_is_not_moved() -> None:
    # An 8-GPU node holding one one-GPU job that has run 3 h: by GPU-seconds alone the node
    # (8 GPUs × ≥ 3 h) is worth the restart (1 GPU × 3 h), but the move would put the job's
    # end back 3 h. The default bound (1 h of progress) keeps it; no bound moves it.
    ran = 3 * 3600.0
    state, jobs = cluster([[("a/old", True)], [("a/anchor", False)]], gpus=8, started_s=NOW - ran)
    assert plan(state, jobs) == []
    unbounded = DisruptionBudget(window_fraction=1.0, max_lost_s=None)
    assert plan(state, jobs, budget=unbounded) == [0]
    # Within the bound it moves.
    state, jobs = cluster([[("a/new", True)], [("a/anchor", False)]], gpus=8, started_s=NOW - 3000)
    assert plan(state, jobs) == [0]


class _Reads(dict[int, list[MovableJob]]):
    """The candidates, remembering which nodes' jobs the planner read."""

    def __init__(self, jobs: dict[int, list[MovableJob]]) -> None:
        super().__init__(jobs)
        self.read: set[int] = set()

    def __getitem__(self, n: int) -> list[MovableJob]:
        self.read.add(n)
        return super().__getitem__(n)


def test_only_light_nodes_jobs_are_read_least_used_first() -> None:
    # Random fleets: the drains are the least-used light nodes' first (by GPUs in use, then
    # node), and the jobs of a node too busy to drain are never read (a round lists the
    # candidates on demand: on a large pool it would otherwise build every running job's).
    rng = random.Random(7)
    for _ in range(30):
        layout = [
            [(f"t{rng.randrange(3)}/j{n}-{g}", rng.random() < 0.9) for g in range(rng.randrange(5))]
            for n in range(24)
        ]
        state, jobs = cluster(layout)
        reads = _Reads(jobs)
        budget = DisruptionBudget(window_fraction=1.0)
        drains = plan_consolidation(state, reads, NOW, budget, MoveHistory())
        used = {n: len(layout[n]) for n in jobs}
        light = {n for n in jobs if used[n] <= 0.5 * 4}
        assert reads.read <= light
        order = [d.node for d in drains]
        assert order == sorted(order, key=lambda n: (used[n], n))
        assert set(order) <= light
