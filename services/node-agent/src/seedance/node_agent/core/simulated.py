"""Simulated GPUs for development clusters without GPUs (kind, minikube): pure.

Owns what a node with ``count`` simulated GPUs of one model is, as run.ai's fake GPU operator
makes one for KAI's tests: the devices (``NodeDevices``: UUIDs in NVML's ``GPU-<uuid>`` form,
derived from the node's name and the index, so a restarted agent and every reader agree on
them without a store), the node's inventory (``node.inventory.v1``, ``simulated=True``, the
model as NVML names it, its memory from the one GPU identity ``seedance.events.gpus``) and its
samples (``gpu.sample_batch.v1``, ``simulated=True``), which follow the slicer's placements on
the node: a GPU is as busy as the share placed on it (a whole GPU 100 %, a shared one its
thousandths), and uses the memory placed on it (a whole GPU all of it, a shared one the same
thousandths of it: the placement carries no memory cap).
No power or energy is simulated: the ledger bills no energy it did not measure.

Ids: random (``new_event_id``, time bits from the event's time), as every node-side event's.
They were derived from the node's subject token and the millisecond, which any other node can
compute, and ``SEEDANCE_TELEMETRY``'s duplicate window is the stream's, not the subject's: a node
publishing first with them on its own subject had this node's inventory and samples dropped
(docs/security.md, "Nats-Msg-Id"). Each event is built once; the shell re-sends an inventory
whose publish failed as the same event (same id), and a sample not at all. Its consumers do not
rest on ids for one reading of a node at one time: the slicer upserts a node's inventory, the
ledger keeps one reading per (node, GPU, time) (``cost_ledger.core.readings``).

MIG: the last ``mig_gpus`` of them are in MIG mode (``mig_capable``, ``mig_enabled`` in the
inventory), cut at start into the instances of ``mig_layout`` (``SimulatedMig``: the layout a
node's mig-manager would have applied), each with a MIG UUID derived as the GPUs' are. The
agent applies the slicer's MIG plans to them through the same ``MigApplier`` as NVML's, and
its ``seedance.io/mig`` and ``nvidia.com/mig-<profile>`` plugins advertise them; the
``nvidia.com/gpu`` plugin advertises the other GPUs only (NVIDIA's "mixed" strategy). The
layout is taken as written: its slots are not checked against the model's MIG geometry.

Must not read a clock, NVML or the bus; the shell passes the time and the placements in.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from seedance.events.base import new_event_id
from seedance.events.gpus import identify
from seedance.events.slicing import Placement, PlacementKind
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.mig import MigInstance
from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.core.shares import ProcessSample

__all__ = [
    "SimulatedGpus",
    "SimulatedMig",
    "parse_mig_layout",
    "simulated_mig_uuid",
    "simulated_uuid",
]

#: The namespace of the simulated GPUs' UUIDs (uuid5 of the node's name and the index): fixed,
#: so that every agent on every node derives the same UUIDs for the same node.
_NAMESPACE = uuid.UUID("6f1d3c2e-5b4a-4e0f-9a7d-3e2b1c0d9f8e")
#: A GPU model the identity table has no memory figure for (an anonymised one) gets this much.
_DEFAULT_MEMORY_MIB = 16 * 1024


def simulated_uuid(node: str, index: int) -> str:
    """GPU ``index``'s UUID on ``node``, in NVML's form (``GPU-`` and a UUID)."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"


def simulated_mig_uuid(node: str, index: int, profile: str, start: int) -> str:
    """The MIG instance ``profile`` at ``start`` on GPU ``index`` of ``node``, in NVML's form."""
    return f"MIG-{uuid.uuid5(_NAMESPACE, f'{node}/{index}/{profile}@{start}')}"


def parse_mig_layout(text: str) -> tuple[tuple[str, int], ...]:
    """``<profile>:<start>,<start>;<profile>:<start>...`` (e.g. ``1g.10gb:0,1,2,3,4,5,6``) as
    (profile, start slot) pairs; raises ``ValueError`` naming what does not read."""
    out: list[tuple[str, int]] = []
    for entry in (e.strip() for e in text.split(";")):
        if not entry:
            continue
        profile, sep, starts = entry.partition(":")
        if not sep or not profile.strip():
            raise ValueError(f"MIG layout entry {entry!r} is not <profile>:<start>[,<start>...]")
        for start in starts.split(","):
            if not start.strip().isdigit() or not 0 <= int(start) <= 7:
                raise ValueError(f"MIG layout entry {entry!r}: start slot {start!r} is not 0..7")
            out.append((profile.strip(), int(start)))
    if len(set(out)) != len(out):
        raise ValueError(f"MIG layout {text!r} names an instance twice")
    return tuple(out)


