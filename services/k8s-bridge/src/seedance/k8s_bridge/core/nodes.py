"""A Node (the API's JSON) to the `NodeInventory` the slicer places on.

Owns which Node fields describe the node to the slicer: ``status.allocatable`` (what pods may
use, after the kubelet's reservations; ``capacity`` when allocatable lacks a resource) for cpu,
memory and ``nvidia.com/gpu``, and GPU feature discovery's labels for the model
(``nvidia.com/gpu.product``), the memory per GPU in MiB (``nvidia.com/gpu.memory``) and MIG
capability (``nvidia.com/mig.capable``). MIG *mode* is never read from
``nvidia.com/mig.strategy``: the GPU operator sets one strategy for the cluster and GFD writes
it on every GPU node, MIG on or off. The product label is published as
GFD writes it (what the bridge observes); the one GPU identity (``seedance.events.gpus``)
reads what it implies: with time-slicing (``Tesla-T4-SHARED``, ``nvidia.com/gpu.replicas``)
``nvidia.com/gpu`` counts each GPU once per replica, so the inventory holds the physical GPUs
(allocatable / replicas), never a fleet four times its size to bill; with the MIG single
strategy (``...-MIG-3g.40gb``) each GPU of the inventory is a MIG device. A Node carries no GPU
UUIDs: the inventory's are empty. Where a telemetry collector (NVML) or a simulated node agent
runs, it publishes the node's inventory and the bridge's ``publish_inventory`` is off (one
publisher per node: docs/k8s-bridge.md, "Who publishes a node's inventory").

A node's state (`NodeState`): ``cordoned`` where nothing new may land but what runs stays:
``spec.unschedulable`` (``kubectl cordon``, which also sets the taint
``node.kubernetes.io/unschedulable``), a not-ready node (``Ready`` condition not True, or the
``node.kubernetes.io/not-ready`` / ``unreachable`` taints), or the taint an autoscaler puts on
a node it is about to delete (cluster-autoscaler's ``ToBeDeletedByClusterAutoscaler``,
Karpenter's ``karpenter.sh/disrupted``); the node keeps its description, so the slicer keeps
the jobs placed there. ``removed`` for a deleted Node (published with no resources): the slicer
evicts and re-queues its jobs, and their billing ends then. A node Seedance itself cordoned and
tainted for release (`seedance.k8s_bridge.core.release`) stays ``ready``: the slicer's own hold
keeps work away from it. Other taints (a GPU pool's own
``nvidia.com/gpu:NoSchedule``, which GPU pods tolerate) say nothing about draining.

The event id is derived from the node's uid and the observation time: the tracker publishes an
inventory only when it differs from the last one it published, and a re-published unchanged
one (after a restart) is an idempotent upsert for the slicer. (An id from the content alone
would drop an A -> B -> A change inside the duplicate window.) The id is keyed with the bridge's
secret (`seedance.core.id_key`, as its job events'): a node's user publishes its own inventory
into ``SEEDANCE_TELEMETRY``, whose duplicate window is the stream's, so with an id it could
compute (a node uid and a millisecond) it could spend the bridge's inventory of another node
first and have it dropped as a duplicate. Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from seedance.events.base import derived_event_id
from seedance.events.gpus import identify
from seedance.events.telemetry import GpuInfo, NodeInventory, NodeState
from seedance.events.tokens import InvalidToken, check_token, kube_node_token
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.quantity import parse_quantity, to_mib, to_milli
from seedance.k8s_bridge.core.release import is_ours

__all__ = [
    "DRAINING_TAINTS",
    "UNDESCRIBED",
    "UndescribedNode",
    "node_inventory",
    "node_pool",
    "node_state",
    "node_usable",
    "same_inventory",
]

#: Why a Node gets no inventory (the closed set of `UndescribedNode.reason`).
UNDESCRIBED = ("invalid_pool",)


class UndescribedNode(ValueError):
    """A Node whose inventory the bridge cannot publish truthfully: it publishes none for it
    (the slicer keeps what it last had), and the shell logs and counts ``reason``."""

    def __init__(self, node: str, reason: str, detail: str) -> None:
        super().__init__(f"node {node!r}: {detail}")
        self.node, self.reason, self.detail = node, reason, detail


#: Taints that mean the node is going or gone, whatever their effect.
DRAINING_TAINTS = frozenset({
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
})  # fmt: skip

Json = Mapping[str, Any]
#: The taint the node lifecycle controller adds for ``spec.unschedulable``.
_OWN_CORDON = frozenset({"node.kubernetes.io/unschedulable"})


def node_usable(node: Json) -> bool:
    """Ready, not cordoned, and not tainted as going away. A cordon that is Seedance's own
    release mark (`seedance.k8s_bridge.core.release`) is not one: the slicer holds that node
    empty itself and must be free to take it back."""
    spec = node.get("spec") or {}
    ours = is_ours(node)
    if spec.get("unschedulable") and not ours:
        return False
    draining = DRAINING_TAINTS - _OWN_CORDON if ours else DRAINING_TAINTS
    if any(t.get("key") in draining for t in spec.get("taints") or []):
        return False
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return True  # a node without conditions yet (a test server, a fresh registration)


def _resource(status: Json, name: str) -> Any:
    alloc = status.get("allocatable") or {}
    if name in alloc:
        return alloc[name]
    return (status.get("capacity") or {}).get(name, 0)


def _int_label(labels: Json, key: str, default: int) -> int:
    try:
        return int(labels.get(key, default))
    except (TypeError, ValueError):
        return default


def node_pool(name: str, labels: Json) -> str:
    """The node's slicer pool: its ``seedance.io/pool`` label (``default`` without one), as a
    subject token. A label value may hold dots (``a100.spot``) where a token may not: like a
    node name (`kube_node_token`), each ``.`` becomes ``:`` (never in a label value, so it is
    reversible), and the pool is ``a100:spot``.

    Raises:
        UndescribedNode: a value that is no token even so (an empty one).
    """
    raw = labels.get(keys.LABEL_POOL, "default")
    try:
        return check_token("pool", str(raw).replace(".", ":"))
    except InvalidToken as exc:
        raise UndescribedNode(name, "invalid_pool", f"label {keys.LABEL_POOL}: {exc}") from None


def node_state(node: Json, *, deleted: bool = False) -> NodeState:
    if deleted:
        return NodeState.REMOVED
    return NodeState.READY if node_usable(node) else NodeState.CORDONED


def node_inventory(node: Json, at: datetime, *, key: bytes, deleted: bool = False) -> NodeInventory:
    """The inventory of ``node`` at ``at`` (the bridge's observation time), its id keyed with
    ``key`` (the bridge's secret: see the module docstring).

    Raises:
        InvalidQuantity: an allocatable quantity that does not parse.
        UndescribedNode: a node whose labels cannot describe it (`UNDESCRIBED`).
    """
    md = node.get("metadata") or {}
    labels = md.get("labels") or {}
    status = node.get("status") or {}
    state = node_state(node, deleted=deleted)
    described = not deleted  # a cordoned node keeps its shape: its jobs hold GPU indices
    product = str(labels.get(keys.LABEL_GPU_PRODUCT, "unknown"))
    reported = identify(product)
    count = int(parse_quantity(_resource(status, keys.RES_GPU))) if described else 0
    if reported.shared:
        count //= max(1, _int_label(labels, keys.LABEL_GPU_REPLICAS, 1))
    mem_mib = _int_label(labels, keys.LABEL_GPU_MEMORY, 0)
    mig_capable = labels.get(keys.LABEL_MIG_CAPABLE) == "true"
    # ``nvidia.com/mig.strategy`` says how the device plugin would serve MIG devices, not that
    # any GPU is in MIG mode: the GPU operator sets one strategy cluster-wide (``single`` by
    # default) and GFD writes it on every GPU node, MIG on or off. What ``nvidia.com/gpu``
    # serves is a MIG device only where GFD's product says so (the single strategy's
    # ``...-MIG-<profile>``); otherwise it is a whole GPU.
    mig_device = reported.mig_profile is not None
    gpus = [
        GpuInfo(
            index=i,
            model=product,
            mem_total_mib=mem_mib,
            mig_capable=mig_capable,
            mig_enabled=mig_device,
        )
        for i in range(count)
    ]
    cpu = to_milli(parse_quantity(_resource(status, keys.RES_CPU))) if described else 0
    memory = to_mib(parse_quantity(_resource(status, keys.RES_MEMORY))) if described else 0
    name = kube_node_token(str(md.get("name", "")))
    body = NodeInventory(
        id="",
        at=at,
        node=name,
        pool=node_pool(name, labels),
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=gpus,
        state=state,
    )
    uid = str(md.get("uid") or name)
    ms = int(at.timestamp() * 1000)
    return msgspec.structs.replace(body, id=derived_event_id(uid, f"inventory/{ms}", ms, key=key))


def same_inventory(a: NodeInventory, b: NodeInventory) -> bool:
    """Whether two inventories of a node say the same (their ids and times aside)."""
    return msgspec.structs.replace(a, id="", at=b.at) == msgspec.structs.replace(b, id="")
