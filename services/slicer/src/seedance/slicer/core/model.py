"""The cluster model: nodes, GPUs and their free shares, and the requests placed on them.

Owns the mutable placement state (free CPU, memory and per-GPU milli-share of every node) as
numpy arrays, so policies can score every node in a few vector operations, and the typed
request / placement / rejection values that cross the core's boundary.

It must not decide where anything goes (that is `policies`), read clocks, or do I/O.

A request's `gpu_models` are matched against the nodes' model names by the one GPU identity
(`seedance.events.gpus.match_models`, `models_accept`): `t4` accepts a node whose GPUs report
`T4` or `Tesla T4`, `a100` any A100, `a100-80gb` an 80 GB one, never by exact string alone.

A GPU's capacity is 1000 milli-shares. A whole-GPU request takes 1000 on each of its GPUs; a
shared request (time-slicing / MPS) takes `gpu_milli` < 1000 on exactly one GPU. Nodes have at
most `MAX_GPUS_PER_NODE` GPUs; missing GPU slots are stored with 0 free share, which makes
them invisible to every comparison (`free >= share` with share >= 1) and to every sum.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from seedance.events.gpus import ModelMatch, match_models

__all__ = [
    "GPU_MILLI",
    "MAX_GPUS_PER_NODE",
    "ClusterState",
    "Node",
    "NodeGpus",
    "PodRequest",
    "Rejection",
    "models_accept",
]

GPU_MILLI = 1000
MAX_GPUS_PER_NODE = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One machine of the inventory.

    `nvlink_domains`, when given, holds one domain id per GPU: GPUs with the same id share an
    NVLink/NVSwitch domain, and gang placement prefers to keep a job inside one.
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int = 0
    nvlink_domains: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_count <= MAX_GPUS_PER_NODE:
            raise ValueError(f"node {self.name}: gpu_count={self.gpu_count} not in 0..8")
        if self.nvlink_domains is not None and len(self.nvlink_domains) != self.gpu_count:
            raise ValueError(f"node {self.name}: nvlink_domains needs one id per GPU")


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRequest:
    """What one pod (or one gang member set) asks for.

    `gpu_milli` is the share *per GPU* (0..1000); it is below 1000 only when `num_gpu == 1`.
    `gpu_models` empty means any model. `mig_profile` is reserved for the MIG planner
    (`seedance.slicer.core.mig_pool`); the placement queue rejects requests that set it.
    """

    cpu_milli: int
    memory_mib: int
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    mig_profile: str | None = None

    def __post_init__(self) -> None:
        if self.num_gpu < 0 or self.num_gpu > MAX_GPUS_PER_NODE:
            raise ValueError(f"num_gpu={self.num_gpu} not in 0..{MAX_GPUS_PER_NODE}")
        if self.num_gpu == 0 and self.gpu_milli != 0:
            raise ValueError(f"gpu_milli={self.gpu_milli} without num_gpu")
        if self.num_gpu > 0 and not 0 < self.gpu_milli <= GPU_MILLI:
            raise ValueError(f"gpu_milli={self.gpu_milli} not in 1..{GPU_MILLI}")
        if self.num_gpu > 1 and self.gpu_milli != GPU_MILLI:
            raise ValueError(f"multi-GPU request needs whole GPUs, got gpu_milli={self.gpu_milli}")

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPUs (what the paper's arrival axis sums)."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_shared(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """Where a request goes: a node index and the GPUs (indices on that node) it takes."""

    node: int
    gpus: tuple[int, ...] = ()


@functools.lru_cache(maxsize=8192)
def _accepts(requested: frozenset[str], model: str) -> bool:
    return bool(match_models(requested, (model,)).matched)


def models_accept(requested: Iterable[str], model: str) -> bool:
    """Whether a request's `gpu_models` (empty: any) accept a GPU reported as `model`.
    Memoised: a pass asks the same few pairs for every node."""
    wanted = frozenset(requested)
    return not wanted or _accepts(wanted, model)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request cannot be placed now. `reason` is a small closed set (metric label)."""

    reason: str
    detail: str = ""


