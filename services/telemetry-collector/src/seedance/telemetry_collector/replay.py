"""A replayed fleet: the Alibaba trace's node list as simulated GPUs that follow placements.

Owns the simulated state (what is allocated on each GPU) and turns it into samples. Memory and
activity of a GPU follow the shares placed on it; power follows activity between the model's idle
and board power. Every sample says ``simulated=True``. Pure: no bus, no clock (``at`` is passed in).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from seedance.events import new_event_id
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory

__all__ = ["GPU_MODELS", "GpuModelSpec", "ReplayFleet"]


@dataclass(frozen=True)
class GpuModelSpec:
    mem_mib: int
    idle_w: float
    tdp_w: float


#: Memory and board power from the vendors' datasheets; idle power is typical nvidia-smi idle.
#: G1/G2/G3 are undisclosed models in the trace: their figures are assumptions (a V100-class
#: 32 GB, 300 W board), and marked so in the cost reports.
GPU_MODELS: dict[str, GpuModelSpec] = {
    "P100": GpuModelSpec(16_384, 30.0, 250.0),
    "T4": GpuModelSpec(15_360, 10.0, 70.0),
    "V100M16": GpuModelSpec(16_384, 40.0, 300.0),
    "V100M32": GpuModelSpec(32_768, 40.0, 300.0),
    "A10": GpuModelSpec(23_028, 20.0, 150.0),
    "G1": GpuModelSpec(32_768, 40.0, 300.0),
    "G2": GpuModelSpec(32_768, 40.0, 300.0),
    "G3": GpuModelSpec(32_768, 40.0, 300.0),
}

#: How busy a placed share keeps its GPU. Training and inference are rarely flat out; 0.7 is the
#: replay's stated assumption, applied alike to every policy.
ACTIVITY_PER_SHARE = 0.7


@dataclass
class _Node:
    name: str
    cpu_milli: int
    memory_mib: int
    model: str
    gpu_milli_used: list[int]
    jobs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


class ReplayFleet:
    def __init__(self, nodes: list[_Node]) -> None:
        self._nodes = {n.name: n for n in nodes}

    @classmethod
    def from_csv(cls, path: str | Path, max_nodes: int = 0) -> ReplayFleet:
        nodes: list[_Node] = []
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                model = row["model"]
                if model not in GPU_MODELS:
                    raise ValueError(f"{path}: node {row['sn']} has unknown GPU model {model!r}")
                nodes.append(
                    _Node(
                        name=row["sn"],
                        cpu_milli=int(row["cpu_milli"]),
                        memory_mib=int(row["memory_mib"]),
                        model=model,
                        gpu_milli_used=[0] * int(row["gpu"]),
                    )
                )
                if max_nodes and len(nodes) >= max_nodes:
                    break
        return cls(nodes)

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpu_milli_used) for n in self._nodes.values())

    def inventories(self, at: datetime) -> list[NodeInventory]:
        return [
            NodeInventory(
                id=new_event_id(),
                at=at,
                node=n.name,
                cpu_milli=n.cpu_milli,
                memory_mib=n.memory_mib,
                gpus=[
                    GpuInfo(
                        index=i,
                        model=n.model,
                        mem_total_mib=GPU_MODELS[n.model].mem_mib,
                        uuid=f"SIM-{n.name}-{i}",
                    )
                    for i in range(len(n.gpu_milli_used))
                ],
                simulated=True,
            )
            for n in self._nodes.values()
        ]

    def apply(self, job_id: str, node: str, shares: list[tuple[int, int]]) -> None:
        """Record ``job_id`` holding ``(gpu index, milli)`` shares on ``node`` (idempotent)."""
        n = self._nodes.get(node)
        if n is None or job_id in n.jobs:
            return
        n.jobs[job_id] = shares
        for idx, milli in shares:
            n.gpu_milli_used[idx] = min(1000, n.gpu_milli_used[idx] + milli)

    def release(self, job_id: str) -> None:
        for n in self._nodes.values():
            shares = n.jobs.pop(job_id, None)
            if shares is not None:
                for idx, milli in shares:
                    n.gpu_milli_used[idx] = max(0, n.gpu_milli_used[idx] - milli)
                return

    def samples(self, at: datetime) -> list[GpuSampleBatch]:
        out: list[GpuSampleBatch] = []
        for n in self._nodes.values():
            spec = GPU_MODELS[n.model]
            gpus = []
            for i, used in enumerate(n.gpu_milli_used):
                share = used / 1000
                activity = share * ACTIVITY_PER_SHARE
                gpus.append(
                    GpuSample(
                        index=i,
                        uuid=f"SIM-{n.name}-{i}",
                        mem_used_mib=round(share * spec.mem_mib, 1),
                        mem_total_mib=float(spec.mem_mib),
                        util_gpu_pct=round(100 * min(1.0, share), 1),
                        sm_active=round(activity, 4),
                        power_w=round(spec.idle_w + (spec.tdp_w - spec.idle_w) * activity, 1),
                    )
                )
            out.append(
                GpuSampleBatch(id=new_event_id(), at=at, node=n.name, gpus=gpus, simulated=True)
            )
        return out