class SimulatedMig:
    """The MIG instances of a node's simulated MIG-mode GPUs, in memory: a ``MigBackend``
    (``seedance.node_agent.mig``), so the slicer's plans are applied as on NVML. No process
    ever runs on them. GPU instance ids count from 1 per GPU, as NVML's; one compute instance
    (id 0) spans each."""

    def __init__(self, gpus: Iterable[int], layout: Iterable[tuple[str, int]]) -> None:
        self._instances: dict[int, dict[int, MigInstance]] = {}
        self._next: dict[int, int] = {}
        for gpu in gpus:
            self._instances[gpu], self._next[gpu] = {}, 1
            for profile, start in layout:
                self.create_compute_instance(gpu, self.create_gpu_instance(gpu, profile, start))

    def mig_enabled(self, gpu_index: int) -> bool:
        return gpu_index in self._instances

    def gpu_instances(self, gpu_index: int) -> list[MigInstance]:
        return sorted(self._instances.get(gpu_index, {}).values(), key=lambda i: i.start_slot)

    def compute_processes(self, gpu_index: int) -> int:
        return 0

    def create_gpu_instance(self, gpu_index: int, profile: str, start_slot: int) -> int:
        gis = self._instances[gpu_index]
        if any((i.profile, i.start_slot) == (profile, start_slot) for i in gis.values()):
            raise ValueError(f"GPU {gpu_index} holds {profile} at slot {start_slot} already")
        gi = self._next[gpu_index]
        self._next[gpu_index] += 1
        gis[gi] = MigInstance(profile, start_slot, gi)
        return gi

    def create_compute_instance(self, gpu_index: int, gi_id: int) -> int:
        inst = self._instances[gpu_index][gi_id]
        self._instances[gpu_index][gi_id] = MigInstance(inst.profile, inst.start_slot, gi_id, (0,))
        return 0

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        inst = self._instances[gpu_index][gi_id]
        cis = tuple(c for c in inst.ci_ids if c != ci_id)
        self._instances[gpu_index][gi_id] = MigInstance(inst.profile, inst.start_slot, gi_id, cis)

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        del self._instances[gpu_index][gi_id]


@dataclass(frozen=True, slots=True)
class SimulatedGpus:
    """``count`` simulated GPUs of ``model`` (as NVML names it) on the Kubernetes node ``node``.

    Serves the agent as its NVML does (``devices``, ``process_samples``: no process ever runs
    on a simulated GPU, so no measured share either) and makes the node's telemetry.
    """

    node: str
    model: str
    count: int
    pool: str = "default"
    #: How many of them (the last ones) are in MIG mode, cut into ``mig_layout`` at start.
    mig_gpus: int = 0
    mig_layout: tuple[tuple[str, int], ...] = ()
    mig: SimulatedMig = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"simulated GPUs: count {self.count} must be at least 1")
        if not 0 <= self.mig_gpus <= self.count:
            raise ValueError(f"simulated GPUs: {self.mig_gpus} in MIG mode of {self.count}")
        in_mig_mode = range(self.count - self.mig_gpus, self.count)
        object.__setattr__(self, "mig", SimulatedMig(in_mig_mode, self.mig_layout))
        if not identify(self.model).known:
            raise ValueError(f"simulated GPUs: model {self.model!r} is no GPU model Seedance knows")

    @property
    def mem_total_mib(self) -> int:
        identity = identify(self.model).identity
        gb = identity.memory_gb if identity is not None else None
        return gb * 1024 if gb else _DEFAULT_MEMORY_MIB

    def devices(self) -> NodeDevices:
        gpus = {i: simulated_uuid(self.node, i) for i in range(self.count)}
        mig = {
            (gpus[i], inst.profile, inst.start_slot): simulated_mig_uuid(
                self.node, i, inst.profile, inst.start_slot
            )
            for i in gpus
            for inst in self.mig.gpu_instances(i)
        }
        enabled = frozenset(i for i in gpus if self.mig.mig_enabled(i))
        return NodeDevices(gpus=gpus, mig=mig, mig_enabled=enabled)

    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]:
        return []

    def process_memory_mib(self, gpu_index: int) -> dict[int, float | None]:
        return {}

    def inventory(self, at: datetime, *, cpu_milli: int = 0, memory_mib: int = 0) -> NodeInventory:
        """The node's inventory at ``at``, under a new random id (a re-send is of this event)."""
        return NodeInventory(
            id=new_event_id(at=at),
            at=at,
            node=kube_node_token(self.node),
            pool=self.pool,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpus=[
                GpuInfo(
                    index=i,
                    model=self.model,
                    mem_total_mib=self.mem_total_mib,
                    uuid=uuid_,
                    mig_capable=self.mig.mig_enabled(i),
                    mig_enabled=self.mig.mig_enabled(i),
                )
                for i, uuid_ in self.devices().gpus.items()
            ],
            simulated=True,
        )

    def samples(self, at: datetime, placements: Iterable[Placement]) -> GpuSampleBatch:
        """The GPUs' sample at ``at`` given the slicer's live placements on the node, under a
        new random id."""
        milli = [0] * self.count
        mem = [0] * self.count
        total = self.mem_total_mib
        for p in placements:
            for g in p.gpus:
                if not 0 <= g.index < self.count:
                    continue  # not a GPU of this node: the placement is not its to honour
                if p.kind is PlacementKind.SHARED:
                    milli[g.index] += g.milli
                    mem[g.index] += total * g.milli // 1000
                elif p.kind is PlacementKind.WHOLE:
                    milli[g.index] += 1000
                    mem[g.index] += total
        devices = self.devices().gpus
        return GpuSampleBatch(
            id=new_event_id(at=at),
            at=at,
            node=kube_node_token(self.node),
            gpus=[
                GpuSample(
                    index=i,
                    uuid=devices[i],
                    mem_total_mib=float(total),
                    mem_used_mib=float(min(total, mem[i])),
                    util_gpu_pct=min(100.0, milli[i] / 10),
                    healthy=True,
                )
                for i in range(self.count)
            ],
            simulated=True,
        )