class ClusterState:
    """Free resources of every node, as arrays indexed by node position.

    `gpu_free[n, g]` is the free milli-share of GPU g on node n (0 for absent GPUs).
    `version[n]` increases each time node n changes, so scorers can cache per node.
    """

    __slots__ = (
        "cpu_cap",
        "cpu_free",
        "gpu_cap",
        "gpu_count",
        "gpu_free",
        "mem_cap",
        "mem_free",
        "model_id",
        "model_matches",
        "model_names",
        "nodes",
        "nvlink",
        "version",
    )

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)
        n = len(self.nodes)
        self.model_names: tuple[str, ...] = tuple(sorted({x.gpu_model for x in self.nodes}))
        index = {m: i for i, m in enumerate(self.model_names)}
        self.model_id = np.array([index[x.gpu_model] for x in self.nodes], dtype=np.int32)
        self.model_matches: dict[frozenset[str], ModelMatch] = {}
        self.cpu_cap = np.array([x.cpu_milli for x in self.nodes], dtype=np.int64)
        self.mem_cap = np.array([x.memory_mib for x in self.nodes], dtype=np.int64)
        self.gpu_count = np.array([x.gpu_count for x in self.nodes], dtype=np.int64)
        self.gpu_cap = np.zeros((n, MAX_GPUS_PER_NODE), dtype=np.int64)
        for i, x in enumerate(self.nodes):
            self.gpu_cap[i, : x.gpu_count] = GPU_MILLI
        # Absent GPUs get a domain of their own (-1 - slot) so they never match a real one.
        self.nvlink = np.full((n, MAX_GPUS_PER_NODE), -1, dtype=np.int64)
        for i, x in enumerate(self.nodes):
            doms = x.nvlink_domains if x.nvlink_domains is not None else (0,) * x.gpu_count
            self.nvlink[i, : x.gpu_count] = doms
        self.cpu_free = self.cpu_cap.copy()
        self.mem_free = self.mem_cap.copy()
        self.gpu_free = self.gpu_cap.copy()
        self.version = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def gpu_capacity_milli(self) -> int:
        return int(self.gpu_cap.sum())

    @property
    def gpu_allocated_milli(self) -> int:
        return int(self.gpu_cap.sum() - self.gpu_free.sum())

    def model_match(self, models: Iterable[str]) -> ModelMatch:
        """Which of the fleet's model names a request's `gpu_models` accept (memoised)."""
        key = frozenset(models)
        found = self.model_matches.get(key)
        if found is None:
            found = self.model_matches[key] = match_models(sorted(key), self.model_names)
        return found

    def model_mask(self, models: Iterable[str]) -> np.ndarray:
        """Boolean mask of nodes whose GPU model `models` accept (all nodes if empty)."""
        wanted = frozenset(models)
        if not wanted:
            return np.ones(len(self.nodes), dtype=bool)
        accepted = set(self.model_match(wanted).matched)
        ids = [i for i, m in enumerate(self.model_names) if m in accepted]
        return np.isin(self.model_id, ids)

    def model_allows(self, n: int, models: Iterable[str]) -> bool:
        """Whether node `n`'s GPU model is one `models` (empty: any) accept."""
        return models_accept(models, self.nodes[n].gpu_model)

    def feasible(self, pod: PodRequest, model_ok: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of nodes that can host `pod` now (CPU, memory, GPU share, model)."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.num_gpu:
            ok &= (self.gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
            if pod.gpu_models:
                ok &= model_ok if model_ok is not None else self.model_mask(pod.gpu_models)
        return ok

    def fits(self, pod: PodRequest, placement: NodeGpus) -> bool:
        n = placement.node
        if self.cpu_free[n] < pod.cpu_milli or self.mem_free[n] < pod.memory_mib:
            return False
        if len(placement.gpus) != pod.num_gpu or len(set(placement.gpus)) != pod.num_gpu:
            return False
        if not self.model_allows(n, pod.gpu_models):
            return False
        return all(self.gpu_free[n, g] >= pod.gpu_milli for g in placement.gpus)

    def apply(self, pod: PodRequest, placement: NodeGpus) -> None:
        """Take the resources; raises ValueError (and changes nothing) if they are not free."""
        if not self.fits(pod, placement):
            raise ValueError(f"placement {placement} does not fit {pod}")
        n = placement.node
        self.cpu_free[n] -= pod.cpu_milli
        self.mem_free[n] -= pod.memory_mib
        for g in placement.gpus:
            self.gpu_free[n, g] -= pod.gpu_milli
        self.version[n] += 1

    def release(self, pod: PodRequest, placement: NodeGpus) -> None:
        """Give back what `apply` took (a finished or preempted pod)."""
        n = placement.node
        self.cpu_free[n] += pod.cpu_milli
        self.mem_free[n] += pod.memory_mib
        for g in placement.gpus:
            self.gpu_free[n, g] += pod.gpu_milli
        if (self.cpu_free[n] > self.cpu_cap[n]) or (self.gpu_free[n] > self.gpu_cap[n]).any():
            raise ValueError(f"release of {placement} frees more than node {n} has")
        self.version[n] += 1
