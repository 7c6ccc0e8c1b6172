"""Whether any node type of the fleet could hold a request even empty: impossible said at once.

Owns the judgement "no node type this fleet has, or may scale up to, could ever hold this
request": an unknown GPU model, a MIG profile no GPU offers, more GPUs, GPU memory, CPU or
memory per member than any node type, a gang larger than the fleet's capacity. Such a request
is answered with its own reason, `unsatisfiable`, naming what no node offers and the values
known; it stays queued (the fleet may change) and is judged again when the node types change.

The fleet is every node the inventory described (a node keeps its last description) plus the
node types of pools that may have no node now (`NodePool`: scaled to zero by an autoscaler,
from ``SEEDANCE_SLICER_NODE_POOLS_FILE``), each with the most nodes it may grow to (None: no
bound known, so it never makes a gang unsatisfiable). Judged against node *types* (model, GPU
count and memory, CPU, memory, MIG), a fleet of thousands costs a few comparisons per type.

Pure: no clock, no I/O; it must not place anything (`policies`, `queue` and `mig_pool` do).
GPU names go through the one GPU identity (`seedance.events.gpu_requests.match_models`), so `t4`
matches a fleet's `T4` and `b200` is answered with the models the fleet has.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from seedance.events.gpu_requests import match_models
from seedance.slicer.core.inputs import GpuSpec, JobSpec, NodeSpec
from seedance.slicer.core.mig import mig_model, profiles

__all__ = [
    "REASON",
    "NodePool",
    "NodeType",
    "TypeKey",
    "fleet_types",
    "node_pools",
    "type_key",
    "types_of",
    "unsatisfiable",
]

#: The fine and the published reason of a request no node type could hold.
REASON = "unsatisfiable"


@dataclass(frozen=True, slots=True)
class NodeType:
    """One hardware type of the fleet and how many nodes of it there are (or may be)."""

    gpu_model: str
    gpus: int
    gpu_mem_mib: int
    cpu_milli: int
    memory_mib: int
    #: The MIG profiles its GPUs offer (empty: not MIG-capable, or a geometry not known).
    mig_profiles: tuple[str, ...]
    #: Nodes of this type (None: a pool with no known bound).
    count: int | None

    def label(self) -> str:
        gpus = f"{self.gpus}x {self.gpu_model}" if self.gpus else "no GPU"
        mem = f", {self.gpu_mem_mib} MiB each" if self.gpus and self.gpu_mem_mib else ""
        return f"{gpus}{mem}, {self.cpu_milli} mCPU, {self.memory_mib} MiB"


@dataclass(frozen=True, slots=True)
class NodePool:
    """A pool that may have no node now: its node's description and the most nodes it may
    grow to (None: unbounded as far as Seedance knows)."""

    node: NodeSpec
    max_nodes: int | None = None


def node_pools(doc: object) -> tuple[NodePool, ...]:
    """The pools of a node-pools document (YAML or JSON, parsed)::

        pools:
          - name: h100-spot            # for messages only
            gpu_model: NVIDIA H100 80GB HBM3
            gpus: 8
            gpu_mem_mib: 81559
            mig_capable: true
            cpu_milli: 192000
            memory_mib: 2000000
            max_nodes: 4               # optional

    ValueError naming the field and the value on anything else."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("pools"), list):
        raise ValueError(f"node pools: expected a mapping with a list 'pools', got {doc!r}"[:300])
    out: list[NodePool] = []
    for i, raw in enumerate(doc["pools"]):
        where = f"pools[{i}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {raw!r}")
        gpus = _int(raw, "gpus", where, 0)
        model = raw.get("gpu_model", "")
        if gpus and (not isinstance(model, str) or not model):
            raise ValueError(f"{where}.gpu_model: a pool with GPUs names their model")
        gpu = GpuSpec(
            model=str(model),
            mem_mib=_int(raw, "gpu_mem_mib", where, 0),
            mig_capable=bool(raw.get("mig_capable", False)),
        )
        node = NodeSpec(
            name=str(raw.get("name") or f"pool-{i}"),
            cpu_milli=_int(raw, "cpu_milli", where, None),
            memory_mib=_int(raw, "memory_mib", where, None),
            gpus=(gpu,) * gpus,
        )
        max_nodes = raw.get("max_nodes")
        if max_nodes is not None:
            max_nodes = _int(raw, "max_nodes", where, None)
        out.append(NodePool(node, max_nodes))
    return tuple(out)


