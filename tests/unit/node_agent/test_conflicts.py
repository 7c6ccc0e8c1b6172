"""Whether another device plugin serves a resource the agent would serve (``core.conflicts``):
the Node's allocatable says a live plugin serves it, the kubelet's pod-resources corroborates
and names its devices; the message says what to switch off."""

from __future__ import annotations

from seedance.node_agent.core.conflicts import DEVICE_PLUGIN_LABEL, plugin_conflicts

GPU = "nvidia.com/gpu"
IDS = [f"GPU-{i}" for i in range(6)]


def test_a_live_plugin_of_the_resource_is_a_conflict_with_what_to_switch_off() -> None:
    (c,) = plugin_conflicts(
        "gpu-1",
        [GPU, "seedance.io/gpu-milli"],
        node_allocatable={GPU: 6},
        kubelet_ids={GPU: IDS},
        sockets=["nvidia-gpu.sock"],
    )
    assert (c.resource, c.allocatable, c.kubelet_ids) == (GPU, 6, tuple(IDS))
    assert c.message.startswith(f"{GPU} is already served on node gpu-1 by another device plugin")
    listed = "the kubelet lists 6 device(s) for it (GPU-0, GPU-1, GPU-2, GPU-3, and 2 more)"
    assert listed in c.message
    assert "besides the kubelet's: nvidia-gpu.sock" in c.message
    assert f"label the node {DEVICE_PLUGIN_LABEL}=false" in c.message


def test_a_disconnected_plugin_is_not_a_conflict() -> None:
    # The kubelet still lists a gone plugin's devices (the agent's own earlier process's, or
    # NVIDIA's once switched off), but counts none of them healthy.
    assert plugin_conflicts("gpu-1", [GPU], node_allocatable={GPU: 0}, kubelet_ids={GPU: IDS}) == []
    assert plugin_conflicts("gpu-1", [GPU], node_allocatable={}, kubelet_ids={GPU: IDS}) == []


def test_a_node_count_the_kubelet_does_not_back_is_stale() -> None:
    assert plugin_conflicts("gpu-1", [GPU], node_allocatable={GPU: 4}, kubelet_ids={}) == []


def test_without_the_kubelets_answer_the_nodes_count_stands_alone() -> None:
    (c,) = plugin_conflicts("gpu-1", [GPU], node_allocatable={GPU: 4}, kubelet_ids=None)
    assert "the kubelet's pod-resources API did not answer" in c.message


def test_only_the_resources_the_agent_serves_are_looked_at() -> None:
    assert (
        plugin_conflicts(
            "gpu-1",
            ["seedance.io/gpu-milli"],
            node_allocatable={GPU: 4, "rdma/hca": 1},
            kubelet_ids={GPU: IDS, "rdma/hca": ["mlx5_0"]},
        )
        == []
    )
