"""The Alibaba 2026 spot-GPU fleet as the slicer sees it, and the work bench-scale runs on it.

Owns what the trace does not say and the bench must assume, each stated here once:

* **GPU names**: the trace's model names become what NVML reports (`NVIDIA A10`,
  `NVIDIA A100-SXM4-80GB`, `NVIDIA H800`, `NVIDIA A800-SXM4-80GB`); the two series the
  publisher anonymised keep their trace names (nothing real to call them).
* **Node memory**: the list has no memory column. A node gets 8 GiB per CPU core, the ratio
  of the one model both traces share (openb's A10 nodes: 128 cores, 1 TiB).
* **GPU memory** (inventory only: the pods ask none): 24 GiB for the A10, 80 GiB for the
  80 GB SXM parts and the H800, 0 (unknown) for the anonymised series.
* **NVLink**: the 8-GPU A100/A800/H800 nodes are HGX boards, one NVSwitch domain per node;
  the others have none known. No multi-node NVLink (no `nvidia.com/gpu.clique`).
* **Topology** (the trace has none): nodes of one model, in file order, are racked four per
  rack for 8-GPU nodes (32 GPUs) and sixteen per rack otherwise, 32 racks to a block, under
  the labels KAI's topology documentation uses (`cloud.provider.com/topology-rack`,
  `cloud.provider.com/topology-block`); a copy of the fleet has racks and blocks of its own.
* **Pods**: openb's default pod list (`openb_pod_list_default.csv`) gives the shapes (CPU,
  memory, GPUs, GPU share). It names no GPU model (its `gpu_spec` is empty on all 8,152
  rows), so no pod is bound to one; a list that does name models (the gpuspec lists) maps
  openb's models by `GPU_SPEC_MAP` to the nearest of this fleet's.

It must not publish anything or measure: `seedance.bench.scale` does.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from seedance.events import new_event_id
from seedance.events.jobs import ResourceRequest
from seedance.events.telemetry import GpuInfo, NodeInventory
from seedance.traces import alibaba
from seedance.traces.files import TraceFileError, csv_rows, row_error

__all__ = [
    "BLOCK_LABEL",
    "GPU_SPEC_MAP",
    "RACK_LABEL",
    "TOPOLOGY_LEVELS",
    "Shape",
    "SpotNode",
    "inventory",
    "read_fleet",
    "read_shapes",
]

RACK_LABEL = "cloud.provider.com/topology-rack"
BLOCK_LABEL = "cloud.provider.com/topology-block"
#: What the bench's slicer is told (innermost first): no cliques in this fleet, then racks.
TOPOLOGY_LEVELS = ("nvidia.com/gpu.clique", RACK_LABEL, BLOCK_LABEL)
MIB_PER_CORE = 8 * 1024
#: Trace model -> (the name NVML reports, GPU memory MiB, one NVSwitch domain per node).
MODELS: dict[str, tuple[str, int, bool]] = {
    "A10": ("NVIDIA A10", 24 * 1024, False),
    "A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", 80 * 1024, True),
    "H800": ("NVIDIA H800", 80 * 1024, True),
    "A800-SXM4-80GB": ("NVIDIA A800-SXM4-80GB", 80 * 1024, True),
    "GPU-series-1": ("GPU-series-1", 0, False),
    "GPU-series-2": ("GPU-series-2", 0, False),
}
#: openb's models -> this fleet's nearest (by memory and class), for pod lists naming models.
GPU_SPEC_MAP = {
    "A10": "NVIDIA A10",
    "T4": "NVIDIA A10",
    "P100": "NVIDIA A10",
    "V100M16": "NVIDIA A10",
    "V100M32": "NVIDIA A100-SXM4-80GB",
    "G1": "GPU-series-1",
    "G2": "GPU-series-1",
    "G3": "GPU-series-2",
}
NODES_PER_RACK_8GPU = 4
NODES_PER_RACK_OTHER = 16
RACKS_PER_BLOCK = 32


@dataclass(frozen=True, slots=True)
class SpotNode:
    name: str
    model: str  # as NVML names it
    gpus: int
    cpu_milli: int
    memory_mib: int
    gpu_memory_mib: int
    nvswitch: bool
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Shape:
    """One pod's request, as a job event carries it."""

    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_milli: int
    gpu_models: tuple[str, ...] = ()

    def request(self) -> ResourceRequest:
        return ResourceRequest(
            gpus=self.gpus,
            gpu_milli=self.gpu_milli if self.gpus else 1000,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu_models=list(self.gpu_models),
        )

    @property
    def gpu_share_milli(self) -> int:
        return self.gpus * self.gpu_milli


