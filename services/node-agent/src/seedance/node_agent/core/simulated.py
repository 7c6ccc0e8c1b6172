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

Must not read a clock, NVML or the bus; the shell passes the time and the placements in.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from seedance.events.base import derived_event_id
from seedance.events.gpus import identify
from seedance.events.slicing import Placement, PlacementKind
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.node_agent.core.placement import NodeDevices, node_token
from seedance.node_agent.core.shares import ProcessSample

__all__ = ["SimulatedGpus", "simulated_uuid"]

#: The namespace of the simulated GPUs' UUIDs (uuid5 of the node's name and the index): fixed,
#: so that every agent on every node derives the same UUIDs for the same node.
_NAMESPACE = uuid.UUID("6f1d3c2e-5b4a-4e0f-9a7d-3e2b1c0d9f8e")
#: A GPU model the identity table has no memory figure for (an anonymised one) gets this much.
_DEFAULT_MEMORY_MIB = 16 * 1024


def simulated_uuid(node: str, index: int) -> str:
    """GPU ``index``'s UUID on ``node``, in NVML's form (``GPU-`` and a UUID)."""
    return f"GPU-{uuid.uuid5(_NAMESPACE, f'{node}/{index}')}"


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

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"simulated GPUs: count {self.count} must be at least 1")
        if not identify(self.model).known:
            raise ValueError(f"simulated GPUs: model {self.model!r} is no GPU model Seedance knows")

    @property
    def mem_total_mib(self) -> int:
        identity = identify(self.model).identity
        gb = identity.memory_gb if identity is not None else None
        return gb * 1024 if gb else _DEFAULT_MEMORY_MIB

    def devices(self) -> NodeDevices:
        return NodeDevices(gpus={i: simulated_uuid(self.node, i) for i in range(self.count)})

    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]:
        return []

    def inventory(self, at: datetime, *, cpu_milli: int = 0, memory_mib: int = 0) -> NodeInventory:
        """The node's inventory at ``at``; its id is derived from the node and the time, so a
        retried publish of the same one is dropped."""
        ms = int(at.timestamp() * 1000)
        token = node_token(self.node)
        return NodeInventory(
            id=derived_event_id(f"simulated-inventory:{token}:{ms}", "inventory", ms),
            at=at,
            node=token,
            pool=self.pool,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpus=[
                GpuInfo(
                    index=i,
                    model=self.model,
                    mem_total_mib=self.mem_total_mib,
                    uuid=uuid_,
                    mig_capable=False,
                    mig_enabled=False,
                )
                for i, uuid_ in self.devices().gpus.items()
            ],
            simulated=True,
        )

    def samples(self, at: datetime, placements: Iterable[Placement]) -> GpuSampleBatch:
        """The GPUs' sample at ``at`` given the slicer's live placements on the node."""
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
        ms = int(at.timestamp() * 1000)
        token = node_token(self.node)
        devices = self.devices().gpus
        return GpuSampleBatch(
            id=derived_event_id(f"simulated-sample:{token}:{ms}", "sample", ms),
            at=at,
            node=token,
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
