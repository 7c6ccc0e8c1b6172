"""Telemetry events: per-node GPU sample batches, node inventory, GPU health, per-pod shares.

Fields a GPU cannot report are ``None`` (absent), never zero: a zero would read as a real idle
value to the slicer and the ledger. Every one is published by a node's own trusted measurer (the
collector, or the node agent for per-pod shares) on that node's subject, never by a tenant.

Trusted is not unbounded: a node's credential speaks only for its own node, and what it says is
bounded here, once, as msgspec ``Meta`` on the field, so every consumer (slicer, ledger, router,
node agent) refuses an impossible value at decode with an error naming the field, and the
dead letter carries it. The services store these values as integers in checkpoints encoded as
msgpack (int64 / uint64): one finite but huge energy reading (``2e16`` J) was applied by the
ledger and then failed every checkpoint, so every replica crash-looped on replay. The bounds
are physical, with a margin, and each one keeps what is stored far inside int64:

- a measured GPU's index (a sample's, a health event's, a pod share's: NVML's device index, a
  physical GPU) is ``0 <= index < MAX_NODE_GPUS`` (64: real servers hold 20 single-slot
  PCIe GPUs such as T4s in one 4U box, more than a DGX-2's 16; 64 leaves room and keeps every
  per-GPU sum far inside int64), and a batch holds at most that many; an inventory's GPUs
  (index and count) are within ``MAX_NODE_DEVICES`` (128), since Kubernetes counts each MIG
  instance as a GPU under the GPU operator's ``single`` MIG strategy (up to 7 a GPU: 16
  MIG-capable GPUs, twice the 8 of today's largest MIG boards (HGX), or 64 whole GPUs twice),
  and the k8s-bridge's inventory lists what Kubernetes counts;
- ``energy_j`` is NVML's ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver was
  loaded) in joules: ``0 <= energy_j <= MAX_ENERGY_J`` (1e12 J, 2.6 x a 1.2 kW GPU (B200/GB200)
  drawing flat out for 10 years, 3.8e11 J; the ledger keeps it in mJ, 1e15 < 2^63);
- GPU memory (used, total, reserved, a pod's) is ``0 <= MiB <= MAX_GPU_MEM_MIB`` (1 TiB: 3.6 x
  the largest GPU's, B300 / MI355X with 288 GB = 274,658 MiB);
- a node's ``cpu_milli`` and ``memory_mib`` are within a request's bounds (10,000 cores, 2 PiB:
  ``seedance.events.jobs``), since a request may ask for no more than a node has;
- the remaining integers (``throttle_reasons``, ``xid``, ``periods``) are ``0 <= n < 2^63``.

Strings and maps are bounded too, each by the limit of what fills it: a service copies them into
what it publishes (the ledger's ``CostEntry`` carries a GPU's ``model`` three times), and one
inventory with a 400,000-character model (400 KB, under the 1 MiB ``max_payload``) made a cost
entry over it, so every ledger replica failed to publish at that input and restarted there:

- a GPU's ``model`` is at most ``MAX_GPU_MODEL_LEN`` (128): the collector reads NVML's
  ``nvmlDeviceGetName`` into ``NVML_DEVICE_NAME_V2_BUFFER_SIZE`` (96 bytes, with its NUL), the
  k8s-bridge GPU feature discovery's ``nvidia.com/gpu.product`` label, a Kubernetes label value
  (at most 63 characters);
- a GPU's ``uuid`` (``gpu_uuid``) is at most ``MAX_GPU_UUID_LEN`` (96): NVML's
  ``nvmlDeviceGetUUID`` fills ``NVML_DEVICE_UUID_V2_BUFFER_SIZE`` (96 bytes; a MIG instance's
  ``MIG-<uuid>`` fits it too);
- ``nvlink_domain`` is at most 192: the collector names it ``<node>:nvl<index>`` (a node token
  is at most 128 characters, ``seedance.events.tokens``);
- a health ``reason`` is at most 256: the collector joins short codes (``xid_79``,
  ``ecc_uncorrected``, ``gpu_lost``);
- a pod share's ``pod`` is at most 253 (a pod name is a DNS-1123 subdomain, Kubernetes'
  ``IsDNS1123Subdomain``), its ``namespace`` at most 63 (a DNS-1123 label,
  ``ValidateNamespaceName``), its ``pod_uid`` at most 253 (Kubernetes does not validate a UID's
  form; the API server's are 36-character UUIDs, a static pod's a 32-character hash), its
  ``tenant`` at most 63 (a tenant id) and ``job_id`` at most 128 (a name token);
- an inventory's ``labels`` are Kubernetes labels: a key is an optional DNS-1123 subdomain
  prefix (at most 253), ``/`` and a name (at most 63), so at most 317 characters, a value at
  most 63 (Kubernetes' ``IsQualifiedName`` / ``IsValidLabelValue``); Kubernetes bounds a node's
  label count only through the object's size (etcd's 1.5 MiB request), so at most 64 entries
  here, the topology labels this field is for, as a request's labels (``seedance.events.jobs``).

At these bounds the largest inventory (128 GPUs, 64 labels) encodes to about 100 KB, and the
ledger's largest output from any telemetry stays far under 1 MiB (``tests/unit/events/
test_telemetry_bounds.py`` checks both).
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from seedance.events.base import Event, UtcDatetime
from seedance.events.jobs import MAX_CPU_MILLI, MAX_MEMORY_MIB
from seedance.events.tokens import Name

__all__ = [
    "MAX_ENERGY_J",
    "MAX_GPU_MEM_MIB",
    "MAX_GPU_MODEL_LEN",
    "MAX_GPU_UUID_LEN",
    "MAX_NODE_DEVICES",
    "MAX_NODE_GPUS",
    "GpuHealth",
    "GpuInfo",
    "GpuSample",
    "GpuSampleBatch",
    "NodeInventory",
    "NodeState",
    "PodShare",
    "PodShares",
    "TelemetryEvent",
]

#: The most GPUs one node holds (64: 20-GPU PCIe servers exist, beyond a DGX-2's 16).
MAX_NODE_GPUS = 64
#: The most GPUs an inventory may list: 128 (16 MIG-capable GPUs at 7 instances, rounded up).
MAX_NODE_DEVICES = 128
#: An NVML energy counter's largest plausible reading, joules (the module's docstring).
MAX_ENERGY_J = 1e12
#: One GPU's largest plausible memory, MiB: 1 TiB (the module's docstring).
MAX_GPU_MEM_MIB = 1024 * 1024
_INT63 = 2**63 - 1
#: A GPU model name's most characters (NVML's name buffer is 96 bytes; the module's docstring).
MAX_GPU_MODEL_LEN = 128
#: A GPU UUID's most characters (NVML's UUID buffer is 96 bytes; the module's docstring).
MAX_GPU_UUID_LEN = 96

GpuIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_NODE_GPUS)]
GpuMemMib = Annotated[float, msgspec.Meta(ge=0, le=MAX_GPU_MEM_MIB)]
EnergyJ = Annotated[float, msgspec.Meta(ge=0, le=MAX_ENERGY_J)]
Count = Annotated[int, msgspec.Meta(ge=0, le=_INT63)]
GpuModelName = Annotated[str, msgspec.Meta(max_length=MAX_GPU_MODEL_LEN)]
GpuUuid = Annotated[str, msgspec.Meta(max_length=MAX_GPU_UUID_LEN)]
NvlinkDomain = Annotated[str, msgspec.Meta(max_length=192)]
HealthReason = Annotated[str, msgspec.Meta(max_length=256)]
#: Kubernetes' DNS-1123 subdomain (a pod's name) and label (a namespace's name) lengths.
KubeSubdomain = Annotated[str, msgspec.Meta(max_length=253)]
KubeLabel = Annotated[str, msgspec.Meta(max_length=63)]
JobName = Annotated[str, msgspec.Meta(max_length=128)]


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's reading at one tick. Ratios are 0..1, percentages 0..100."""

    index: GpuIndex
    uuid: GpuUuid = ""
    mem_used_mib: GpuMemMib | None = None
    mem_total_mib: GpuMemMib | None = None
    mem_reserved_mib: GpuMemMib | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    power_w: float | None = None
    #: NVML's energy counter since the driver was loaded, J (the module's docstring).
    energy_j: EnergyJ | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: Count | None = None
    healthy: bool = True