def _int(raw: Mapping[str, Any], key: str, where: str, default: int | None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}.{key}: expected an integer >= 0, got {value!r}")
    return value


TypeKey = tuple[str, int, int, int, int, tuple[str, ...]]


def fleet_types(nodes: Iterable[NodeSpec], pools: Sequence[NodePool] = ()) -> tuple[NodeType, ...]:
    """The node types of `nodes` (counted) and of `pools` (their bound added to the count)."""
    counts: dict[TypeKey, int] = {}
    for node in nodes:
        key = type_key(node)
        counts[key] = counts.get(key, 0) + 1
    return types_of(counts, pools)


def types_of(counts: Mapping[TypeKey, int], pools: Sequence[NodePool] = ()) -> tuple[NodeType, ...]:
    """`fleet_types` from per-type node counts (kept up to date node by node by the caller)."""
    merged: dict[TypeKey, int | None] = {k: n for k, n in counts.items() if n > 0}
    for pool in pools:
        key = type_key(pool.node)
        have = merged.get(key, 0)
        merged[key] = None if pool.max_nodes is None or have is None else have + pool.max_nodes
    return tuple(NodeType(*key, count) for key, count in sorted(merged.items(), key=_order))


def _order(item: tuple[TypeKey, int | None]) -> TypeKey:
    return item[0]


def type_key(node: NodeSpec) -> TypeKey:
    """A node's hardware type: GPU model, GPU count and memory, CPU, memory, MIG profiles."""
    gpu = node.gpus[0] if node.gpus else None
    return (
        gpu.model if gpu else "",
        len(node.gpus),
        gpu.mem_mib if gpu else 0,
        node.cpu_milli,
        node.memory_mib,
        # Any GPU of it, not the first alone: NVIDIA's "mixed" strategy puts some of a node's
        # GPUs in MIG mode and leaves the others whole (the dev overlay's node: its last).
        _mig_profiles(gpu.model)
        if gpu and any(g.mig_capable or g.mig_enabled for g in node.gpus)
        else (),
    )


@functools.lru_cache(maxsize=256)
def _mig_profiles(model: str) -> tuple[str, ...]:
    geometry = mig_model(model)
    return tuple(p.name for p in profiles(geometry)) if geometry is not None else ()


def unsatisfiable(job: JobSpec, types: Sequence[NodeType]) -> str:
    """Why no node type of `types` could hold `job` even empty ("" when one could, or when the
    fleet is not known yet: no types). The message names what no node offers and the values
    the fleet has."""
    if not types:
        return ""
    if job.gpus == 0:
        return _host_fit(job, list(types), "node")
    gpu_types = _gpu_types(job, types)
    if isinstance(gpu_types, str):
        return gpu_types
    if job.mig_profile is not None:
        offered = [t for t in gpu_types if job.mig_profile in t.mig_profiles]
        if not offered:
            return (
                f"MIG profile {job.mig_profile}: no GPU of the fleet offers it "
                f"(MIG profiles offered: {_mig_offer(gpu_types)})"
            )
        return _host_fit(job, offered, "MIG-capable node")
    return _gpu_fit(job, gpu_types) or _host_fit(job, gpu_types, "GPU node")


