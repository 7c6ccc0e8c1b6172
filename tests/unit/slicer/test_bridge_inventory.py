"""The k8s-bridge's inventory of real GPU-operator nodes, as the slicer decodes and places on it.

The label sets are those NVIDIA's GPU feature discovery writes (NVIDIA/k8s-device-plugin,
docs/gpu-feature-discovery/README.md, "Generated Labels" and its "MIG 'single' strategy" /
"MIG 'mixed' strategy" tables) under the GPU operator, whose ClusterPolicy sets one MIG
strategy for the cluster (``single`` by default) and whose mig-manager writes
``nvidia.com/mig.config`` (``all-disabled``: MIG off) and ``nvidia.com/mig.config.state``
(the operator's "GPU Operator with MIG" page shows an H100 node's labels). Each inventory goes
over the wire and through the slicer's own decoder (`seedance.events.decode`, as its durable
consumer reads it) before the scheduler sees it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.core import Delivery
from seedance.cost_ledger.core.booktoml import default_price_book
from seedance.events import decode, encode
from seedance.events.subjects import telemetry
from seedance.events.telemetry import NodeInventory
from seedance.events.tokens import kube_node_token
from seedance.k8s_bridge.core.nodes import UndescribedNode, gpus_left_out, node_inventory
from seedance.slicer.cluster_policy import ClusterPolicy
from seedance.slicer.config import scheduler_config
from seedance.slicer.core.effects import Placed
from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.scheduler import Scheduler
from seedance.slicer.decider import SlicerDecider
from seedance.slicer.durable import SlicerState
from seedance.slicer.mapping import node_spec
from seedance.slicer.metrics import SlicerMetrics
from seedance.slicer.settings import SlicerSettings
from seedance.telemetry_collector.mapping import inventory_event
from seedance.telemetry_collector.sample import GpuInventory
from seedance.telemetry_collector.sample import NodeInventory as NvmlInventory
from tests.unit.slicer.billing import _Durable

AT = datetime(2026, 12, 7, 13, tzinfo=UTC)
KEY = b"k" * 32


def operator_node(labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-1.example.com", "uid": "u-1", "labels": labels},
        "status": {
            "allocatable": {"cpu": "191450m", "memory": "2045Gi", **allocatable},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def on_the_wire(node: dict[str, Any]) -> NodeInventory:
    """The bridge's inventory of ``node`` as the slicer's consumer decodes it."""
    got = decode(encode(node_inventory(node, AT, key=KEY)))
    assert isinstance(got, NodeInventory)
    return got


def slicer() -> tuple[SlicerDecider, CollectorRegistry]:
    """The slicer's decider as its durable runtime drives it (its state never committed)."""
    settings = SlicerSettings(pool="p")
    config = scheduler_config(settings)
    state = SlicerState(
        SimpleNamespace(stats=SimpleNamespace(journal_records=0)),  # type: ignore[arg-type]
        # never loaded nor committed here: `restored` reads its stats only
        legacy_key="pool.p", config=config, parse_quota=lambda _doc: None,
    )  # fmt: skip
    registry = CollectorRegistry()
    decider = SlicerDecider(
        settings=settings, config=config, cluster_policy=ClusterPolicy(settings.policy),
        metrics=SlicerMetrics(registry),
    )  # fmt: skip
    decider.bind(_Durable(state))  # type: ignore[arg-type]  # the state is all it reads
    decider.id_key = bytes(32)
    return decider, registry


def placed(inv: NodeInventory, *jobs: JobSpec) -> list[Placed]:
    """Where the scheduler places ``jobs``, one after the other, on the node ``inv`` alone."""
    sched = Scheduler()
    sched.upsert_node(node_spec(inv), 0.0)
    out: list[Placed] = []
    for n, job in enumerate(jobs):
        out += [e for e in sched.submit(job, 1.0 + n) if isinstance(e, Placed)]
    return out


def whole(job_id: str = "j1") -> JobSpec:
    return JobSpec(job_id=job_id, tenant="acme", gpus=1, cause_id=job_id)