class GpuSampleBatch(Event, frozen=True, kw_only=True, tag="gpu.sample_batch.v1"):
    """All GPUs of one node at one tick. ``simulated`` is true for a replayed fleet."""

    node: Name
    gpus: Annotated[list[GpuSample], msgspec.Meta(max_length=MAX_NODE_GPUS)]
    simulated: bool = False


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU as the inventory describes it."""

    index: Annotated[int, msgspec.Meta(ge=0, lt=MAX_NODE_DEVICES)]
    model: GpuModelName
    mem_total_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_MEM_MIB)]
    uuid: GpuUuid = ""
    mig_capable: bool = False
    mig_enabled: bool = False
    #: GPUs of one node sharing an NVLink domain have the same value; None when unknown.
    nvlink_domain: NvlinkDomain | None = None


#: A Kubernetes label key (an optional DNS-subdomain prefix of at most 253 characters, "/", a
#: name of at most 63) and value (at most 63).
NodeLabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=317)]
NodeLabelValue = Annotated[str, msgspec.Meta(max_length=63)]


class NodeState(enum.StrEnum):
    """Whether work may land on a node: `ready`; `cordoned` (draining: nothing new lands
    there, what runs there stays: Kubernetes' ``spec.unschedulable`` or a ``NoSchedule``
    taint); `removed` (gone: what ran there ended with it)."""

    READY = "ready"
    CORDONED = "cordoned"
    REMOVED = "removed"


class NodeInventory(Event, frozen=True, kw_only=True, tag="node.inventory.v1"):
    """What a node has. Published at start and whenever it changes, including when it is
    cordoned or leaves (`state`; a removed node's other fields are its last description)."""

    node: Name
    pool: Name = "default"
    cpu_milli: Annotated[int, msgspec.Meta(ge=0, le=MAX_CPU_MILLI)]
    memory_mib: Annotated[int, msgspec.Meta(ge=0, le=MAX_MEMORY_MIB)]
    gpus: Annotated[list[GpuInfo], msgspec.Meta(max_length=MAX_NODE_DEVICES)]
    simulated: bool = False
    #: The node's labels that place it in the network: its topology domains (a multi-node
    #: NVLink clique such as GPU feature discovery's ``nvidia.com/gpu.clique``, a rack, a
    #: block: the labels Kueue's and KAI's topology-aware scheduling read). Empty: unknown.
    labels: Annotated[dict[NodeLabelKey, NodeLabelValue], msgspec.Meta(max_length=64)] = (
        msgspec.field(default_factory=dict)
    )
    state: NodeState = NodeState.READY


class GpuHealth(Event, frozen=True, kw_only=True, tag="gpu.health.v1"):
    """A GPU became unhealthy (disappeared, XID) or recovered."""

    node: Name
    gpu_index: GpuIndex
    uuid: GpuUuid = ""
    healthy: bool
    reason: HealthReason = ""
    xid: Count | None = None


class PodShare(msgspec.Struct, frozen=True, kw_only=True):
    """What one pod used of one GPU over a sample window, measured by the node agent.

    ``sm_share`` and ``mem_share`` are ratios 0..1 of the GPU: the pod's processes' mean SM and
    memory(-controller) utilisation from NVML's per-process samples, a period a process is
    absent from counted as zero. ``tenant`` and ``job_id`` name the slicer's placement the pod
    was granted against (empty: the pod holds no Seedance placement on this node).
    """

    gpu_index: GpuIndex
    gpu_uuid: GpuUuid = ""
    pod_uid: KubeSubdomain
    namespace: KubeLabel = ""
    pod: KubeSubdomain = ""
    tenant: KubeLabel = ""
    job_id: JobName = ""
    sm_share: float
    mem_share: float
    #: NVML sampling periods the window held (how much the means are over).
    periods: Count = 0
    #: The most GPU memory the pod's processes held over the window, MiB: the peak of the
    #: node agent's reads in it (NVML's per-process used memory summed per pod, read every
    #: ``MEMORY_SAMPLE_S``, the last at the window's end), the measured memory a share's MPS
    #: memory limit is sized from. None: NVML gave no figure for one of the pod's processes in
    #: one of those reads (a part is no measure), or an agent from before the field. (Earlier
    #: agents sent one read, at the window's end, and a partial sum.)
    mem_used_mib: GpuMemMib | None = None


class PodShares(Event, frozen=True, kw_only=True, tag="gpu.pod_share.v1"):
    """Per-pod measured shares of one node's GPUs over ``[window_start, at)``.

    Published by the node agent on ``seedance.telemetry.<node>.pod_share`` (its node's token);
    like a collector's sample its time is the node's clock, a trusted one: the agent is the
    node's identity, not a tenant's. ``at`` is the window's end.
    """

    node: Name
    window_start: UtcDatetime
    shares: list[PodShare]


TelemetryEvent = GpuSampleBatch | NodeInventory | GpuHealth | PodShares
