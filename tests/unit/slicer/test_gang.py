"""Gangs: one GPU model, the tightest topology domain that holds every member, all or nothing,
and reclaim of preemptible work by the quota's cohort rules."""

from __future__ import annotations

import pytest

from seedance.slicer.core import (
    Evicted,
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    QuotaPolicy,
    Scheduler,
    SchedulerConfig,
    Waiting,
)

LEVELS = ("nvidia.com/gpu.clique", "example.com/rack", "example.com/block")
CONFIG = SchedulerConfig(topology_levels=LEVELS)


def node(name: str, model: str = "NVIDIA H800", gpus: int = 8, **labels: str) -> NodeSpec:
    keys = {"clique": LEVELS[0], "rack": LEVELS[1], "block": LEVELS[2]}
    return NodeSpec(
        name=name,
        cpu_milli=192_000,
        memory_mib=1_572_864,
        gpus=tuple(GpuSpec(model=model, mem_mib=81_920) for _ in range(gpus)),
        labels={keys[k]: v for k, v in labels.items()},
    )


def gang(jid: str, members: int, tenant: str = "a", **kw: object) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, gpus=8, gang_size=members, **kw)  # type: ignore[arg-type]


def nodes_of(effects: list[object], jid: str) -> set[str]:
    return {e.node for e in effects if isinstance(e, Placed) and e.job.job_id == jid}


def test_a_gang_takes_one_gpu_model_and_never_splits_across_models() -> None:
    s = Scheduler(CONFIG)
    for i in range(3):
        s.upsert_node(node(f"a{i}", "NVIDIA A100-SXM4-80GB"), 0)
    for i in range(2):
        s.upsert_node(node(f"h{i}"), 0)
    out = s.submit(gang("g4", 4), 1)  # 5 nodes would hold it, but no one model has 4
    assert not nodes_of(out, "g4")
    # No model has 4 such nodes even empty: said at once (issue 28, item 5).
    assert [e.reason for e in out if isinstance(e, Waiting)] == ["unsatisfiable"]
    out = s.submit(gang("g3", 3), 2)
    assert nodes_of(out, "g3") == {"a0", "a1", "a2"}
    out = s.submit(gang("g2", 2), 3)
    assert nodes_of(out, "g2") == {"h0", "h1"}


def test_the_tightest_domain_that_holds_the_gang_wins_and_the_fullest_of_those() -> None:
    s = Scheduler(CONFIG)
    # Rack r1: 3 nodes; rack r2: 5 nodes, two of them one NVLink clique; all one block.
    for i in range(3):
        s.upsert_node(node(f"r1-{i}", rack="r1", block="b"), 0)
    for i in range(5):
        clique = {"clique": "nvl-1"} if i < 2 else {}
        s.upsert_node(node(f"r2-{i}", rack="r2", block="b", **clique), 0)
    assert nodes_of(s.submit(gang("two", 2), 1), "two") == {"r2-0", "r2-1"}  # the clique
    # Three members: r1 holds exactly three, r2 (three left) too: the one with no room to
    # spare wins the tie on spare room... both have 0 spare: the lower domain number (r1).
    assert nodes_of(s.submit(gang("three", 3), 2), "three") == {"r1-0", "r1-1", "r1-2"}
    out = s.submit(gang("four", 4), 3)
    assert not nodes_of(out, "four")  # only three nodes are free at all now
    # r1 free again: no rack holds four (three free in each), the block does, across racks.
    where = nodes_of(s.finish("a", "three", 4), "four")
    assert len(where) == 4
    assert {n[:2] for n in where} == {"r1", "r2"}


def test_a_gang_without_topology_labels_uses_its_model_pool_all_or_nothing() -> None:
    s = Scheduler()
    for i in range(3):
        s.upsert_node(node(f"n{i}"), 0)
    s.submit(JobSpec(job_id="small", tenant="a", gpus=1), 1)
    out = s.submit(gang("g", 3), 2)  # two whole nodes left: nothing starts
    assert not nodes_of(out, "g")
    out = s.finish("a", "small", 3)
    assert nodes_of(out, "g") == {"n0", "n1", "n2"}


def test_a_gang_reclaims_its_tenants_lower_priority_work_and_nothing_it_may_not() -> None:
    s = Scheduler(CONFIG)
    for i in range(3):
        s.upsert_node(node(f"n{i}", rack="r"), 0)
    s.submit(JobSpec(job_id="l0", tenant="a", gpus=8), 1)
    s.submit(JobSpec(job_id="l1", tenant="a", gpus=8), 2)
    s.submit(JobSpec(job_id="h", tenant="a", gpus=8, priority=9), 3)
    out = s.submit(gang("three", 3, priority=5), 4)  # would need h's node: waits, evicts none
    assert not [e for e in out if isinstance(e, Evicted)]
    assert not nodes_of(out, "three")
    s.finish("a", "three", 5)
    out = s.submit(gang("two", 2, priority=5), 6)
    evicted = sorted((e.job.job_id, e.reason) for e in out if isinstance(e, Evicted))
    assert evicted == [("l0", "priority"), ("l1", "priority")]
    assert len(nodes_of(out, "two")) == 2
    assert ("a", "h") in s.running_jobs
    assert {p.job_id for p in s.snapshot().pending} == {"a/l0", "a/l1"}  # back in the queue


