"""A Node (the API's JSON) to the `NodeInventory` the slicer places on.

Owns which Node fields describe the node to the slicer: ``status.allocatable`` (what pods may
use, after the kubelet's reservations; ``capacity`` when allocatable lacks a resource) for cpu,
memory and ``nvidia.com/gpu``, and GPU feature discovery's labels for the model
(``nvidia.com/gpu.product``), the memory per GPU in MiB (``nvidia.com/gpu.memory``) and MIG
capability (``nvidia.com/mig.capable``). MIG *mode* is never read from
``nvidia.com/mig.strategy``: the GPU operator sets one strategy for the cluster and GFD writes
it on every GPU node, MIG on or off. The product label is published as GFD writes it (what the
bridge observes); the one GPU identity (``seedance.events.gpus``) reads what it implies: with
time-slicing (``Tesla-T4-SHARED``, ``nvidia.com/gpu.replicas``) ``nvidia.com/gpu`` counts each
GPU once per replica, so the inventory holds the physical GPUs (allocatable / replicas), never a
fleet four times its size to bill. Under the mixed MIG strategy the GPUs in MIG mode
(``nvidia.com/gpu.count`` less the whole ones, their instances served as
``nvidia.com/mig-<profile>``) are left out: an inventory carries no instances yet, and without
them the slicer would place MIG jobs on instances that do not exist. Without GFD (GKE) the model
is GKE's accelerator label where it is certain (`GKE_ACCELERATORS`). A node whose labels cannot
describe it (the single strategy's or GKE's MIG devices served as ``nvidia.com/gpu``: how many
physical GPUs carry them is not on the node) gets no inventory: `UndescribedNode`, whose reason
(`UNDESCRIBED`) the shell logs and gauges; GPUs served under a resource Seedance does not place,
or in MIG mode, are left out (`gpus_left_out`, said by the shell). A Node carries no GPU UUIDs:
the inventory's are empty. Where simulated node agents publish the nodes' inventories (the dev
overlay) ``publish_inventory`` is off; beside the base's NVML collector it is on (the bridge
alone says a node is cordoned or going, and alone describes GKE and CPU-only nodes), so a
GPU-operator node has two publishers: docs/k8s-bridge.md, "Who publishes a node's inventory".

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

The event id is derived from the node's uid, the observation time and the inventory's content:
the tracker publishes an inventory only when it differs from the last one it published, and a
re-published unchanged one (after a restart) is an idempotent upsert for the slicer. (An id from
the content alone would drop an A -> B -> A change inside the duplicate window; one from the
uid and the millisecond alone dropped the second of two different inventories of one node
observed in one millisecond, a Node's update and its deletion, say.) The id is keyed with the
bridge's secret (`seedance.core.id_key`, as its job events'): a node's user publishes its own
inventory into ``SEEDANCE_TELEMETRY``, whose duplicate window is the stream's, so with an id it
could compute (a node uid and a millisecond) it could spend the bridge's inventory of another
node first and have it dropped as a duplicate. Must not do I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from seedance.events.base import derived_event_id
from seedance.events.gpus import GKE_ACCELERATORS as _GKE_ACCELERATORS
from seedance.events.gpus import identify, mig_profile_of_resource
from seedance.events.telemetry import GpuInfo, NodeInventory, NodeState
from seedance.events.tokens import InvalidToken, check_token, kube_node_token
from seedance.k8s_bridge.core import keys
from seedance.k8s_bridge.core.quantity import parse_quantity, to_mib, to_milli
from seedance.k8s_bridge.core.release import is_ours

__all__ = [
    "DRAINING_TAINTS",
    "GKE_ACCELERATORS",
    "GKE_SHARED",
    "UNDESCRIBED",
    "UndescribedNode",
    "gke_sharing",
    "gpus_left_out",
    "held_cordoned",
    "node_inventory",
    "node_pool",
    "node_state",
    "node_usable",
    "same_inventory",
]

#: Why a Node gets no inventory (the closed set of `UndescribedNode.reason`).
UNDESCRIBED = ("invalid_pool", "mig_single_strategy", "mig_gpus_unknown", "gke_gpu_partitions")

#: GKE's ``cloud.google.com/gke-accelerator`` values whose GPU is certain: the GPU identity's
#: table (``seedance.events.gpus.GKE_ACCELERATORS``, where what is left out and why is said).
GKE_ACCELERATORS = _GKE_ACCELERATORS


#: GKE's GPU sharing strategies that serve each physical GPU once per client as
#: ``nvidia.com/gpu`` (``cloud.google.com/gke-max-shared-clients-per-gpu``): time-sharing and
#: NVIDIA MPS ("About GPU sharing strategies in GKE"; the API's ``GPUSharingStrategy`` enum,
#: ``TIME_SHARING`` / ``MPS``; the how-to pages' node selectors ``time-sharing`` / ``mps``).
GKE_SHARED = frozenset({"time-sharing", "mps"})


def gke_sharing(labels: Mapping[str, Any]) -> str:
    """GKE's sharing strategy label, normalised: lower case, ``_`` as ``-`` (``TIME_SHARING``,
    the API enum's spelling, is ``time-sharing``, the node selectors'); empty without one."""
    return str(labels.get(keys.LABEL_GKE_SHARING_STRATEGY, "")).strip().lower().replace("_", "-")


class UndescribedNode(ValueError):
    """A Node whose inventory the bridge cannot publish truthfully: it publishes none for it
    (the slicer keeps what it last had), and the shell logs and counts ``reason``."""

    def __init__(self, node: str, reason: str, detail: str) -> None:
        super().__init__(f"node {node!r}: {detail}")
        self.node, self.reason, self.detail = node, reason, detail
        #: What the tracker published for the node all the same (`held_cordoned`).
        self.held: list[Any] = []


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


def _removal_pool(name: str, labels: Json) -> str:
    """A deleted node's pool: its label's where that is a token, else ``default``. The removal
    must be published whatever the label (an empty one once lost it, and the slicer kept placing
    on a node that was gone); no slicer reads an inventory's pool (each node its consumer
    delivers joins its own pool: ``seedance.slicer.mapping``)."""
    try:
        return node_pool(name, labels)
    except UndescribedNode:
        return "default"


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
    name = kube_node_token(str(md.get("name", "")))
    product = _product(labels)
    gpus = _gpus(name, product, labels, status) if described else []
    cpu = to_milli(parse_quantity(_resource(status, keys.RES_CPU))) if described else 0
    memory = to_mib(parse_quantity(_resource(status, keys.RES_MEMORY))) if described else 0
    body = NodeInventory(
        id="",
        at=at,
        node=name,
        pool=node_pool(name, labels) if described else _removal_pool(name, labels),
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=gpus,
        state=state,
    )
    return msgspec.structs.replace(body, id=_inventory_id(md, body, key))


def held_cordoned(last: NodeInventory, node: Json, at: datetime, *, key: bytes) -> NodeInventory:
    """``last``, the node's last published inventory, ``cordoned`` at ``at``: for a node whose
    labels no longer describe it (`UndescribedNode`: the mig-manager switched it to the single
    strategy's MIG devices). Publishing nothing left the slicer placing on its old shape (8
    whole GPUs where the node now serves 3g.40gb devices); cordoned, it keeps that shape (its
    jobs hold GPU indices) and nothing new lands there until the node can be described."""
    md = node.get("metadata") or {}
    body = msgspec.structs.replace(last, at=at, state=NodeState.CORDONED)
    # Its own id seed: never the id of an inventory of the same millisecond.
    return msgspec.structs.replace(body, id=_inventory_id(md, body, key, "held"))


def _inventory_id(md: Json, body: NodeInventory, key: bytes, kind: str = "inventory") -> str:
    """The id of ``body`` (its own ``id`` left out of it): keyed, from the node's uid, the
    observation's millisecond and a digest of the content."""
    uid = str(md.get("uid") or body.node)
    ms = int(body.at.timestamp() * 1000)
    content = hashlib.blake2b(
        msgspec.json.encode(msgspec.structs.replace(body, id="")), digest_size=8
    )
    return derived_event_id(uid, f"{kind}/{ms}/{content.hexdigest()}", ms, key=key)


