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
from typing import Any

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.events import decode, encode
from seedance.events.telemetry import NodeInventory
from seedance.events.tokens import kube_node_token
from seedance.k8s_bridge.core.nodes import node_inventory
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


def placed_whole_gpu(inv: NodeInventory) -> bool:
    sched = Scheduler()
    sched.upsert_node(node_spec(inv), 0.0)
    effects = sched.submit(JobSpec(job_id="j1", tenant="acme", gpus=1, cause_id="c"), 1.0)
    return any(isinstance(e, Placed) for e in effects)


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
    """An operator's mistake (the bridge's PUBLISH_INVENTORY on beside the NVML collector): the
    slicer still takes the last inventory whole, but says so instead of flipping silently."""
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
    labels = {**H100_MIG_OFF, "nvidia.com/mig.strategy": "mixed"}
    kube = operator_node(labels, {"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14"})
    kube["metadata"]["name"] = name
    bridge = decode(encode(node_inventory(kube, AT + timedelta(seconds=1), key=KEY)))
    assert isinstance(collector, NodeInventory)
    assert isinstance(bridge, NodeInventory)

    settings = SlicerSettings(pool="p")
    config = scheduler_config(settings)
    state = SlicerState(
        None,  # type: ignore[arg-type]  # never loaded nor committed here
        legacy_key="pool.p", config=config, parse_quota=lambda _doc: None,
    )  # fmt: skip
    registry = CollectorRegistry()
    metrics = SlicerMetrics(registry)
    decider = SlicerDecider(
        settings=settings, config=config, cluster_policy=ClusterPolicy(settings.policy),
        metrics=metrics,
    )  # fmt: skip
    decider.bind(_Durable(state))  # type: ignore[arg-type]  # the state is all it reads
    decider.id_key = bytes(32)
    with capture_logs() as logs:
        decider.apply(collector, AT)
        decider.apply(collector, AT)  # the same publisher again: nothing to say
        decider.apply(bridge, AT + timedelta(seconds=1))
    said = [e for e in logs if e["event"] == "slicer_inventory_publishers_disagree"]
    assert len(said) == 1
    (one,) = said
    assert one["node"] == node
    assert (one["before"], one["after"]) == ("nvml", "node-labels")
    assert one["before_shape"].startswith("8 GPUs NVIDIA H100 80GB HBM3 (2 in MIG mode, uuids")
    assert "NVIDIA-H100-80GB-HBM3" in one["after_shape"]
    assert one["after_shape"].endswith("no uuids)")
    counted = registry.get_sample_value("seedance_slicer_inventory_publisher_changes_total")
    assert counted == 1


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