def test_a_gang_reclaims_the_least_gpu_share_that_makes_room() -> None:
    s = Scheduler(CONFIG)
    for i in range(3):
        s.upsert_node(node(f"n{i}"), 0)
    s.submit(JobSpec(job_id="big", tenant="a", gpus=8), 1)
    s.submit(JobSpec(job_id="small", tenant="a", gpus=2), 2)  # the other busy node
    out = s.submit(gang("g", 2, priority=5), 3)  # one node free, one more to clear
    assert [e.job.job_id for e in out if isinstance(e, Evicted)] == ["small"]
    assert len(nodes_of(out, "g")) == 2


QUOTA = """
version: 1
tenants:
  train: {cohort: c, quota: {gpus: 40}}
  batch: {cohort: c, quota: {gpus: 4}}
  other: {quota: {gpus: 16}}
"""


@pytest.mark.parametrize("borrowing", [True, False])
def test_across_tenants_a_gang_reclaims_only_from_its_cohorts_borrowers(borrowing: bool) -> None:
    s = Scheduler(CONFIG, QuotaPolicy.from_yaml(QUOTA))
    for i in range(5):
        s.upsert_node(node(f"n{i}"), 0)
    # batch borrows (8 GPUs over its 4) or stays within its quota; other is in no cohort.
    s.submit(JobSpec(job_id="b0", tenant="batch", gpus=8 if borrowing else 4), 1)
    s.submit(JobSpec(job_id="o0", tenant="other", gpus=8), 2)
    s.submit(JobSpec(job_id="o1", tenant="other", gpus=8), 3)
    s.submit(JobSpec(job_id="t0", tenant="train", gpus=8), 4)
    assert len(s.running_jobs) == 4
    # Within train's quota and the cohort's (no quota reclaim at admission), short of nodes.
    out = s.submit(gang("g", 2, tenant="train"), 5)
    evicted = [(e.job.tenant, e.job.job_id, e.reason) for e in out if isinstance(e, Evicted)]
    if borrowing:
        assert evicted == [("batch", "b0", "quota_reclaim")]
        assert len(nodes_of(out, "g")) == 2
    else:
        assert evicted == []  # a cohort member within its quota keeps its work
        assert not nodes_of(out, "g")
    assert ("other", "o0") in s.running_jobs
    assert ("other", "o1") in s.running_jobs


def test_a_thousand_gpu_gang_goes_whole_into_one_block_and_a_small_one_into_one_rack() -> None:
    s = Scheduler(CONFIG)
    # 200 H800 nodes in racks of 4: block b0 holds 128 nodes, block b1 the other 72.
    for i in range(200):
        s.upsert_node(node(f"h{i}", rack=f"r{i // 4}", block=f"b{i // 128}"), 0)
    where = nodes_of(s.submit(gang("big", 128), 1), "big")
    assert where == {f"h{i}" for i in range(128)}  # no rack holds it; block b0 does, whole
    small = nodes_of(s.submit(gang("small", 4), 2), "small")
    assert len(small) == 4
    assert len({int(n[1:]) // 4 for n in small}) == 1  # one rack


def test_reclaim_takes_the_group_that_evicts_least_before_the_tighter_topology() -> None:
    s = Scheduler(CONFIG)
    for i in range(5):  # one A100 rack, all of it busy
        s.upsert_node(node(f"a{i}", "NVIDIA A100-SXM4-80GB", rack="ra"), 0)
    for i in range(5):  # H800s in no rack: four free, one busy
        s.upsert_node(node(f"h{i}"), 0)
    for i in range(5):
        s.submit(
            JobSpec(job_id=f"a{i}", tenant="a", gpus=8, gpu_models=("NVIDIA A100-SXM4-80GB",)), 1
        )
    s.submit(JobSpec(job_id="h", tenant="a", gpus=8, gpu_models=("NVIDIA H800",)), 2)
    out = s.submit(gang("g", 5, priority=5), 3)
    # The A100 rack would hold the gang whole once cleared (five evictions); the H800 pool
    # holds it with one.
    assert [e.job.job_id for e in out if isinstance(e, Evicted)] == ["h"]
    assert nodes_of(out, "g") == {f"h{i}" for i in range(5)}