def placed_whole_gpu(inv: NodeInventory) -> bool:
    return len(placed(inv, whole())) == 1


#: A plain 8x H100 SXM node under the GPU operator, MIG off: GFD still writes the cluster's
#: strategy and ``mig.capable=true`` (the part can do MIG); mig-manager says ``all-disabled``.
H100_MIG_OFF = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.config": "all-disabled",
    "nvidia.com/mig.config.state": "success",
}


def test_a_mig_capable_node_with_mig_off_takes_whole_gpu_jobs_whatever_the_strategy() -> None:
    for strategy in ("single", "mixed", "none"):
        inv = on_the_wire(
            operator_node({**H100_MIG_OFF, "nvidia.com/mig.strategy": strategy},
                          {"nvidia.com/gpu": "8"})
        )  # fmt: skip
        assert len(inv.gpus) == 8, strategy
        assert all(g.mig_capable and not g.mig_enabled for g in inv.gpus), strategy
        assert placed_whole_gpu(inv), strategy


def test_two_publishers_of_one_node_are_said_naming_the_node_and_both_shapes() -> None:
    """The shipped base's two publishers of a GPU-operator node (the NVML collector and the
    bridge): the slicer still takes the last inventory whole, but says so instead of flipping
    silently: every change counted, logged once per node per leader term (no flood)."""
    name = "ip-10-0-1-2.ec2.internal"
    node = kube_node_token(name)
    # NVML: 8x H100 SXM, GPUs 6 and 7 in MIG mode (the collector's own mapping).
    nvml = NvmlInventory(node=node, gpus=tuple(
        GpuInventory(index=i, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
                     model="NVIDIA H100 80GB HBM3", mem_total_mib=81559.0, mig_capable=True,
                     mig_enabled=i >= 6)
        for i in range(8)))  # fmt: skip
    collector = decode(encode(inventory_event(nvml, AT, cpu_milli=190_000, memory_mib=2_000_000)))
    # The same node as the API server has it: GFD's labels, the 6 whole GPUs' allocatable.
    labels = {
        **H100_MIG_OFF, "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "custom-6-whole-2-all-1g.10gb",  # not all-disabled: MIG is on
        "nvidia.com/mig-1g.10gb.count": "14",
    }  # fmt: skip
    kube = operator_node(labels, {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14"})
    kube["metadata"]["name"] = name
    bridge = decode(encode(node_inventory(kube, AT + timedelta(seconds=1), key=KEY)))
    assert isinstance(collector, NodeInventory)
    assert isinstance(bridge, NodeInventory)

    decider, registry = slicer()
    with capture_logs() as logs:
        decider.apply(collector, AT)
        decider.apply(collector, AT)  # the same publisher again: nothing to say
        decider.apply(bridge, AT + timedelta(seconds=1))
        # The shipped base's two publishers go on flipping the node: counted, said once a term.
        decider.apply(collector, AT + timedelta(seconds=2))
        decider.apply(bridge, AT + timedelta(seconds=3))
    said = [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    assert len(said) == 1
    (one,) = said
    assert one["node"] == node
    assert (one["before"], one["after"]) == ("nvml", "node-labels")
    assert one["before_shape"].startswith("8 GPUs NVIDIA H100 80GB HBM3 (2 in MIG mode, uuids")
    assert "NVIDIA-H100-80GB-HBM3" in one["after_shape"]
    assert one["after_shape"].endswith("no uuids)")
    counted = registry.get_sample_value("seedance_slicer_inventory_publisher_changes_total")
    assert counted == 3
    decider.restored(0.0)  # a new leader term: the node's next change is said again
    with capture_logs() as logs:
        decider.apply(collector, AT + timedelta(seconds=4))
        decider.apply(bridge, AT + timedelta(seconds=5))
    said = [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    assert [(e["before"], e["after"]) for e in said] == [("node-labels", "nvml")]
    counted = registry.get_sample_value("seedance_slicer_inventory_publisher_changes_total")
    assert counted == 5


def test_a_pool_label_with_dots_is_its_token_and_the_slicer_decodes_it() -> None:
    """``a100.spot`` is a valid label value but no subject token: the bridge once published it
    as written and the slicer's decoder dead-lettered the inventory (the node never used). Its
    dots become ``:`` as a node name's do (reversible: a label value holds no ``:``)."""
    kube = operator_node(
        {**H100_MIG_OFF, "nvidia.com/mig.strategy": "single", "seedance.io/pool": "a100.spot"},
        {"nvidia.com/gpu": "8"},
    )
    inv = on_the_wire(kube)
    assert inv.pool == "a100:spot"
    assert placed_whole_gpu(inv)


#: An 8x A100-SXM4-40GB node under the mixed strategy (GFD's "MIG 'mixed' strategy" table: a
#: ``nvidia.com/mig-<profile>.count`` label per profile; ``gpu.count`` the physical GPUs).
A100_MIXED = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "40960",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
}


def mig_job(job_id: str, profile: str) -> JobSpec:
    return JobSpec(job_id=job_id, tenant="acme", gpus=1, mig_profile=profile, cause_id=job_id)


def test_mixed_strategy_gpus_in_mig_mode_are_left_out_and_mig_jobs_wait() -> None:
    """GPUs 6 and 7 of 8 H100s in MIG mode, each cut into two 3g.40gb (a mig-parted custom
    config): the device plugin serves 6 ``nvidia.com/gpu`` and 4 ``nvidia.com/mig-3g.40gb``
    (k8s-device-plugin's mixed strategy: ``gpu.count`` every physical GPU, a
    ``mig-<profile>.count`` label per profile). The bridge once published GPUs 6 and 7 as
    MIG-enabled without their instances, and the slicer planned its own layout on them: a
    1g.10gb job was placed on an instance the node does not serve. An inventory carries no
    instances yet, so the MIG GPUs are left out (`gpus_left_out` says so) and MIG jobs wait."""
    labels = {
        **H100_MIG_OFF,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "custom-6-whole-2-2x3g.40gb",
        "nvidia.com/mig-3g.40gb.count": "4",
        "nvidia.com/mig-3g.40gb.memory": "40192",
    }
    kube = operator_node(labels, {"nvidia.com/gpu": "6", "nvidia.com/mig-3g.40gb": "4"})
    inv = on_the_wire(kube)
    assert len(inv.gpus) == 6
    assert not any(g.mig_enabled for g in inv.gpus)
    assert {g.model for g in inv.gpus} == {"NVIDIA-H100-80GB-HBM3"}
    got = placed(inv, *(whole(f"w{i}") for i in range(6)))
    assert [p.kind for p in got] == ["whole"] * 6
    assert placed(inv, mig_job("small", "1g.10gb"), mig_job("big", "3g.40gb")) == []
    said = gpus_left_out(kube)
    assert said is not None
    assert "2 GPUs in MIG mode" in said
    assert "{'3g.40gb': 4}" in said


def test_mixed_strategy_with_every_gpu_in_mig_mode_publishes_no_gpus_and_says_why() -> None:
    """All 8 A100s cut ``all-1g.5gb`` (mig-parted): ``nvidia.com/gpu`` is 0, 56 instances. The
    node's CPU and memory are published, its 8 MIG GPUs left out (said)."""
    labels = {
        **A100_MIXED,
        "nvidia.com/mig.config": "all-1g.5gb",
        "nvidia.com/mig-1g.5gb.count": "56",
        "nvidia.com/mig-1g.5gb.memory": "4864",
    }
    kube = operator_node(labels, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "56"})
    inv = on_the_wire(kube)
    assert inv.gpus == []
    assert inv.cpu_milli == 191_450
    assert placed(inv, mig_job("m", "1g.5gb")) == []
    said = gpus_left_out(kube)
    assert said is not None
    assert "8 GPUs in MIG mode" in said


def test_mig_instances_no_gpu_count_can_carry_get_the_node_no_inventory() -> None:
    labels = {k: v for k, v in A100_MIXED.items() if k != "nvidia.com/gpu.count"}
    kube = operator_node(labels, {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.5gb": "28"})
    with pytest.raises(UndescribedNode) as got:
        node_inventory(kube, AT, key=KEY)
    assert got.value.reason == "mig_gpus_unknown"
    assert "nvidia.com/gpu.count=(none)" in got.value.detail


def test_single_strategy_mig_devices_get_the_node_no_inventory_rather_than_a_wrong_one() -> None:
    """GFD's single strategy overrides gpu.product and gpu.count with the MIG devices' (16x
    ``A100-SXM4-80GB-MIG-3g.40gb``): the bridge once published 16 "GPUs" the slicer read as
    16 whole A100s it could cut (and dropped without a word: more than 8)."""
    labels = {**H100_MIG_OFF, "nvidia.com/mig.strategy": "single",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
              "nvidia.com/gpu.count": "16", "nvidia.com/gpu.memory": "40192",
              "nvidia.com/mig.config": "all-3g.40gb"}  # fmt: skip
    with pytest.raises(UndescribedNode) as got:
        node_inventory(operator_node(labels, {"nvidia.com/gpu": "16"}), AT, key=KEY)
    assert got.value.reason == "mig_single_strategy"


def test_an_inventory_of_more_gpus_than_the_slicer_models_is_dead_lettered_with_why() -> None:
    """A 16-GPU node (a DGX-2's V100s): the scheduler models at most 8 per node and dropped it
    without a word; now the slicer refuses it (term + dead letter), counted and logged."""
    kube = operator_node({"nvidia.com/gpu.product": "Tesla-V100-SXM3-32GB",
                          "nvidia.com/gpu.count": "16", "nvidia.com/gpu.memory": "32768"},
                         {"nvidia.com/gpu": "16"})  # fmt: skip
    inv = on_the_wire(kube)
    decider, registry = slicer()
    d = Delivery(event=inv, subject=telemetry.inventory(inv.node), stream_seq=1, num_delivered=1,
                 received_at=AT)  # fmt: skip
    with capture_logs() as logs:
        refused = decider.check(d)
    assert refused is not None
    assert refused.kind == "too_many_gpus"
    assert inv.node in str(refused)
    assert "16 GPUs" in str(refused)
    (said,) = [e for e in logs if e["event"] == "slicer_node_fact_refused"]
    assert said["kind"] == "too_many_gpus"
    counted = registry.get_sample_value(
        "seedance_slicer_refused_node_facts_total", {"reason": "too_many_gpus"}
    )
    assert counted == 1


def gke_node(accelerator: str, gpus: str, **extra: str) -> dict[str, Any]:
    """A GKE Standard node pool's node as GKE labels it: no GPU feature discovery, Google's
    own device plugin serving ``nvidia.com/gpu``, the accelerator type as a label."""
    labels = {
        "cloud.google.com/gke-accelerator": accelerator,
        "cloud.google.com/gke-gpu": "true",
        "cloud.google.com/gke-gpu-driver-version": "default",
        "cloud.google.com/gke-nodepool": "gpu-pool",
        "node.kubernetes.io/instance-type": "a3-highgpu-8g",
        **extra,
    }
    return operator_node(labels, {"nvidia.com/gpu": gpus})


def test_a_gke_node_without_gfd_is_named_by_its_accelerator_and_billed_as_that_gpu() -> None:
    """GKE's a3-highgpu-8g: the bridge once published 8 GPUs of model ``unknown``, billed at
    the price book's fallback (`default_price_book()`'s fallback row, not its H100 row)."""
    book = default_price_book()
    inv = on_the_wire(gke_node("nvidia-h100-80gb", "8"))
    assert [g.model for g in inv.gpus] == ["H100-SXM5-80GB"] * 8
    price = book.lookup(inv.gpus[0].model)
    assert price.model == "H100-SXM5-80GB"
    assert not price.fallback
    assert placed_whole_gpu(inv)
    # The A2 Standard's nvidia-tesla-a100 is the 40 GB A100, which the name alone is not.
    (a100,) = {g.model for g in on_the_wire(gke_node("nvidia-tesla-a100", "8")).gpus}
    assert book.lookup(a100).model == "A100-SXM4-40GB"
    # A value whose form factor or memory the name does not fix stays unknown.
    assert {g.model for g in on_the_wire(gke_node("nvidia-tesla-v100", "8")).gpus} == {"unknown"}


def test_a_gke_gpu_of_a_certain_model_has_its_memory_below_what_the_driver_reports() -> None:
    """GKE writes no memory label: the bridge once published ``mem_total_mib`` 0 for every GKE
    GPU. Where the model is certain it is the identity's marketed size (decimal GB) as MiB,
    below the driver's own figure (GFD's ``gpu.memory`` of the same parts in this file and
    tests/unit/k8s_bridge/test_nodes_gfd.py: H100 81559, L4 23028, T4 15360)."""
    mem = {
        acc: {g.mem_total_mib for g in on_the_wire(gke_node(acc, "8")).gpus}
        for acc in ("nvidia-h100-80gb", "nvidia-l4", "nvidia-tesla-t4", "nvidia-tesla-v100")
    }
    assert mem == {
        "nvidia-h100-80gb": {76293}, "nvidia-l4": {22888}, "nvidia-tesla-t4": {15258},
        "nvidia-tesla-v100": {0},  # model unknown: memory unknown
    }  # fmt: skip


@pytest.mark.parametrize("strategy", ["time-sharing", "TIME_SHARING", "mps", "MPS"])
def test_gke_gpu_sharing_counts_physical_gpus_however_the_strategy_is_spelled(
    strategy: str,
) -> None:
    """GKE's sharing label as the how-to pages' node selectors spell it (``time-sharing``,
    ``mps``) or as the API's ``GPUSharingStrategy`` enum does (``TIME_SHARING``, ``MPS``); NVIDIA
    MPS serves each GPU once per client as time-sharing does ("Share GPUs with multiple workloads
    using NVIDIA MPS": allocatable ``nvidia.com/gpu`` = GPUs x max-shared-clients). A g2 node
    of 2 L4s, 4 clients each: the bridge once published 8 GPUs for all but ``time-sharing``."""
    shared = gke_node(
        "nvidia-l4", "8",
        **{"cloud.google.com/gke-gpu-sharing-strategy": strategy,
           "cloud.google.com/gke-max-shared-clients-per-gpu": "4"},
    )  # fmt: skip
    assert [g.model for g in on_the_wire(shared).gpus] == ["L4-PCIE-24GB"] * 2


def test_gke_time_sharing_counts_physical_gpus_and_mig_partitions_get_no_inventory() -> None:
    shared = gke_node(
        "nvidia-l4", "8",
        **{"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
           "cloud.google.com/gke-max-shared-clients-per-gpu": "4"},
    )  # fmt: skip
    assert [g.model for g in on_the_wire(shared).gpus] == ["L4-PCIE-24GB"] * 2
    mig = gke_node(
        "nvidia-a100-80gb", "14", **{"cloud.google.com/gke-gpu-partition-size": "1g.10gb"}
    )
    with pytest.raises(UndescribedNode) as got:
        node_inventory(mig, AT, key=KEY)
    assert got.value.reason == "gke_gpu_partitions"


def test_gpus_of_gpu_count_served_neither_whole_nor_as_instances_are_said() -> None:
    """Mixed strategy, GPUs 6 and 7 in MIG mode with no instances cut yet (GFD lists no
    ``mig-<profile>.count``; ``gpu.count`` still counts them): 6 whole GPUs were published
    without a word about the other 2."""
    labels = {**A100_MIXED, "nvidia.com/mig.config": "custom-6-whole-2-empty"}
    kube = operator_node(labels, {"nvidia.com/gpu": "6"})
    assert len(on_the_wire(kube).gpus) == 6
    said = gpus_left_out(kube)
    assert said is not None
    assert said.startswith("2 of nvidia.com/gpu.count=8 GPUs served neither")