def _product(labels: Json) -> str:
    """GFD's ``nvidia.com/gpu.product`` as written; without GFD, GKE's accelerator label where
    its model is certain (`GKE_ACCELERATORS`); else ``unknown``."""
    if keys.LABEL_GPU_PRODUCT in labels:
        return str(labels[keys.LABEL_GPU_PRODUCT])
    return GKE_ACCELERATORS.get(str(labels.get(keys.LABEL_GKE_ACCELERATOR, "")), "unknown")


def _gke_mib(labels: Json, product: str) -> int:
    """A GKE GPU's memory in MiB (GKE writes no memory label) where its model is certain
    (`GKE_ACCELERATORS`): the identity's marketed size in decimal GB, as MiB rounded down, which
    is below what the driver reports (T4: 15258 here, 15360 by GFD; L4: 22888 and 23028; H100
    80GB: 76293 and 81559), so no job is placed on memory the GPU lacks. Else 0 (unknown)."""
    if keys.LABEL_GPU_PRODUCT in labels or product not in GKE_ACCELERATORS.values():
        return 0
    identity = identify(product).identity
    if identity is None or identity.memory_gb is None:
        return 0
    return identity.memory_gb * 10**9 // 2**20


def _mig_instances(status: Json, labels: Json) -> dict[str, int]:
    """The MIG instances served per profile under the mixed strategy: the device plugin's
    ``nvidia.com/mig-<profile>`` resources, else GFD's ``nvidia.com/mig-<profile>.count`` (the
    profile as NVIDIA writes it: the resource's ``1g.10gb.me`` is ``1g.10gb+me``)."""
    out: dict[str, int] = {}
    for res in {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}:
        if res.startswith(keys.MIG_PREFIX):
            profile = mig_profile_of_resource(res.removeprefix(keys.MIG_PREFIX))
            out[profile] = int(parse_quantity(_resource(status, res)))
    if not out:
        for label in labels:
            if label.startswith(keys.MIG_PREFIX) and label.endswith(".count"):
                suffix = label.removeprefix(keys.MIG_PREFIX).removesuffix(".count")
                profile = mig_profile_of_resource(suffix)
                out[profile] = _int_label(labels, label, 0)
    return {p: n for p, n in out.items() if n > 0}


