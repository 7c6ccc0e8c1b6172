"""Nodes labelled by NVIDIA's GPU feature discovery, as the GPU operator leaves them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from seedance.core import WallClock
from seedance.events import derived_event_id
from seedance.events.telemetry import NodeInventory, NodeState
from seedance.k8s_bridge.cluster_view import ClusterView
from seedance.k8s_bridge.core import nodes
from seedance.k8s_bridge.core.nodes import UndescribedNode, node_inventory
from seedance.k8s_bridge.core.tracker import Action, Publish, Tracker
from seedance.k8s_bridge.metrics import BridgeMetrics
from seedance.k8s_bridge.settings import BridgeSettings

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
    inv = node_inventory(node, AT, key=b"k" * 32)
    assert len(inv.gpus) == 4
    assert {g.model for g in inv.gpus} == {"Tesla-T4-SHARED"}  # as GFD wrote it
    assert {g.mem_total_mib for g in inv.gpus} == {15360}


def test_a_whole_gpu_node_keeps_the_product_label_and_its_count() -> None:
    node = gfd_node(
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.capable": "true"},
        gpus="8",
    )
    inv = node_inventory(node, AT, key=b"k" * 32)
    assert [g.model for g in inv.gpus] == ["NVIDIA-A100-SXM4-80GB"] * 8
    assert all(g.mig_capable and not g.mig_enabled for g in inv.gpus)


@pytest.mark.parametrize(
    "product",
    # MIG device names the GPU identity holds unknown (no GPU can hold them): still MIG devices
    ["NVIDIA-A100-SXM4-80GB-MIG-9g.80gb", "NVIDIA-A100-SXM4-80GB-MIG-4c.3g.40gb"],
)
def test_a_mig_device_no_gpu_can_hold_is_still_the_single_strategy(product: str) -> None:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/mig.capable": "true"}
    with pytest.raises(UndescribedNode) as info:
        node_inventory(gfd_node(labels, gpus="4"), AT, key=b"k" * 32)
    assert info.value.reason == "mig_single_strategy"


def test_under_the_mig_single_strategy_the_node_gets_no_inventory_and_the_bridge_says_why() -> None:
    """The single strategy serves MIG devices as ``nvidia.com/gpu`` and overrides gpu.count
    with their number: the slicer models physical GPUs whose layouts it plans, and the labels
    do not say how many carry these 16 devices (tests/unit/slicer/test_bridge_inventory.py)."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.memory": "40192",
    }
    v = _View()
    with capture_logs() as logs:
        v.view._on_node("ADDED", gfd_node(labels, gpus="16"))
        v.view._on_node("MODIFIED", gfd_node(labels, gpus="16"))  # said once while it stands
    assert v.enqueued == []
    (said,) = [e for e in logs if e["event"] == "bridge_node_undescribed"]
    assert said["reason"] == "mig_single_strategy"
    assert "16 MIG devices" in said["detail"]
    assert v.undescribed("mig_single_strategy") == 1
    v.view._on_node("DELETED", gfd_node(labels, gpus="16"))
    assert v.undescribed("mig_single_strategy") is None


def test_the_inventory_id_is_keyed_with_the_bridges_key() -> None:
    """A node's user publishes into SEEDANCE_TELEMETRY: an inventory id it could compute (node
    uid, millisecond) it could spend first and have the bridge's inventory of a node dropped."""
    node = gfd_node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, gpus="8")
    ms = int(AT.timestamp() * 1000)
    unkeyed = derived_event_id("u-1", f"inventory/{ms}", ms)  # what a node can compute
    (published,) = Tracker(instance="bridge-0", id_key=b"k" * 32).node_seen(node, AT)
    assert published.event.id == node_inventory(node, AT, key=b"k" * 32).id != unkeyed
    assert node_inventory(node, AT, key=b"o" * 32).id != published.event.id


def test_two_different_inventories_of_a_node_in_one_millisecond_get_two_ids() -> None:
    """An id from the node's uid and the millisecond alone made the second of two different
    inventories observed in one millisecond (an update, then the deletion) a duplicate of the
    first: the stream dropped the removal and the slicer kept placing on a deleted node. The
    same observation published twice (a restarted bridge) keeps one id."""
    node = gfd_node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, gpus="8")
    ready = node_inventory(node, AT, key=b"k" * 32)
    removed = node_inventory(node, AT, key=b"k" * 32, deleted=True)
    cordoned = node_inventory({**node, "spec": {"unschedulable": True}}, AT, key=b"k" * 32)
    assert len({ready.id, removed.id, cordoned.id}) == 3
    assert node_inventory(node, AT, key=b"k" * 32).id == ready.id


