"""The cluster model: nodes, GPUs and their free shares, and the requests placed on them.

Owns the mutable placement state (free CPU, memory and per-GPU milli-share of every node) as
numpy arrays, so policies can score every node in a few vector operations, and the typed
request / placement / rejection values that cross the core's boundary.

It must not decide where anything goes (that is `policies`), read clocks, or do I/O.

A request's `gpu_models` are matched against the nodes' model names by the one GPU identity
(`seedance.events.gpu_requests.match_models`, `models_accept`): `t4` accepts a node whose GPUs
report `T4` or `Tesla T4`, `a100` any A100, `a100-80gb` an 80 GB one, never by exact string alone.

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

from seedance.events.gpu_requests import ModelMatch, match_models

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
#: Topology levels a node may name (NVLink clique, rack, block, ...): Kueue's and KAI's
#: topologies have three or four.
MAX_TOPOLOGY_LEVELS = 4
#: Node changes the state remembers (`ClusterState.stale_rows`): a cache that fell further
#: behind compares every row once. Placements change one or two nodes each, so this covers
#: thousands of placements; older halves are dropped, so the log never outgrows it.
_CHANGES_KEPT = 1 << 15
_FEW_CHANGES = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One machine of the inventory.

    `nvlink_domains`, when given, holds one domain id per GPU: GPUs with the same id share an
    NVLink/NVSwitch domain, and gang placement prefers to keep a job inside one.
    `topology` names the node's domain at each topology level, innermost first (a multi-node
    NVLink clique, then a rack, then a block; "" where the node has no such label): a gang
    prefers the tightest domain that holds all its members (`seedance.slicer.core.gang`).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int = 0
    nvlink_domains: tuple[int, ...] | None = None
    topology: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.gpu_count <= MAX_GPUS_PER_NODE:
            raise ValueError(f"node {self.name}: gpu_count={self.gpu_count} not in 0..8")
        if self.nvlink_domains is not None and len(self.nvlink_domains) != self.gpu_count:
            raise ValueError(f"node {self.name}: nvlink_domains needs one id per GPU")
        if len(self.topology) > MAX_TOPOLOGY_LEVELS:
            raise ValueError(f"node {self.name}: more than {MAX_TOPOLOGY_LEVELS} topology levels")


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

    Nodes come and go without a rebuild: `add_node` appends one (the arrays are views of
    buffers that double when full, so a fleet loads in linear time) and `replace_node`
    re-describes an idle one in place (a node that left is replaced by an empty one: its
    index stays, nothing fits on it). Both cost what the node costs, not the fleet. A node's
    hardware (capacity, model, NVLink domains) changes only through them, and each bumps the
    node's `hw_version`, so caches of hardware-derived values (model masks, node types)
    refresh just that row; `hw_epoch` counts every such change, for caches cheap enough to
    rebuild whole.

    Every change of a node's row goes through a method here (`touch` for the queue's masked
    GPUs), which logs the row: `stale_rows` then finds the rows a per-node cache has not seen
    among those logged since its last `tick`, not by comparing every node's version (a pass
    over the fleet, several times per placement on 17,112 nodes).
    """

    __slots__ = (
        "_buf",
        "_changes",
        "_changes_base",
        "_n",
        "_topo_ids",
        "_type_ids",
        "cpu_cap",
        "cpu_free",
        "gpu_cap",
        "gpu_count",
        "gpu_free",
        "hw_epoch",
        "hw_version",
        "mem_cap",
        "mem_free",
        "model_id",
        "model_matches",
        "model_names",
        "nodes",
        "nvlink",
        "topo",
        "type_id",
        "version",
    )

    cpu_cap: np.ndarray
    mem_cap: np.ndarray
    gpu_count: np.ndarray
    gpu_cap: np.ndarray
    nvlink: np.ndarray
    cpu_free: np.ndarray
    mem_free: np.ndarray
    gpu_free: np.ndarray
    version: np.ndarray
    hw_version: np.ndarray
    model_id: np.ndarray
    #: Per node and topology level, the domain's number (-1: the node names none at that level).
    topo: np.ndarray
    #: Per node, its hardware type's number (model, CPU, memory, GPU count): nodes of one type
    #: score alike while untouched, whatever the policy.
    type_id: np.ndarray

    #: The per-node arrays: (name, shape of one row, dtype). All are views of `_buf[name]`.
    _ARRAYS: tuple[tuple[str, tuple[int, ...], type], ...] = (
        ("cpu_cap", (), np.int64),
        ("mem_cap", (), np.int64),
        ("gpu_count", (), np.int64),
        ("gpu_cap", (MAX_GPUS_PER_NODE,), np.int64),
        ("nvlink", (MAX_GPUS_PER_NODE,), np.int64),
        ("cpu_free", (), np.int64),
        ("mem_free", (), np.int64),
        ("gpu_free", (MAX_GPUS_PER_NODE,), np.int64),
        ("version", (), np.int64),
        ("hw_version", (), np.int64),
        ("model_id", (), np.int32),
        ("topo", (MAX_TOPOLOGY_LEVELS,), np.int64),
        ("type_id", (), np.int64),
    )

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes: list[Node] = list(nodes)
        n = self._n = len(self.nodes)
        self.model_names: tuple[str, ...] = tuple(sorted({x.gpu_model for x in self.nodes}))
        index = {m: i for i, m in enumerate(self.model_names)}
        self._buf: dict[str, np.ndarray] = {
            name: np.zeros((max(n, 1), *row), dtype=dt) for name, row, dt in self._ARRAYS
        }
        self._topo_ids: list[dict[str, int]] = [{} for _ in range(MAX_TOPOLOGY_LEVELS)]
        self._type_ids: dict[tuple[str, int, int, int], int] = {}
        #: Which model names a request's `gpu_models` accept, memoised (cleared when a model
        #: the fleet did not have joins).
        self.model_matches: dict[frozenset[str], ModelMatch] = {}
        b = self._buf
        b["model_id"][:n] = [index[x.gpu_model] for x in self.nodes]
        b["cpu_cap"][:n] = [x.cpu_milli for x in self.nodes]
        b["mem_cap"][:n] = [x.memory_mib for x in self.nodes]
        b["gpu_count"][:n] = [x.gpu_count for x in self.nodes]
        for i, x in enumerate(self.nodes):
            self._hardware(i, x)
        b["cpu_free"][:n] = b["cpu_cap"][:n]
        b["mem_free"][:n] = b["mem_cap"][:n]
        b["gpu_free"][:n] = b["gpu_cap"][:n]
        self.hw_epoch = 0
        self._changes: list[int] = []  # rows changed, in order (`stale_rows`)
        self._changes_base = 0  # the number of the first of them (older ones dropped)
        self._views()

    def _views(self) -> None:
        n = self._n
        for name, _, _ in self._ARRAYS:
            setattr(self, name, self._buf[name][:n])

    def _hardware(self, i: int, x: Node) -> None:
        """Row `i`'s GPU capacity and NVLink domains from `x` (buffers, before `_views`)."""
        b = self._buf
        b["gpu_cap"][i] = 0
        b["gpu_cap"][i, : x.gpu_count] = GPU_MILLI
        # Absent GPUs get a domain of their own (-1 - slot) so they never match a real one.
        b["nvlink"][i] = -1
        doms = x.nvlink_domains if x.nvlink_domains is not None else (0,) * x.gpu_count
        b["nvlink"][i, : x.gpu_count] = doms
        sig = (x.gpu_model, x.cpu_milli, x.memory_mib, x.gpu_count)
        b["type_id"][i] = self._type_ids.setdefault(sig, len(self._type_ids))
        b["topo"][i] = -1
        for level, value in enumerate(x.topology):
            if value:
                ids = self._topo_ids[level]
                b["topo"][i, level] = ids.setdefault(value, len(ids))

    def __len__(self) -> int:
        return self._n

    @property
    def capacity(self) -> int:
        """Rows allocated (>= len): per-node caches may size their buffers to it."""
        return len(self._buf["version"])

    # -- nodes coming and going -------------------------------------------------------------
    def add_node(self, node: Node) -> int:
        """Append `node` (all of it free); its index."""
        i = self._n
        if i == self.capacity:
            for name, arr in self._buf.items():
                grown = np.zeros((2 * len(arr), *arr.shape[1:]), dtype=arr.dtype)
                grown[:i] = arr[:i]
                self._buf[name] = grown
        self.nodes.append(node)
        self._n = i + 1
        self._set_row(i, node)
        return i

    def replace_node(self, i: int, node: Node) -> None:
        """Re-describe node `i` in place, all of it free: the caller makes sure nothing holds
        anything there (a busy node keeps its shape until it drains)."""
        self.nodes[i] = node
        self._set_row(i, node)
        self.version[i] += 1  # logged by `_set_row`

    def _set_row(self, i: int, node: Node) -> None:
        b = self._buf
        if node.gpu_model not in self.model_names:
            # A new model: ids follow the sorted names, so earlier rows are renumbered (a
            # handful of times per fleet; masks are by name, so no cache goes stale by it).
            old = self.model_names
            self.model_names = tuple(sorted({*old, node.gpu_model}))
            self.model_matches.clear()
            remap = np.array([self.model_names.index(m) for m in old], dtype=np.int32)
            if old:
                b["model_id"][: self._n] = remap[b["model_id"][: self._n]]
        b["model_id"][i] = self.model_names.index(node.gpu_model)
        b["cpu_cap"][i] = b["cpu_free"][i] = node.cpu_milli
        b["mem_cap"][i] = b["mem_free"][i] = node.memory_mib
        b["gpu_count"][i] = node.gpu_count
        self._hardware(i, node)
        b["gpu_free"][i] = b["gpu_cap"][i]
        b["hw_version"][i] += 1
        self.hw_epoch += 1
        self._views()
        self._log(i)

    # -- changes ----------------------------------------------------------------------------
    def touch(self, n: int) -> None:
        """Node `n`'s row was changed by its owner in place (the queue zeroing or giving back a
        masked GPU): bump its version and log it, as every method here does."""
        self.version[n] += 1
        self._log(n)

    def _log(self, n: int) -> None:
        self._changes.append(n)
        if len(self._changes) > _CHANGES_KEPT:
            half = _CHANGES_KEPT // 2
            del self._changes[:half]
            self._changes_base += half

    @property
    def tick(self) -> int:
        """The number of node changes so far: pass it to `stale_rows` later."""
        return self._changes_base + len(self._changes)

    def stale_rows(self, seen: np.ndarray, since: int) -> np.ndarray:
        """The rows (sorted, each once) whose `version` differs from `seen`'s (a cache's
        versions, at least `len(self)` long), for a cache that was up to date with every row
        changed before `tick` == `since` (-1: never): only the rows changed since are
        compared, or every row when the log no longer reaches back that far."""
        n = self._n
        start = since - self._changes_base
        if since < 0 or start < 0 or start > len(self._changes):
            rows: np.ndarray = np.flatnonzero(seen[:n] != self.version)
            return rows
        if start == len(self._changes):
            return np.zeros(0, dtype=np.intp)
        if len(self._changes) - start <= _FEW_CHANGES:
            # A placement's few rows: compared one by one (a handful of numpy calls on tiny
            # arrays cost more than the comparison).
            version = self.version
            few = [r for r in sorted(set(self._changes[start:])) if seen[r] != version[r]]
            return np.array(few, dtype=np.intp)
        cand = np.unique(np.array(self._changes[start:], dtype=np.intp))
        rows = cand[seen[cand] != self.version[cand]]
        return rows

    # -- views ------------------------------------------------------------------------------
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

    def model_mask(self, models: Iterable[str], rows: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of nodes (of `rows`, default all) whose GPU model `models` accept (all
        nodes if empty)."""
        wanted = frozenset(models)
        mid = self.model_id if rows is None else self.model_id[rows]
        if not wanted:
            return np.ones(len(mid), dtype=bool)
        accepted = set(self.model_match(wanted).matched)
        ids = [i for i, m in enumerate(self.model_names) if m in accepted]
        return np.isin(mid, ids)

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

    def could_host(self, pod: PodRequest, n: int) -> bool:
        """Whether node `n` can host `pod` now (`feasible` for one node)."""
        if self.cpu_free[n] < pod.cpu_milli or self.mem_free[n] < pod.memory_mib:
            return False
        if not self.model_allows(n, pod.gpu_models):
            return False
        return int((self.gpu_free[n] >= pod.gpu_milli).sum()) >= pod.num_gpu

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
        self.touch(n)

    def hold_host(self, n: int, cpu_milli: int, memory_mib: int) -> None:
        """Host CPU and memory of node `n` taken by work placed outside the queue (negative:
        given back)."""
        self.cpu_free[n] -= cpu_milli
        self.mem_free[n] -= memory_mib
        self.touch(n)

    def release(self, pod: PodRequest, placement: NodeGpus) -> None:
        """Give back what `apply` took (a finished or preempted pod)."""
        n = placement.node
        self.cpu_free[n] += pod.cpu_milli
        self.mem_free[n] += pod.memory_mib
        for g in placement.gpus:
            self.gpu_free[n, g] += pod.gpu_milli
        if (self.cpu_free[n] > self.cpu_cap[n]) or (self.gpu_free[n] > self.gpu_cap[n]).any():
            raise ValueError(f"release of {placement} frees more than node {n} has")
        self.touch(n)