def _served(name: str, product: str, labels: Json, status: Json) -> tuple[int, int, dict[str, int]]:
    """The node's whole GPUs, its GPUs in MIG mode, and their MIG instances per profile, as far
    as GFD's labels and the allocatable resources say.

    ``nvidia.com/gpu`` counts what the device plugin serves as one: a whole GPU; a time-sliced
    GPU once per replica (``-SHARED``: divided back); a MIG device under the single strategy.
    ``nvidia.com/mig.strategy`` never says a GPU is in MIG mode (the GPU operator writes its
    cluster-wide strategy, ``single`` by default, on every GPU node, MIG on or off).

    Raises:
        UndescribedNode: MIG devices whose physical GPUs the labels do not give.
    """
    reported = identify(product)
    served = int(parse_quantity(_resource(status, keys.RES_GPU)))
    if reported.mig_named and served:
        # The slicer models physical GPUs and plans their MIG layouts itself; GFD's single
        # strategy overrides gpu.product and gpu.count with the MIG devices', so how many
        # GPUs carry them is not on the node.
        raise UndescribedNode(
            name, "mig_single_strategy",
            f"{served} MIG devices {product!r} served as {keys.RES_GPU} (GFD's single "
            "strategy): the labels do not say how many physical GPUs carry them",
        )  # fmt: skip
    if keys.LABEL_GKE_GPU_PARTITION in labels and served:
        raise UndescribedNode(
            name, "gke_gpu_partitions",
            f"{served} GKE MIG partitions {labels[keys.LABEL_GKE_GPU_PARTITION]!s} served as "
            f"{keys.RES_GPU}: the labels do not say how many physical GPUs carry them",
        )  # fmt: skip
    if reported.shared:
        served //= max(1, _int_label(labels, keys.LABEL_GPU_REPLICAS, 1))
    elif gke_sharing(labels) in GKE_SHARED:
        # GKE advertises each shared GPU once per client it may have (time-sharing and MPS).
        served //= max(1, _int_label(labels, keys.LABEL_GKE_MAX_SHARED_CLIENTS, 1))
    mig = _mig_instances(status, labels)
    in_mig = 0
    if mig:
        # The mixed strategy: whole GPUs are nvidia.com/gpu, MIG-mode GPUs serve only their
        # instances, and gpu.count is every physical GPU.
        total = _int_label(labels, keys.LABEL_GPU_COUNT, -1)
        in_mig = total - served
        if in_mig <= 0:
            raise UndescribedNode(
                name, "mig_gpus_unknown",
                f"MIG instances {dict(sorted(mig.items()))} served beside {served} whole GPUs, "
                f"but {keys.LABEL_GPU_COUNT}="
                f"{labels.get(keys.LABEL_GPU_COUNT, '(none)')!s} leaves no GPU to carry them",
            )  # fmt: skip
    return served, in_mig, mig


