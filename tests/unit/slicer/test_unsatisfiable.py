"""Impossible is said at once: a request no node type of the fleet could hold even empty is
answered `unsatisfiable` (what no node offers, the values known), stays queued, and is placed
when the fleet changes (issue 28, item 5)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from seedance.slicer.core import GpuSpec, JobSpec, NodeSpec, Placed, Scheduler, Waiting
from seedance.slicer.core.effects import published_reason
from seedance.slicer.core.satisfiable import NodePool, fleet_types, node_pools, unsatisfiable
from seedance.slicer.core.workload import SchedulerConfig


def node(name: str, model: str, gpus: int = 4, *, mem: int = 16_384, **kw: object) -> NodeSpec:
    return NodeSpec(
        name=name, cpu_milli=32_000, memory_mib=256_000,
        gpus=tuple(GpuSpec(model=model, mem_mib=mem, **kw) for _ in range(gpus)),  # type: ignore[arg-type]
    )  # fmt: skip


def job(jid: str, **kw: object) -> JobSpec:
    return JobSpec(job_id=jid, tenant="a", cause_id=f"c-{jid}", **kw)  # type: ignore[arg-type]


A100 = "NVIDIA A100-SXM4-80GB"


def fleet(config: SchedulerConfig | None = None) -> Scheduler:
    s = Scheduler(config)
    s.upsert_node(node("t4-node", "T4"), 0)
    s.upsert_node(node("a100-node", A100, 2, mem=81_920, mig_capable=True, mig_enabled=True), 0)
    return s


def only_waiting(effects: Sequence[object]) -> Waiting:
    (w,) = effects
    assert isinstance(w, Waiting), w
    return w


def test_a_model_no_node_has_is_unsatisfiable_naming_the_known_models() -> None:
    w = only_waiting(fleet().submit(job("b", gpu_models=("b200",)), 1))
    assert w.reason == "unsatisfiable"
    assert published_reason(w.reason) == "unsatisfiable"
    assert w.detail == (
        "gpu_models [b200] match none of the fleet's models: "
        "NVIDIA A100-SXM4-80GB (A100-SXM4-80GB), T4 (T4-PCIE-16GB)"
    )


def test_a_family_in_lower_case_still_finds_the_fleets_t4() -> None:
    (placed,) = fleet().submit(job("t", gpu_models=("t4",)), 1)
    assert isinstance(placed, Placed)
    assert placed.node == "t4-node"


def test_a_mig_profile_no_gpu_offers_names_the_profiles_offered() -> None:
    w = only_waiting(fleet().submit(job("m", mig_profile="7g.141gb"), 1))
    assert w.reason == "unsatisfiable"
    assert w.detail.startswith("MIG profile 7g.141gb: no GPU of the fleet offers it")
    assert f"{A100}: 1g.10gb" in w.detail


def test_a_mig_profile_on_t4s_only_says_no_gpu_there_is_mig_capable() -> None:
    w = only_waiting(fleet().submit(job("m", mig_profile="1g.10gb", gpu_models=("t4",)), 1))
    assert w.reason == "unsatisfiable"
    assert "no MIG-capable GPU among T4" in w.detail


def test_more_gpus_or_gpu_memory_than_any_node_type() -> None:
    s = fleet()
    w = only_waiting(s.submit(job("g", gpus=6), 1))
    assert (w.reason, w.detail.split(":")[0]) == ("unsatisfiable", "gpus=6 per member")
    assert "at most 4 GPUs" in w.detail
    w = only_waiting(s.submit(job("mem", gpu_mem_mib=100_000), 1))
    assert w.reason == "unsatisfiable"
    assert "at most 81920 MiB" in w.detail
    w = only_waiting(s.submit(job("h", gpus=1, memory_mib=512_000), 1))
    assert w.reason == "unsatisfiable"
    assert "no GPU node holds one member" in w.detail


def test_a_gang_larger_than_the_fleet_and_one_that_only_waits() -> None:
    s = fleet()
    w = only_waiting(s.submit(job("big", gpus=4, gang_size=2, gpu_models=("t4",)), 1))
    assert w.reason == "unsatisfiable"
    assert "gang_size=2: the fleet holds at most 1 such members" in w.detail
    s.submit(job("hog", gpus=4, gpu_models=("t4",)), 1)
    w = only_waiting(s.submit(job("later", gpus=2, gpu_models=("t4",)), 2))
    assert w.reason != "unsatisfiable"  # the fleet could hold it: it waits for room


def test_what_could_fit_is_not_unsatisfiable_and_an_empty_fleet_is_not_judged() -> None:
    assert unsatisfiable(job("x", gpu_models=("b200",)), ()) == ""
    w = only_waiting(Scheduler().submit(job("x", gpu_models=("b200",)), 1))
    assert w.reason == "no_inventory"
    types = fleet_types([node("n", "T4")])
    assert unsatisfiable(job("ok", gpus=4, gpu_models=("t4",)), types) == ""
    assert unsatisfiable(job("cpu", gpus=0, cpu_milli=1000), types) == ""


def test_it_stays_queued_and_is_placed_when_the_fleet_changes() -> None:
    s = fleet()
    only_waiting(s.submit(job("b", gpu_models=("b200",)), 1))
    assert s.waiting_count == 1
    out = s.upsert_node(node("b200-node", "NVIDIA B200", 8, mem=183_359), 2)
    (placed,) = out
    assert isinstance(placed, Placed)
    assert placed.node == "b200-node"


def test_a_fleet_change_that_makes_it_possible_but_not_now_says_the_wait() -> None:
    s = fleet()
    only_waiting(s.submit(job("big", gpus=4, gang_size=2, gpu_models=("t4",)), 1))
    s.submit(job("hog", gpus=4, gpu_models=("t4",)), 1)  # the first T4 node is full
    out = s.upsert_node(node("t4-node-2", "T4"), 2)
    # Both nodes could hold the gang when empty: no longer unsatisfiable, it waits for room.
    reasons = [(e.job.job_id, e.reason) for e in out if isinstance(e, Waiting)]
    assert reasons
    assert all(r != "unsatisfiable" for _, r in reasons), reasons
    assert "big" in {k for k, _ in reasons}


def test_a_pool_scaled_to_zero_counts_as_fleet() -> None:
    (pool,) = node_pools(
        {"pools": [{"name": "b200", "gpu_model": "NVIDIA B200", "gpus": 8,
                    "gpu_mem_mib": 183_359, "cpu_milli": 64_000, "memory_mib": 1_000_000,
                    "max_nodes": 2}]}
    )  # fmt: skip
    assert isinstance(pool, NodePool)
    assert pool.max_nodes == 2
    s = fleet(SchedulerConfig(node_pools=(pool,)))
    w = only_waiting(s.submit(job("b", gpu_models=("b200",)), 1))
    assert w.reason == "no_allowed_gpu_model"  # waits for the pool to scale up
    w = only_waiting(s.submit(job("g", gpus=8, gang_size=3, gpu_models=("b200",)), 1))
    assert w.reason == "unsatisfiable"
    assert "NVIDIA B200: 2" in w.detail


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"pool": []}, "a list 'pools'"),
        ({"pools": [{"gpus": 2, "cpu_milli": 1, "memory_mib": 1}]}, "pools[0].gpu_model"),
        ({"pools": [{"gpus": -1, "cpu_milli": 1, "memory_mib": 1}]}, "pools[0].gpus"),
        ({"pools": [{"cpu_milli": 1}]}, "pools[0].memory_mib"),
    ],
)
def test_a_bad_node_pools_document_names_the_field(doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        node_pools(doc)


def test_a_node_with_only_its_last_gpu_in_mig_mode_offers_its_profiles() -> None:
    """NVIDIA's "mixed" strategy: GPU 0 whole, GPU 1 in MIG mode. The node's type offers the
    model's profiles (judged on any GPU, not the first alone), and the MIG job is placed on
    GPU 1."""
    s = Scheduler()
    whole = GpuSpec(model=A100, mem_mib=81_920)
    mig = GpuSpec(model=A100, mem_mib=81_920, mig_capable=True, mig_enabled=True)
    s.upsert_node(NodeSpec(name="n", cpu_milli=8_000, memory_mib=32_768, gpus=(whole, mig)), 0)
    (placed,) = s.submit(job("m", mig_profile="1g.10gb"), 1)
    assert isinstance(placed, Placed), placed
    assert (placed.kind, [g.index for g in placed.gpus]) == ("mig", [1])