def _gpu_types(job: JobSpec, types: Sequence[NodeType]) -> list[NodeType] | str:
    """The GPU node types whose model the job accepts, or why there is none."""
    gpu_types = [t for t in types if t.gpus > 0]
    if not gpu_types:
        return f"gpus={job.gpus}: the fleet has no GPU node (node types: {_labels(types)})"
    if not job.gpu_models:
        return gpu_types
    models = sorted({t.gpu_model for t in gpu_types})
    match = match_models(job.gpu_models, models)
    if not match.matched:
        return match.reason(models)
    return [t for t in gpu_types if t.gpu_model in match.matched]


def _gpu_fit(job: JobSpec, gpu_types: Sequence[NodeType]) -> str:
    """More GPUs per member, or more memory per GPU, than any accepted type has ("" if not)."""
    most = max(t.gpus for t in gpu_types)
    if job.gpus > most:
        return f"gpus={job.gpus} per member: a node has at most {most} GPUs ({_models(gpu_types)})"
    if job.gpu_mem_mib and all(t.gpu_mem_mib for t in gpu_types):
        biggest = max(t.gpu_mem_mib for t in gpu_types)
        if job.gpu_mem_mib > biggest:
            return (
                f"gpu_mem_mib={job.gpu_mem_mib}: the fleet's GPUs have at most {biggest} MiB "
                f"({_models(gpu_types)})"
            )
    return ""


def _host_fit(job: JobSpec, types: list[NodeType], what: str) -> str:
    """The per-member fit on one node type, then the gang's capacity within one GPU model."""
    fits = [t for t in types if _holds(t, job)]
    if not fits:
        return (
            f"no {what} holds one member (gpus={job.gpus}, gpu_mem_mib={job.gpu_mem_mib}, "
            f"cpu_milli={job.cpu_milli}, memory_mib={job.memory_mib}): node types are "
            f"{_labels(types)}"
        )
    if job.gang_size <= 1:
        return ""
    per_model: dict[str, int] = {}
    for t in fits:
        if t.count is None:
            return ""  # a pool with no known bound may grow to hold it
        members = t.count * _members_per_node(t, job)
        per_model[t.gpu_model] = per_model.get(t.gpu_model, 0) + members
    most = max(per_model.values())
    if most >= job.gang_size:
        return ""
    held = ", ".join(f"{m or 'CPU'}: {n}" for m, n in sorted(per_model.items()))
    return (
        f"gang_size={job.gang_size}: the fleet holds at most {most} such members in one GPU "
        f"model ({held})"
    )


def _holds(t: NodeType, job: JobSpec) -> bool:
    if t.cpu_milli < job.cpu_milli or t.memory_mib < job.memory_mib:
        return False
    if job.gpus == 0 or job.mig_profile is not None:
        return True
    if t.gpus < job.gpus:
        return False
    return not (job.gpu_mem_mib and t.gpu_mem_mib and t.gpu_mem_mib < job.gpu_mem_mib)


def _members_per_node(t: NodeType, job: JobSpec) -> int:
    """How many members of `job` one empty node of type `t` holds."""
    limits: list[int] = []
    if job.gpus:
        per_gpu = 1000 // job.gpu_milli if job.gpus == 1 and job.gpu_milli < 1000 else 1
        limits.append(t.gpus * per_gpu // job.gpus)
    if job.cpu_milli:
        limits.append(t.cpu_milli // job.cpu_milli)
    if job.memory_mib:
        limits.append(t.memory_mib // job.memory_mib)
    return min(limits) if limits else job.gang_size


def _labels(types: Sequence[NodeType]) -> str:
    return "; ".join(t.label() for t in types)


def _models(types: Sequence[NodeType]) -> str:
    return ", ".join(sorted({f"{t.gpu_model}: {t.gpus} GPUs" for t in types}))


def _mig_offer(types: Sequence[NodeType]) -> str:
    offer = {t.gpu_model: t.mig_profiles for t in types if t.mig_profiles}
    if not offer:
        return "none: no MIG-capable GPU among " + ", ".join(sorted({t.gpu_model for t in types}))
    return "; ".join(f"{m}: {' '.join(p)}" for m, p in sorted(offer.items()))