def _gpus(name: str, product: str, labels: Json, status: Json) -> list[GpuInfo]:
    """The node's whole GPUs (`_served`). GPUs in MIG mode (the mixed strategy) are left out
    until an inventory can carry their instances: published without them, the slicer would
    plan its own layouts on them and place MIG jobs on instances that do not exist (a 1g.10gb
    job on GPUs cut 3g.40gb). MIG jobs wait instead; `gpus_left_out` says so.

    Raises:
        UndescribedNode: MIG devices whose physical GPUs the labels do not give.
    """
    served, _in_mig, mig = _served(name, product, labels, status)
    mem_mib = _int_label(labels, keys.LABEL_GPU_MEMORY, 0) or _gke_mib(labels, product)
    mig_capable = labels.get(keys.LABEL_MIG_CAPABLE) == "true" or bool(mig)
    return [
        GpuInfo(index=i, model=product, mem_total_mib=mem_mib, mig_capable=mig_capable,
                mig_enabled=False)
        for i in range(served)
    ]  # fmt: skip


def gpus_left_out(node: Json) -> str | None:
    """Why GPUs the node has are not in its inventory (None: none are left out).

    The device plugin's time-slicing with ``renameByDefault: true`` serves them as
    ``nvidia.com/gpu.shared``, which no pod Seedance places may ask for (`core.pods`): counted,
    they would draw ``nvidia.com/gpu`` pods the kubelet cannot admit there. GPUs in MIG mode
    under the mixed strategy: an inventory carries no MIG instances (`_gpus`). GPUs of
    ``nvidia.com/gpu.count`` served neither way (in MIG mode without instances, or unhealthy:
    the device plugin serves only healthy GPUs)."""
    status = node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = kube_node_token(str((node.get("metadata") or {}).get("name", "")))
    said = []
    shared = int(parse_quantity(_resource(status, keys.RES_GPU_SHARED)))
    if shared:
        said.append(
            f"{shared} {keys.RES_GPU_SHARED} (the device plugin's time-slicing with "
            f"renameByDefault: true) left out: Seedance places {keys.RES_GPU}, not "
            f"{keys.RES_GPU_SHARED}"
        )
    try:
        served, in_mig, mig = _served(name, _product(labels), labels, status)
    except UndescribedNode:
        return "; ".join(said) or None
    if in_mig:
        said.append(
            f"{in_mig} GPUs in MIG mode ({keys.LABEL_GPU_COUNT}="
            f"{labels.get(keys.LABEL_GPU_COUNT)!s} less {served} whole; instances "
            f"{dict(sorted(mig.items()))}) left out: an inventory carries no MIG instances, so "
            "MIG jobs wait"
        )
    unserved = _int_label(labels, keys.LABEL_GPU_COUNT, 0) - served - in_mig
    if unserved > 0 and not shared:
        said.append(
            f"{unserved} of {keys.LABEL_GPU_COUNT}={labels.get(keys.LABEL_GPU_COUNT)!s} GPUs "
            f"served neither as {keys.RES_GPU} nor as MIG instances (in MIG mode without "
            "instances, or unhealthy) left out"
        )
    return "; ".join(said) or None


def same_inventory(a: NodeInventory, b: NodeInventory) -> bool:
    """Whether two inventories of a node say the same (their ids and times aside)."""
    return msgspec.structs.replace(a, id="", at=b.at) == msgspec.structs.replace(b, id="")