class _View:
    """The bridge's ClusterView with a leader's tracker, its informers never run: what one
    Node watch event becomes (the actions enqueued), logged and counted."""

    def __init__(self, settings: BridgeSettings | None = None) -> None:
        async def unused(*args: Any) -> Any:
            raise AssertionError("the informers do not run here")

        api = {
            f"{v}_{k}": unused for v in ("list", "watch") for k in ("pods", "nodes", "namespaces")
        }
        self.registry = CollectorRegistry()
        self.enqueued: list[Action] = []
        tracker = Tracker(instance="bridge-0", id_key=b"k" * 32)
        self.view = ClusterView(
            type("Api", (), api)(), WallClock(), settings or BridgeSettings(),
            BridgeMetrics(self.registry), tracker=lambda: tracker, enqueue=self.enqueued.extend,
            on_restart=lambda r, c: None,
        )  # fmt: skip

    def undescribed(self, reason: str) -> float | None:
        return self.registry.get_sample_value(
            "seedance_k8s_bridge_nodes_undescribed", {"node": "gpu-1", "reason": reason}
        )


def test_a_node_whose_pool_label_is_no_token_gets_no_inventory_and_says_why() -> None:
    """An empty ``seedance.io/pool`` (a valid label value) maps to no pool: nothing is published
    for the node, a warning and a gauge name it and why, until its label is fixed."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "seedance.io/pool": ""}
    with pytest.raises(UndescribedNode, match=r"seedance\.io/pool"):
        node_inventory(gfd_node(labels, gpus="8"), AT, key=b"k" * 32)
    v = _View()
    with capture_logs() as logs:
        v.view._on_node("ADDED", gfd_node(labels, gpus="8"))
    assert v.enqueued == []
    (said,) = [e for e in logs if e["event"] == "bridge_node_undescribed"]
    assert (said["node"], said["reason"]) == ("gpu-1", "invalid_pool")
    assert v.undescribed("invalid_pool") == 1
    v.view._on_node("MODIFIED", gfd_node({**labels, "seedance.io/pool": "a100.spot"}, gpus="8"))
    (published,) = v.enqueued
    assert isinstance(published, Publish)
    assert isinstance(published.event, NodeInventory)
    assert published.event.pool == "a100:spot"
    assert v.undescribed("invalid_pool") is None


def test_time_slicing_renamed_to_gpu_shared_is_left_out_and_said_once() -> None:
    """The device plugin's time-slicing config with ``renameByDefault: true`` serves 8 A10Gs x4
    as ``nvidia.com/gpu.shared``, which no pod Seedance places asks for: the node is published
    with its CPU and memory and no GPU, and the bridge says why (before: 0 GPUs, no word)."""
    node = gfd_node(
        {
            "nvidia.com/gpu.product": "NVIDIA-A10G-SHARED",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.memory": "23028",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
        },
        gpus="0",
    )
    del node["status"]["allocatable"]["nvidia.com/gpu"]
    node["status"]["allocatable"]["nvidia.com/gpu.shared"] = "32"
    v = _View()
    with capture_logs() as logs:
        v.view._on_node("ADDED", node)
        v.view._on_node("MODIFIED", node)
    (published,) = v.enqueued
    assert isinstance(published, Publish)
    assert isinstance(published.event, NodeInventory)
    assert published.event.gpus == []
    assert published.event.cpu_milli == 32_000
    (said,) = [e for e in logs if e["event"] == "bridge_node_gpus_left_out"]
    assert said["node"] == "gpu-1"
    assert "32 nvidia.com/gpu.shared" in said["detail"]


def test_a_bridge_that_does_not_publish_inventories_still_says_a_node_is_gone() -> None:
    """The dev overlay: simulated node agents publish each node's inventory, the bridge none
    (`PUBLISH_INVENTORY=false`). A deleted Node's agent is deleted with it, so nothing else
    says the node is gone: the bridge publishes its removal (no resources, ``removed``),
    which the slicer takes as it always has (evicts and re-queues its jobs). Before, with the
    inventory off, the deletion was not published and the slicer kept placing on the node."""
    v = _View(BridgeSettings(publish_inventory=False))
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    v.view._on_node("ADDED", gfd_node(labels, gpus="8"))
    v.view._on_node("MODIFIED", gfd_node(labels, gpus="8"))
    assert v.enqueued == []
    v.view._on_node("DELETED", gfd_node(labels, gpus="8"))
    (removed,) = v.enqueued
    assert isinstance(removed, Publish)
    assert isinstance(removed.event, NodeInventory)
    assert (removed.event.node, removed.event.state, removed.event.gpus) == (
        "gpu-1", NodeState.REMOVED, [],
    )  # fmt: skip


def test_mixed_strategy_gpus_in_mig_mode_are_left_out_said_once_and_again_when_they_change() -> (
    None
):
    """Mixed strategy, GPUs 6 and 7 in MIG mode: the inventory holds the 6 whole GPUs (an
    inventory carries no MIG instances) and the bridge names the MIG GPUs it leaves out."""
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "custom-6-whole-2-2x3g.40gb",
        "nvidia.com/mig-3g.40gb.count": "4",
    }  # fmt: skip
    node = gfd_node(labels, gpus="6")
    node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "4"
    v = _View()
    with capture_logs() as logs:
        v.view._on_node("ADDED", node)
        v.view._on_node("MODIFIED", node)  # said once while it stands
    (published,) = v.enqueued
    assert isinstance(published, Publish)
    assert isinstance(published.event, NodeInventory)
    assert [g.mig_enabled for g in published.event.gpus] == [False] * 6
    (said,) = [e for e in logs if e["event"] == "bridge_node_gpus_left_out"]
    assert "2 GPUs in MIG mode" in said["detail"]
    # The mig-manager cuts a third GPU: said again, with the new count.
    more = gfd_node({**labels, "nvidia.com/mig-3g.40gb.count": "6"}, gpus="5")
    more["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "6"
    with capture_logs() as logs:
        v.view._on_node("MODIFIED", more)
    (said,) = [e for e in logs if e["event"] == "bridge_node_gpus_left_out"]
    assert "3 GPUs in MIG mode" in said["detail"]


def test_a_published_node_that_turns_undescribed_is_published_cordoned_keeping_its_shape() -> None:
    """An H100 node published with MIG off (8 whole GPUs), then switched by the mig-manager to
    ``all-3g.40gb`` under the operator's default single strategy (GFD: product
    ``...-MIG-3g.40gb``, gpu.count 16; 16 ``nvidia.com/gpu``). The bridge once only logged:
    the slicer kept 8 whole GPUs there and bound ``nvidia.com/gpu: 1`` pods that got a
    3g.40gb slice. Now the node is published ``cordoned`` with its last shape (its jobs keep
    their GPUs, nothing new lands), said in the warning, until it can be described."""
    off = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.config": "all-disabled",
    }  # fmt: skip
    on = {
        **off, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
        "nvidia.com/gpu.count": "16", "nvidia.com/mig.config": "all-3g.40gb",
    }  # fmt: skip
    v = _View()
    v.view._on_node("ADDED", gfd_node(off, gpus="8"))
    (ready,) = v.enqueued
    assert isinstance(ready, Publish)
    assert isinstance(ready.event, NodeInventory)
    v.enqueued.clear()
    with capture_logs() as logs:
        v.view._on_node("MODIFIED", gfd_node(on, gpus="16"))
        v.view._on_node("MODIFIED", gfd_node(on, gpus="16"))  # published and said once
    (held,) = v.enqueued
    assert isinstance(held, Publish)
    assert isinstance(held.event, NodeInventory)
    assert held.event.state is NodeState.CORDONED
    assert held.event.gpus == ready.event.gpus
    assert held.event.id != ready.event.id
    (said,) = [e for e in logs if e["event"] == "bridge_node_undescribed"]
    assert said["reason"] == "mig_single_strategy"
    assert said["held"].startswith("cordoned")
    assert v.undescribed("mig_single_strategy") == 1
    v.enqueued.clear()
    v.view._on_node("MODIFIED", gfd_node(off, gpus="8"))  # MIG off again: ready
    (back,) = v.enqueued
    assert isinstance(back, Publish)
    assert isinstance(back.event, NodeInventory)
    assert back.event.state is NodeState.READY
    assert v.undescribed("mig_single_strategy") is None


@pytest.mark.parametrize("publish", [True, False])
def test_a_deleted_node_whose_pool_label_is_no_token_is_still_published_removed(
    publish: bool,
) -> None:
    """``seedance.io/pool=""`` (a valid label value, no token): the pool check raised before the
    removal was built, so the deletion was lost and the slicer kept placing on a node that was
    gone. The removal is published (pool ``default``: no slicer reads a removal's pool)."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "seedance.io/pool": ""}
    v = _View(BridgeSettings(publish_inventory=publish))
    v.view._on_node("DELETED", gfd_node(labels, gpus="8"))
    (removed,) = v.enqueued
    assert isinstance(removed, Publish)
    assert isinstance(removed.event, NodeInventory)
    assert (removed.event.node, removed.event.state, removed.event.pool) == (
        "gpu-1", NodeState.REMOVED, "default",
    )  # fmt: skip


def test_a_media_extension_profile_s_instances_are_counted_under_nvidias_name() -> None:
    """The device plugin's ``nvidia.com/mig-1g.10gb.me`` and GFD's ``...me.count`` are the
    instances of ``1g.10gb+me`` (a resource or label name has no ``+``)."""
    status = {"allocatable": {"nvidia.com/mig-1g.10gb.me": "2", "nvidia.com/mig-3g.40gb": "1"}}
    assert nodes._mig_instances(status, {}) == {"1g.10gb+me": 2, "3g.40gb": 1}
    labels = {"nvidia.com/mig-1g.10gb.me.count": "3"}
    assert nodes._mig_instances({}, labels) == {"1g.10gb+me": 3}
