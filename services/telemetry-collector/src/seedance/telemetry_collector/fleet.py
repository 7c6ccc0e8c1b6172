"""A simulated fleet whose GPU samples follow the placements made on it.

Owns the replayed fleet: the nodes of a node list (the Alibaba GPU trace's 1,213 nodes and
6,212 GPUs by default), what is placed on each GPU, and the samples that follow from it:
memory used is the memory placed, activity follows the GPU share placed, power follows activity
between the model's idle and TDP figures, and energy integrates power over time. Every sample
says ``simulated=True``. It must not read the bus or a clock: the caller applies placements and
passes the time in. State is held in numpy arrays so a 6,212-GPU tick costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from seedance.events.gpus import canonical_model
from seedance.telemetry_collector.sample import (
    GpuInventory,
    GpuSample,
    NodeInventory,
    NodeSample,
)
from seedance.traces.alibaba import read_nodes

__all__ = ["GPU_MODELS", "FleetNode", "FleetSim", "GpuModelSpec", "load_node_list"]


class GpuModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Power and memory of one GPU model; ``source`` says where each figure comes from."""

    name: str
    mem_total_mib: float
    idle_w: float
    tdp_w: float
    source: str


# TDP: the vendor's datasheet board power. Idle: typical readings of an idle, clocked-down
# board (nvidia-smi at P8 or similar); they vary by board and driver and are approximations.
# Memory: what NVML reports as total for the board (from the FGD simulator's table, which was
# read from the same cluster), except where stated.
GPU_MODELS: dict[str, GpuModelSpec] = {
    spec.name: spec
    for spec in (
        GpuModelSpec(
            name="P100",
            mem_total_mib=16280,
            idle_w=30,
            tdp_w=250,
            source="Tesla P100 PCIe 16GB datasheet 250 W; memory: FGD simulator "
            "(Tesla-P100-PCIE-16GB)",
        ),
        GpuModelSpec(
            name="V100M16",
            mem_total_mib=16160,
            idle_w=40,
            tdp_w=300,
            source="Tesla V100 SXM2 datasheet 300 W; memory: FGD simulator (Tesla-V100-SXM2-16GB)",
        ),
        GpuModelSpec(
            name="V100M32",
            mem_total_mib=32510,
            idle_w=40,
            tdp_w=300,
            source="Tesla V100 SXM2 datasheet 300 W; memory: FGD simulator (Tesla-V100-SXM2-32GB)",
        ),
        GpuModelSpec(
            name="T4",
            mem_total_mib=15109,
            idle_w=10,
            tdp_w=70,
            source="Tesla T4 datasheet 70 W; memory: FGD simulator (Tesla-T4)",
        ),
        GpuModelSpec(
            name="A10",
            mem_total_mib=22731,
            idle_w=20,
            tdp_w=150,
            source="NVIDIA A10 datasheet 150 W; memory: FGD simulator (NVIDIA-A10)",
        ),
        # G1/G2/G3 are undisclosed internal codes in the Alibaba trace: these figures are an
        # ASSUMPTION (a 16 GiB, 250 W data-centre board), not a fact about those GPUs.
        GpuModelSpec(
            name="G1", mem_total_mib=16384, idle_w=30, tdp_w=250, source="assumed (undisclosed)"
        ),
        GpuModelSpec(
            name="G2", mem_total_mib=16384, idle_w=30, tdp_w=250, source="assumed (undisclosed)"
        ),
        GpuModelSpec(
            name="G3", mem_total_mib=16384, idle_w=30, tdp_w=250, source="assumed (undisclosed)"
        ),
        GpuModelSpec(
            name="H200",
            mem_total_mib=143771,
            idle_w=80,
            tdp_w=700,
            source="measured here: NVML idle ~80 W, enforced limit 700 W, nvidia-smi total",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class FleetNode:
    name: str
    model: str
    gpus: int
    #: The host's CPU and memory, for the inventory (0 where the node list does not say).
    cpu_milli: int = 0
    memory_mib: int = 0


def load_node_list(path: Path, max_nodes: int = 0) -> list[FleetNode]:
    """Read an Alibaba ``openb_node_list_*.csv`` (``sn, cpu_milli, memory_mib, gpu, model``).

    GPU nodes only; ``max_nodes`` > 0 keeps the first that many.
    """
    nodes = [
        FleetNode(
            name=row.sn,
            model=row.model,
            gpus=row.gpu,
            cpu_milli=row.cpu_milli,
            memory_mib=row.memory_mib,
        )
        for row in read_nodes(path)
        if row.gpu > 0
    ]
    return nodes[:max_nodes] if max_nodes else nodes


@dataclass(frozen=True, slots=True)
class _Placement:
    gpus: tuple[int, ...]  # global GPU indices
    gpu_milli: int
    mem_mib_per_gpu: float


class FleetSim:
    """The simulated fleet. ``apply_placement`` / ``release`` are idempotent by placement id,
    so a re-delivered bus message changes nothing.

    ``busy_ratio`` is the share of its slot that a placed job keeps the SMs busy (a job placed
    at 500 milli on a GPU makes it ``0.5 * busy_ratio`` SM-active).
    """

    def __init__(
        self,
        nodes: Sequence[FleetNode],
        *,
        models: dict[str, GpuModelSpec] | None = None,
        busy_ratio: float = 0.9,
    ) -> None:
        if not 0.0 <= busy_ratio <= 1.0:
            raise ValueError(f"busy_ratio must be within 0..1, got {busy_ratio!r}")
        models = models or GPU_MODELS
        # A node list may name its GPUs as NVML or GFD does (``Tesla T4``, ``NVIDIA H200``) or
        # by the trace's short names (``T4``): the one GPU identity finds the spec of either.
        by_model = {canonical_model(name): spec for name, spec in models.items()}
        found = {
            n.model: models.get(n.model) or by_model.get(canonical_model(n.model)) for n in nodes
        }
        unknown = sorted(m for m, spec in found.items() if spec is None)
        if unknown:
            raise ValueError(f"no GpuModelSpec for model(s) {unknown}")
        spec_of = {m: spec for m, spec in found.items() if spec is not None}
        self._busy_ratio = busy_ratio
        self.nodes: tuple[FleetNode, ...] = tuple(nodes)
        counts = np.array([n.gpus for n in nodes], dtype=np.int64)
        self._offset = np.concatenate(([0], np.cumsum(counts)))
        self._node_index = {n.name: i for i, n in enumerate(nodes)}
        if len(self._node_index) != len(nodes):
            raise ValueError("node names must be unique")
        specs = [spec_of[n.model] for n in nodes for _ in range(n.gpus)]
        self._mem_total = np.array([s.mem_total_mib for s in specs], dtype=np.float64)
        self._idle_w = np.array([s.idle_w for s in specs], dtype=np.float64)
        self._tdp_w = np.array([s.tdp_w for s in specs], dtype=np.float64)
        self._milli = np.zeros(len(specs), dtype=np.int64)
        self._mem_used = np.zeros(len(specs), dtype=np.float64)
        self._energy_j = np.zeros(len(specs), dtype=np.float64)
        self._last_power_w = self._idle_w.copy()
        self._last_t: float | None = None
        self._placements: dict[str, _Placement] = {}
        self._uuids = [
            f"SIM-{n.name}-{i}" for n in nodes for i in range(n.gpus)
        ]  # stable fake UUIDs, marked as such

    @property
    def gpu_count(self) -> int:
        return int(self._offset[-1])

    def inventory(self) -> tuple[NodeInventory, ...]:
        out = []
        for ni, n in enumerate(self.nodes):
            base = int(self._offset[ni])
            spec_mem = float(self._mem_total[base])
            out.append(
                NodeInventory(
                    node=n.name,
                    simulated=True,
                    gpus=tuple(
                        GpuInventory(
                            index=i,
                            uuid=self._uuids[base + i],
                            model=n.model,
                            mem_total_mib=spec_mem,
                            power_limit_w=float(self._tdp_w[base]),
                            mig_capable=False,
                        )
                        for i in range(n.gpus)
                    ),
                )
            )
        return tuple(out)

    def free_milli(self, node: str) -> list[int]:
        """GPU share still free on each GPU of ``node`` (1000 = a whole GPU)."""
        ni = self._node_index[node]
        lo, hi = int(self._offset[ni]), int(self._offset[ni + 1])
        return (1000 - self._milli[lo:hi]).tolist()

    def has_node(self, node: str) -> bool:
        return node in self._node_index

    def node(self, node: str) -> FleetNode:
        return self.nodes[self._node_index[node]]

    def mem_total_mib(self, node: str) -> list[float]:
        ni = self._node_index[node]
        lo, hi = int(self._offset[ni]), int(self._offset[ni + 1])
        return self._mem_total[lo:hi].tolist()

    def free_mem_mib(self, node: str) -> list[float]:
        ni = self._node_index[node]
        lo, hi = int(self._offset[ni]), int(self._offset[ni + 1])
        return (self._mem_total[lo:hi] - self._mem_used[lo:hi]).tolist()

    def _global(self, node: str, gpu_indices: Iterable[int]) -> tuple[int, ...]:
        ni = self._node_index.get(node)
        if ni is None:
            raise ValueError(f"node {node!r} is not in the fleet")
        n = self.nodes[ni]
        idx = tuple(gpu_indices)
        if not idx:
            raise ValueError("gpu_indices must name at least one GPU")
        bad = [i for i in idx if not 0 <= i < n.gpus]
        if bad or len(set(idx)) != len(idx):
            raise ValueError(f"gpu_indices {list(idx)} invalid for node {node!r} ({n.gpus} GPUs)")
        return tuple(int(self._offset[ni]) + i for i in idx)

    def apply_placement(
        self,
        placement_id: str,
        node: str,
        gpu_indices: Sequence[int],
        gpu_milli: int,
        mem_mib_per_gpu: float,
    ) -> bool:
        """Place a job; ``False`` if this placement id is already applied (no change).

        Raises ``ValueError`` naming the field if the placement does not fit; nothing is
        applied then.
        """
        if placement_id in self._placements:
            return False
        if not 0 < gpu_milli <= 1000:
            raise ValueError(f"gpu_milli must be within 1..1000, got {gpu_milli!r}")
        if mem_mib_per_gpu < 0:
            raise ValueError(f"mem_mib_per_gpu must be >= 0, got {mem_mib_per_gpu!r}")
        gpus = self._global(node, gpu_indices)
        sel = np.array(gpus)
        if np.any(self._milli[sel] + gpu_milli > 1000):
            raise ValueError(
                f"gpu_milli {gpu_milli} over capacity on {node!r} gpus {list(gpu_indices)}"
            )
        if np.any(self._mem_used[sel] + mem_mib_per_gpu > self._mem_total[sel]):
            raise ValueError(
                f"mem_mib_per_gpu {mem_mib_per_gpu} over memory on {node!r} gpus "
                f"{list(gpu_indices)}"
            )
        self._milli[sel] += gpu_milli
        self._mem_used[sel] += mem_mib_per_gpu
        self._placements[placement_id] = _Placement(gpus, gpu_milli, mem_mib_per_gpu)
        return True

    def release(self, placement_id: str) -> bool:
        """Remove a placement; ``False`` if it is not (or no longer) applied."""
        p = self._placements.pop(placement_id, None)
        if p is None:
            return False
        sel = np.array(p.gpus)
        self._milli[sel] -= p.gpu_milli
        self._mem_used[sel] = np.maximum(0.0, self._mem_used[sel] - p.mem_mib_per_gpu)
        return True

    def sample_arrays(self, now_s: float) -> dict[str, np.ndarray]:
        """Advance to ``now_s`` and return per-GPU columns (the vectorised core of ``sample``)."""
        share = self._milli / 1000.0
        sm_active = share * self._busy_ratio
        power = self._idle_w + (self._tdp_w - self._idle_w) * sm_active
        if self._last_t is not None:
            dt = now_s - self._last_t
            if dt < 0:
                raise ValueError(f"time went backwards: {now_s} < {self._last_t}")
            # Trapezoid: power changes only at placements, between samples it is held.
            self._energy_j += 0.5 * (power + self._last_power_w) * dt
        self._last_t = now_s
        self._last_power_w = power
        return {
            "mem_used_mib": self._mem_used,
            "mem_total_mib": self._mem_total,
            "gpu_util_ratio": np.minimum(1.0, share),
            "sm_active_ratio": sm_active,
            "power_w": power,
            "energy_j": self._energy_j,
            # A board runs ~30 °C idle and ~75 °C at full load under air cooling (typical).
            "temp_c": 30.0 + 45.0 * sm_active,
        }

    def sample(self, now_s: float) -> list[NodeSample]:
        """One ``NodeSample`` per node at ``now_s`` (seconds, UTC epoch), all ``simulated``."""
        cols = self.sample_arrays(now_s)
        used = np.round(cols["mem_used_mib"], 3).tolist()
        total = cols["mem_total_mib"].tolist()
        free = np.round(cols["mem_total_mib"] - cols["mem_used_mib"], 3).tolist()
        util = np.round(cols["gpu_util_ratio"], 4).tolist()
        sm = np.round(cols["sm_active_ratio"], 4).tolist()
        power = np.round(cols["power_w"], 2).tolist()
        energy = np.round(cols["energy_j"], 1).tolist()
        temp = np.round(cols["temp_c"], 1).tolist()
        uuids = self._uuids
        offset = self._offset.tolist()
        out = []
        for ni, n in enumerate(self.nodes):
            base = offset[ni]
            gpus = tuple(
                [
                    GpuSample(
                        index=i,
                        uuid=uuids[g],
                        model=n.model,
                        mem_used_mib=used[g],
                        mem_free_mib=free[g],
                        mem_total_mib=total[g],
                        gpu_util_ratio=util[g],
                        sm_active_ratio=sm[g],
                        power_w=power[g],
                        energy_j=energy[g],
                        temp_c=temp[g],
                    )
                    for i, g in enumerate(range(base, base + n.gpus))
                ]
            )
            out.append(NodeSample(node=n.name, sampled_at_unix_s=now_s, gpus=gpus, simulated=True))
        return out
