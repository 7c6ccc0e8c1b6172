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

from datetime import UTC, datetime
from typing import Any

from seedance.events import decode, encode
from seedance.events.telemetry import NodeInventory
from seedance.k8s_bridge.core.nodes import node_inventory
from seedance.slicer.core.effects import Placed
from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.scheduler import Scheduler
from seedance.slicer.mapping import node_spec

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
