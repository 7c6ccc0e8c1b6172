"""Nodes labelled by NVIDIA's GPU feature discovery, as the GPU operator leaves them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from seedance.k8s_bridge.core.nodes import node_inventory

AT = datetime(2026, 3, 1, tzinfo=UTC)


def gfd_node(labels: dict[str, str], gpus: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-1", "uid": "u-1", "labels": labels},
        "status": {
            "allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": gpus},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_time_sliced_node_counts_its_physical_gpus_not_the_replicas() -> None:
    # The operator's time-slicing docs show this node: 4 T4s advertised 4 times each.
    node = gfd_node(
        {
            "nvidia.com/gpu.product": "Tesla-T4-SHARED",
            "nvidia.com/gpu.count": "4",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.memory": "15360",
        },
        gpus="16",
    )
    inv = node_inventory(node, AT)
    assert len(inv.gpus) == 4
    assert {g.model for g in inv.gpus} == {"Tesla-T4-SHARED"}  # as GFD wrote it
    assert {g.mem_total_mib for g in inv.gpus} == {15360}


def test_a_whole_gpu_node_keeps_the_product_label_and_its_count() -> None:
    node = gfd_node(
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.capable": "true"},
        gpus="8",
    )
    inv = node_inventory(node, AT)
    assert [g.model for g in inv.gpus] == ["NVIDIA-A100-SXM4-80GB"] * 8
    assert all(g.mig_capable and not g.mig_enabled for g in inv.gpus)


def test_under_the_mig_single_strategy_each_gpu_is_a_mig_device() -> None:
    node = gfd_node(
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.memory": "40192",
        },
        gpus="16",
    )
    inv = node_inventory(node, AT)
    assert len(inv.gpus) == 16
    assert all(g.mig_enabled for g in inv.gpus)
