"""A node cannot spend the k8s-bridge's inventory id of another node (docs/security.md,
"Nats-Msg-Id"; the hostile review's ``p3_node_spends.py`` (a)). A node's user publishes its own
inventory into ``SEEDANCE_TELEMETRY``, the stream the bridge's inventories go to (one duplicate
window); the bridge derived an inventory's id from the Node's uid (which any kubelet can read)
and the observation's millisecond, so a node spraying those ids on its own subject had the
bridge's inventory of another node dropped. Keyed with the bridge's secret, it is stored.

Real pinned server with the shipped authorization; the node publishes as ``node-agent``, the
bridge's real tracker's event as ``k8s-bridge`` under the key the bridge reads at start.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from seedance.core import Bus
from seedance.core.id_key import derived_id_key
from seedance.core.kv import ensure_bucket
from seedance.events import derived_event_id
from seedance.events.subjects import telemetry
from seedance.k8s_bridge.core.actions import Publish
from seedance.k8s_bridge.core.tracker import Tracker
from seedance.k8s_bridge.records import JOBS_BUCKET
from seedance.testing.identities import as_user

AT = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the bridge's observation time


def _node(name: str, uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid,
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8"}},
    }  # fmt: skip


async def test_a_node_cannot_spend_another_nodes_inventory_id(auth_url: str, admin: Bus) -> None:
    victim = str(uuid.uuid4())  # gpu-n2's Node uid
    ms = int(AT.timestamp() * 1000)
    node = await Bus.connect(as_user(auth_url, "node-agent", name="node-gpu-n1"))
    bridge = await Bus.connect(as_user(auth_url, "k8s-bridge", name="k8s-bridge"))
    try:
        spent = derived_event_id(victim, f"inventory/{ms}", ms)  # the unkeyed id
        headers = {"Nats-Msg-Id": spent}
        ack = await node.js.publish(telemetry.inventory("gpu-n1"), b"{}", headers=headers)
        assert not ack.duplicate
        key = await derived_id_key(await ensure_bucket(bridge, JOBS_BUCKET))
        (action,) = Tracker(instance="bridge-0", id_key=key).node_seen(_node("gpu-n2", victim), AT)
        assert isinstance(action, Publish)
        ack = await bridge.publish(action.subject, action.event)
        assert not ack.duplicate, "the bridge's inventory of gpu-n2 was dropped as a duplicate"
        assert ack.stream == "SEEDANCE_TELEMETRY"
        assert action.event.id != spent
    finally:
        await node.close()
        await bridge.close()
