"""Which devices a container gets: the slicer's placement, checked, never the annotation alone.

Owns four things, all pure:
- the node's book of the slicer's own placements (``PlacementBook``), fed from the slicer's
  trusted decisions on the bus (placements, preemptions, releases, and the share changes of
  its right-sizing: the share and memory limit in force of a shared placement) and keyed by
  (tenant, job);
- which placement a pod runs under (``placement_of``), found from what the API server says of
  the pod (its UID: the bridge's job id of a pod, ``pod_job_id``), never from its annotation
  alone: a pod the slicer holds no placement for on this node is not one the bridge bound here;
- the reading of the bridge's ``seedance.io/placement`` pod annotation (its format is the
  bridge's, ``seedance.k8s_bridge.core.kube``; services never import each other, so the few
  keys read here are restated and pinned by a test against a document the bridge writes);
- ``verify``: a pod and its annotation against the book and the node's devices, giving either
  a ``Grant`` (exactly those devices: GPU UUIDs, MIG UUIDs, or one GPU with MPS limits at the
  share in force) or a
  ``Refusal`` with the reason. A tenant can write annotations: the annotation only says which
  placement the pod claims; what the container receives comes from the slicer's placement.

A gang member's job is not its own UID: the bridge derives it from the group's namespace, name
and members' UIDs (``gang_job_id``), and its annotation lists them. For a pod with no placement
of its own, the annotation's gang is taken only if the pod's own UID is a member and those
members, with the pod's namespace (the API server's), derive exactly the job the annotation
claims: an edited list or a pod of another namespace derives another id.

Must not do I/O, read a clock, or choose devices itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seedance.events.jobs import K8S_JOB_PREFIX
from seedance.events.jobs import gang_job_id as events_gang_job_id
from seedance.events.jobs import pod_job_id as events_pod_job_id
from seedance.events.pod_requests import ContainerRequest
from seedance.events.slicing import (
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
    ShareChanged,
)
from seedance.events.tokens import kube_node_token

__all__ = [
    "ANNOTATION_PLACEMENT",
    "ENV_MPS_MEM_LIMIT",
    "ENV_MPS_THREAD_PCT",
    "ENV_VISIBLE_DEVICES",
    "LABEL_POD_GROUP",
    "RES_GPU",
    "RES_GPU_MEMORY_MIB",
    "RES_GPU_MILLI",
    "AllocationBook",
    "Claim",
    "Grant",
    "NodeDevices",
    "PlacementBook",
    "PodView",
    "Refusal",
    "gang_job_id",
    "parse_claim",
    "placement_of",
    "pod_job_id",
    "requested_count",
    "verify",
]

#: The bridge's keys (seedance.k8s_bridge.core.keys), restated: services never import each other.
ANNOTATION_PLACEMENT = "seedance.io/placement"
LABEL_POD_GROUP = "seedance.io/pod-group"
RES_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
RES_GPU_MILLI = "seedance.io/gpu-milli"
RES_GPU_MEMORY_MIB = "seedance.io/gpu-memory-mib"

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_THREAD_PCT = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def pod_job_id(pod_uid: str) -> str:
    """The job id the bridge submits a single pod as (its ``CARRIED["job_id"]``): ``k8s:`` and
    the pod's ``metadata.uid`` (which the API server assigns), the pods' own space that no
    tenant may submit into (`seedance.events.jobs.pod_job_id`, the bridge's too)."""
    return events_pod_job_id(pod_uid)


def gang_job_id(namespace: str, group: str, members: Sequence[str]) -> str:
    """A pod group's job id, as the bridge derives it (`seedance.events.jobs.gang_job_id`)."""
    return events_gang_job_id(namespace, group, members)


def _job_ids(job_id: str) -> tuple[str, str]:
    """A pod's (or group's) job id, and the one the bridge gave it before pods' jobs had a space
    of their own (the bare uid, the bare derived id): a pod bound then keeps it until it ends."""
    return job_id, job_id.removeprefix(K8S_JOB_PREFIX)


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """What a pod's annotation claims (the bridge's document, version 1)."""

    pod_uid: str
    job_id: str
    tenant: str
    node: str
    kind: str
    gpus: tuple[GpuAssignment, ...]
    gpu_mem_mib: int
    placement_id: str
    #: A pod group's name and its members' UIDs (gang members only).
    gang: tuple[str, tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PodView:
    """What the API server says of a pod (not its tenant): uid, node, and its requests."""

    uid: str
    namespace: str
    name: str
    node_name: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Extended-resource requests of the pod as the kubelet counts them (init containers take
    #: the max, sidecars add: ``seedance.events.pod_requests.pod_resources``, the bridge's rule).
    requests: Mapping[str, int] = field(default_factory=dict)
    #: Its containers' own requests, in the kubelet's allocation order (``containers_of``): the
    #: kubelet calls Allocate once per container (``core.containers``).
    containers: tuple[ContainerRequest, ...] = ()
    #: When the API server bound the pod and created it (RFC 3339, server-written, never the
    #: tenant-writable annotation): of the pods an Allocate could be for, the oldest goes first.
    bound_at: str = ""
    created_at: str = ""
    #: The API server shows a container of it started: the kubelet allocated every container's
    #: devices (it allocates them all at admission, before the first start).
    started: bool = False

    @property
    def age_order(self) -> tuple[str, str, str]:
        """Oldest first: bound, then created (the binding's time has whole seconds), then UID."""
        return (self.bound_at, self.created_at, self.uid)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDevices:
    """The node's devices as NVML reports them: GPU UUID by index, MIG UUID by placement slot."""

    gpus: Mapping[int, str]
    #: (parent GPU UUID, profile, start slot) -> MIG UUID of an existing instance.
    mig: Mapping[tuple[str, str, int], str] = field(default_factory=dict)
    #: Indices of the GPUs in MIG mode (not advertised as whole GPUs); filled for simulated
    #: GPUs (NVML's reader leaves it empty: a MIG-mode GPU is advertised whole there).
    mig_enabled: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Grant:
    pod_uid: str
    job_id: str
    kind: str
    envs: dict[str, str]
    #: The device UUIDs the container receives (GPU or MIG), for exclusivity and pod labels.
    uuids: tuple[str, ...]
    #: The tenant of the slicer's placement (with ``job_id``, its key).
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


class PlacementBook:
    """The slicer's live placements on one node, by (tenant, job) (its decisions; nothing
    else). A job id alone names nothing: two tenants may use one (a tenant picks its own)."""

    def __init__(self, node: str) -> None:
        self._node = kube_node_token(node)
        self._by_job: dict[tuple[str, str], Placement] = {}
        #: The share in force of a shared placement whose share the slicer changed since.
        self._shares: dict[tuple[str, str], int] = {}
        #: The MPS memory limit (MiB) the slicer's latest change set, where it set one.
        self._mem: dict[tuple[str, str], int] = {}

    def apply(
        self, ev: Placement | Preempted | JobReleased | ShareChanged
    ) -> tuple[str, str] | None:
        """Take one decision; the (tenant, job) whose placement on this node it ended, if any.

        Another node's `Placement` changes nothing here: a gang spread over nodes is one job
        with a part per node, and a job is placed again only after the slicer said it was
        preempted or released, which ends the placement it had. A `ShareChanged` of a shared
        placement here, on its GPU and from the share in force, sets its share (`share_of`);
        one about a placement that is gone (moved, ended, another share) changes nothing.
        """
        key = (ev.tenant, ev.job_id)
        if isinstance(ev, ShareChanged):
            placed = self._by_job.get(key)
            if (
                placed is not None
                and placed.kind is PlacementKind.SHARED
                and [g.index for g in placed.gpus] == [ev.gpu_index]
                and self.share_of(*key) == ev.from_milli
            ):
                self._shares[key] = ev.to_milli
                if ev.mem_limit_mib > 0:
                    self._mem[key] = ev.mem_limit_mib
                else:  # the placement's own again
                    self._mem.pop(key, None)
            return None
        self._shares.pop(key, None)
        self._mem.pop(key, None)
        if isinstance(ev, Placement):
            if ev.node == self._node:
                self._by_job[key] = ev
            return None
        return key if self._by_job.pop(key, None) is not None else None

    def share_of(self, tenant: str, job_id: str) -> int | None:
        """The thousandths of its GPU a shared placement holds now (its placement's, or the
        latest change's); None for no shared placement here."""
        placed = self._by_job.get((tenant, job_id))
        if placed is None or placed.kind is not PlacementKind.SHARED or len(placed.gpus) != 1:
            return None
        return self._shares.get((tenant, job_id), placed.gpus[0].milli)

    def mem_limit_of(self, tenant: str, job_id: str) -> int:
        """The MPS memory limit (MiB) the slicer's latest change of the job's share set; 0: none
        (the placement's own holds)."""
        return self._mem.get((tenant, job_id), 0)

    def get(self, tenant: str, job_id: str) -> Placement | None:
        return self._by_job.get((tenant, job_id))

    def for_job(self, job_id: str) -> list[Placement]:
        """Every tenant's placement of ``job_id`` on this node (more than one only where tenants
        chose one id), by tenant."""
        return sorted(
            (p for (_t, j), p in self._by_job.items() if j == job_id), key=lambda p: p.tenant
        )

    def placements(self) -> list[Placement]:
        """Every live placement on this node, by (tenant, job)."""
        return [self._by_job[k] for k in sorted(self._by_job)]

    def __len__(self) -> int:
        return len(self._by_job)


def _gpu(doc: Any) -> GpuAssignment:
    if not isinstance(doc, dict):
        raise ValueError(f"gpus entry {doc!r} is not an object")
    profile, slot = doc.get("migProfile"), doc.get("migStartSlot")
    return GpuAssignment(
        index=int(doc["index"]),
        uuid=str(doc.get("uuid", "")),
        milli=int(doc.get("milli", 1000)),
        mig_profile=None if profile is None else str(profile),
        mig_start_slot=None if slot is None else int(slot),
    )


def _gang(doc: Any) -> tuple[str, tuple[str, ...]] | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("members"), list):
        raise ValueError(f"gang {doc!r} is not an object with a list of members")
    return str(doc["name"]), tuple(str(m) for m in doc["members"])


def parse_claim(annotations: Mapping[str, str]) -> Claim | Refusal:
    raw = annotations.get(ANNOTATION_PLACEMENT)
    if raw is None:
        return Refusal(f"pod has no {ANNOTATION_PLACEMENT} annotation")
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("not a version 1 placement document")
        return Claim(
            pod_uid=str(doc["podUid"]),
            job_id=str(doc["jobId"]),
            tenant=str(doc["tenant"]),
            node=str(doc["node"]),
            kind=str(doc["kind"]),
            gpus=tuple(_gpu(g) for g in doc["gpus"]),
            gpu_mem_mib=int(doc.get("gpuMemoryMib", 0)),
            placement_id=str(doc["placementId"]),
            gang=_gang(doc.get("gang")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        return Refusal(f"{ANNOTATION_PLACEMENT} annotation unreadable: {exc}")


def placement_of(pod: PodView, book: PlacementBook) -> Placement | Refusal:
    """The slicer's placement ``pod`` runs under on this node, found by (tenant, job) with the
    job derived from the pod's UID (the API server's), or why there is none, in which case
    the pod is not one the bridge bound here with a placement, whatever its annotation says.

    A pod's own job is ``k8s:<uid>``, a space no bus tenant may submit into. Its bare UID is
    taken only for a pod whose annotation names it (bound before that space existed), and only
    under the annotation's tenant (which only picks among the slicer's placements: the
    placement id must match too, ``verify``), so a bus tenant's job named after the pod's UID
    is never the pod's, nor cuts an Allocate's wait for the pod's own placement short.
    Only a pod with no placement of its own may be a gang member: its annotation's gang then
    selects the gang's placement if the pod is a member and the members derive its job id
    with the pod's namespace (the module's note).
    """
    own = book.for_job(pod_job_id(pod.uid))
    if len(own) > 1:  # the bridge submits a pod's job under its namespace's tenant alone
        tenants = [p.tenant for p in own]
        return Refusal(f"tenants {tenants} each hold a placement of job {own[0].job_id}")
    if own:
        return own[0]
    claim = parse_claim(pod.annotations)
    if isinstance(claim, Refusal):
        return Refusal(f"the slicer holds no placement of pod {pod.uid}'s job on this node")
    if claim.job_id == pod.uid and (old := book.get(claim.tenant, pod.uid)) is not None:
        return old  # bound before pods' jobs had their space: under its tenant only
    if claim.gang is None:
        return Refusal(f"the slicer holds no placement of pod {pod.uid}'s job on this node")
    group, members = claim.gang
    if pod.uid not in members:
        return Refusal(f"pod {pod.uid} is not a member of pod group {group!r} it claims")
    derived = gang_job_id(pod.namespace, group, members)
    if claim.job_id not in _job_ids(derived):
        return Refusal(
            f"pod group {pod.namespace}/{group} with those members is job {derived}, "
            f"not {claim.job_id}"
        )
    gang = book.get(claim.tenant, claim.job_id)
    if gang is None:
        return Refusal(f"the slicer holds no placement of job {claim.job_id} on this node")
    return gang


def _check_identity(pod: PodView, claim: Claim, node: str, placed: Placement) -> str | None:
    if claim.pod_uid != pod.uid:
        return f"annotation names pod {claim.pod_uid}, this pod is {pod.uid}"
    if claim.node != kube_node_token(node) or pod.node_name != node:
        return f"annotation names node {claim.node}, this node is {node}"
    if claim.job_id != placed.job_id:
        return f"annotation names job {claim.job_id}, the slicer placed this pod as {placed.job_id}"
    return None


def _check_against(pod: PodView, claim: Claim, placed: Placement) -> str | None:
    if placed.id != claim.placement_id:
        return f"stale placement {claim.placement_id}: the slicer's is {placed.id}"
    if placed.tenant != claim.tenant or placed.kind.value != claim.kind:
        return (
            f"annotation says {claim.tenant}/{claim.kind}, "
            f"the slicer placed {placed.tenant}/{placed.kind.value}"
        )
    ours = list(placed.gpus)
    whole_job = claim.job_id in _job_ids(pod_job_id(pod.uid))
    if whole_job and sorted(claim.gpus, key=_key) != sorted(ours, key=_key):
        return f"annotation devices {_show(claim.gpus)} differ from the slicer's {_show(ours)}"
    if not whole_job and not all(g in ours for g in claim.gpus):
        return f"annotation devices {_show(claim.gpus)} not within the gang's {_show(ours)}"
    want_mem = pod.requests.get(RES_GPU_MEMORY_MIB, 0)
    if claim.gpu_mem_mib != want_mem:
        return f"annotation memory cap {claim.gpu_mem_mib} MiB, the pod requests {want_mem} MiB"
    return None


def _key(g: GpuAssignment) -> tuple[int, str, int, str, int]:
    return (g.index, g.uuid, g.milli, g.mig_profile or "", g.mig_start_slot or 0)


def _show(gpus: Sequence[GpuAssignment]) -> str:
    return "[" + ", ".join(f"{g.index}:{g.uuid}:{g.milli}" for g in gpus) + "]"


def _whole(claim: Claim, devices: NodeDevices) -> Grant | Refusal:
    uuids = []
    for g in claim.gpus:
        uuid = devices.gpus.get(g.index)
        if uuid is None or (g.uuid and g.uuid != uuid):
            return Refusal(f"GPU {g.index} ({g.uuid}) is not on this node (node has {uuid})")
        uuids.append(uuid)
    return _grant(claim, _visible(uuids), uuids)


def _grant(claim: Claim, envs: dict[str, str], uuids: Sequence[str]) -> Grant:
    return Grant(claim.pod_uid, claim.job_id, claim.kind, envs, tuple(uuids), tenant=claim.tenant)


def _visible(uuids: Sequence[str]) -> dict[str, str]:
    return {ENV_VISIBLE_DEVICES: ",".join(uuids)}


def _mig(claim: Claim, devices: NodeDevices) -> Grant | Refusal:
    uuids = []
    for g in claim.gpus:
        parent = devices.gpus.get(g.index)
        if parent is None or g.mig_profile is None or g.mig_start_slot is None:
            return Refusal(f"MIG assignment {_show([g])} names no GPU of this node or no slot")
        uuid = devices.mig.get((parent, g.mig_profile, g.mig_start_slot))
        if uuid is None:
            return Refusal(
                f"no MIG instance {g.mig_profile} at slot {g.mig_start_slot} on GPU {parent}"
                " (its MIG plan is not applied yet)"
            )
        uuids.append(uuid)
    return _grant(claim, _visible(uuids), uuids)


def _shared(
    claim: Claim, devices: NodeDevices, milli: int | None = None, mem_mib: int = 0
) -> Grant | Refusal:
    """One GPU with MPS limits: the share in force (``milli``, the book's: the slicer's
    placement or its latest change) or, without one, the annotation's (checked equal to the
    placement's); the memory limit the slicer's latest change set (``mem_mib``, its right-sizing
    from the measured peak), never above the pod's own request, or else the request's."""
    if len(claim.gpus) != 1:
        return Refusal(f"a shared placement must name one GPU, names {_show(claim.gpus)}")
    granted = _whole(claim, devices)
    if isinstance(granted, Refusal):
        return granted
    share = claim.gpus[0].milli if milli is None else milli
    # MPS takes 1..100 % of the SMs; a share of 1..1000 milli rounds up so it is never 0.
    envs = {**granted.envs, ENV_MPS_THREAD_PCT: str(min(100, max(1, math.ceil(share / 10))))}
    mem = claim.gpu_mem_mib
    if mem_mib > 0:
        mem = min(mem, mem_mib) if mem > 0 else mem_mib
    if mem > 0:
        envs[ENV_MPS_MEM_LIMIT] = f"0={mem}M"  # ordinal 0: the one visible GPU
    return _grant(claim, envs, granted.uuids)


_RESOLVE = {
    PlacementKind.WHOLE.value: _whole,
    PlacementKind.MIG.value: _mig,
    PlacementKind.SHARED.value: _shared,
}


def verify(pod: PodView, book: PlacementBook, node: str, devices: NodeDevices) -> Grant | Refusal:
    """The devices ``pod`` may receive on ``node``, or why it may not run here: its placement
    found by its UID (``placement_of``), its annotation checked against it."""
    placed = placement_of(pod, book)
    if isinstance(placed, Refusal):
        return placed
    claim = parse_claim(pod.annotations)
    if isinstance(claim, Refusal):
        return claim
    problem = _check_identity(pod, claim, node, placed) or _check_against(pod, claim, placed)
    if problem is not None:
        return Refusal(problem)
    if claim.kind == PlacementKind.SHARED.value:
        key = (placed.tenant, placed.job_id)
        return _shared(claim, devices, book.share_of(*key), book.mem_limit_of(*key))
    resolve = _RESOLVE.get(claim.kind)
    if resolve is None:
        return Refusal(f"a {claim.kind} placement holds no GPU to allocate")
    return resolve(claim, devices)


def requested_count(claim_kind: str, gpus: Sequence[GpuAssignment]) -> int:
    """How many plugin devices the kubelet asks for such a placement: one per GPU or MIG
    instance; for a shared GPU one per thousandth (the ``seedance.io/gpu-milli`` resource)."""
    if claim_kind == PlacementKind.SHARED.value:
        return sum(g.milli for g in gpus)
    return len(gpus)


class AllocationBook:
    """Grants made on this node: a pod is granted once, a GPU or MIG instance to one pod."""

    def __init__(self) -> None:
        self._by_pod: dict[str, Grant] = {}
        self._owner: dict[str, str] = {}

    def granted(self, pod_uid: str) -> Grant | None:
        return self._by_pod.get(pod_uid)

    def take(self, grant: Grant) -> Grant | Refusal:
        """Record ``grant``; refuse one whose exclusive device another pod already holds."""
        if grant.kind != PlacementKind.SHARED.value:
            taken = {
                u: self._owner[u]
                for u in grant.uuids
                if self._owner.get(u, grant.pod_uid) != grant.pod_uid
            }
            if taken:
                return Refusal(
                    f"devices {sorted(taken)} are already allocated to "
                    f"pod(s) {sorted(set(taken.values()))}"
                )
            for u in grant.uuids:
                self._owner[u] = grant.pod_uid
        self._by_pod[grant.pod_uid] = grant
        return grant

    def release_job(self, tenant: str, job_id: str) -> list[str]:
        """Release every grant of (``tenant``, ``job_id``) (its placement ended); the pods
        released."""
        pods = [uid for uid, g in self._by_pod.items() if (g.tenant, g.job_id) == (tenant, job_id)]
        for uid in pods:
            self.release(uid)
        return pods

    def release(self, pod_uid: str) -> None:
        grant = self._by_pod.pop(pod_uid, None)
        if grant is not None:
            for u in grant.uuids:
                if self._owner.get(u) == pod_uid:
                    del self._owner[u]