#: The node list's columns the fleet is built from.
_FLEET_COLUMNS = ("node_name", "gpu_model", "gpu_capacity_num", "cpu_num")


def read_fleet(path: Path, copies: int = 1, limit: int | None = None) -> list[SpotNode]:
    """The node list (its first `limit` nodes), `copies` times over, racked as stated above."""
    rows = list(itertools.islice(csv_rows(path, _FLEET_COLUMNS), limit))
    out: list[SpotNode] = []
    for c in range(copies):
        seen: dict[str, int] = defaultdict(int)
        for line, row in rows:
            trace_model = row["gpu_model"]
            if trace_model not in MODELS:
                raise TraceFileError(
                    f"{path}:{line}: gpu_model {trace_model!r} is none of {sorted(MODELS)}"
                )
            name, gpu_mem, nvswitch = MODELS[trace_model]
            try:
                gpus, cores = int(row["gpu_capacity_num"]), int(row["cpu_num"])
            except (ValueError, TypeError) as exc:
                raise TraceFileError(f"{path}:{line}: {row_error(exc)}") from None
            per_rack = NODES_PER_RACK_8GPU if gpus == 8 else NODES_PER_RACK_OTHER
            k = seen[trace_model]
            seen[trace_model] += 1
            rack = k // per_rack
            tag = f"c{c}-{trace_model.lower()}"
            out.append(
                SpotNode(
                    name=f"spot-c{c}-{row['node_name']}",
                    model=name,
                    gpus=gpus,
                    cpu_milli=cores * 1000,
                    memory_mib=cores * MIB_PER_CORE,
                    gpu_memory_mib=gpu_mem,
                    nvswitch=nvswitch and gpus == 8,
                    labels=(
                        (RACK_LABEL, f"{tag}-r{rack}"),
                        (BLOCK_LABEL, f"{tag}-b{rack // RACKS_PER_BLOCK}"),
                    ),
                )
            )
    return out


def inventory(node: SpotNode, at: datetime) -> NodeInventory:
    """The node's inventory event, as a collector on it would publish it."""
    domain = f"{node.name}-nvswitch" if node.nvswitch else None
    return NodeInventory(
        id=new_event_id(),
        at=at,
        node=node.name,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        gpus=[
            GpuInfo(
                index=i, model=node.model, mem_total_mib=node.gpu_memory_mib, nvlink_domain=domain
            )
            for i in range(node.gpus)
        ],
        labels=dict(node.labels),
    )


def read_shapes(path: Path) -> list[Shape]:
    """The pod list's requests (pods of more than 8 GPUs, which no node holds, left out)."""
    return [
        Shape(
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            gpus=p.num_gpu,
            gpu_milli=p.gpu_milli if p.num_gpu else 0,
            gpu_models=_models(p.gpu_spec),
        )
        for p in alibaba.read_pods(path)
        if p.num_gpu <= 8
    ]


def _models(spec: Sequence[str] | Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({GPU_SPEC_MAP[m] for m in spec if m in GPU_SPEC_MAP}))


def gpus_of(nodes: Sequence[SpotNode]) -> int:
    return sum(n.gpus for n in nodes)
