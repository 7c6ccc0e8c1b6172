"""bench-fleet's baselines: Kubernetes' scoring and cluster-autoscaler, modelled on the slicer's
cluster arrays.

Owns two `Policy` implementations of kube-scheduler's NodeResourcesFit scoring over CPU,
memory and GPU (the GPU as one extended resource counted in milli-GPUs, as the trace's GPU-share
scheduler does): `LeastAllocated` plus `BalancedAllocation` (the default profile) and
`MostAllocated` (GKE's optimize-utilization profile), and the autoscaler's decisions
(`least_waste_type`: the least-waste expander; `ca_scale_down_ok`: cluster-autoscaler's
scale-down rule, a node under `threshold` requested for 10 minutes whose pods are all movable
and fit elsewhere). The GPU within a node is the tightest that fits (both profiles), whole GPUs
the first free ones.

It must not decide anything for Seedance (its placement is the slicer core's own) or keep
state beyond what a caller passes in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seedance.slicer.core.model import GPU_MILLI, ClusterState, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.policies import choose_whole_gpus, reject_reason

__all__ = ["LeastAllocated", "MostAllocated", "NodeType", "least_waste_type"]


def _fractions_after(
    state: ClusterState, rows: np.ndarray, pod: PodRequest
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Requested fraction of CPU, memory and GPU of each of `rows` once `pod` is there."""
    cpu = 1 - (state.cpu_free[rows] - pod.cpu_milli) / np.maximum(state.cpu_cap[rows], 1)
    mem = 1 - (state.mem_free[rows] - pod.memory_mib) / np.maximum(state.mem_cap[rows], 1)
    gcap = state.gpu_cap[rows].sum(axis=1)
    gpu = 1 - (state.gpu_free[rows].sum(axis=1) - pod.gpu_milli_total) / np.maximum(gcap, 1)
    return cpu, mem, gpu


def _gpus_on(state: ClusterState, n: int, pod: PodRequest) -> tuple[int, ...]:
    if pod.num_gpu == 1 and pod.gpu_milli < GPU_MILLI:
        free = state.gpu_free[n]
        slack = np.where(free >= pod.gpu_milli, free, GPU_MILLI + 1)
        return (int(np.argmin(slack)),)
    return choose_whole_gpus(state, n, pod)


class _K8sScoring:
    name = ""

    def score(self, cpu: np.ndarray, mem: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        ok = state.feasible(pod)
        if allowed is not None:
            ok &= allowed
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return reject_reason(state, pod)
        s = self.score(*_fractions_after(state, rows, pod))
        n = int(rows[np.argmax(s)])  # ties: the lowest index (kube-scheduler picks at random)
        return NodeGpus(n, _gpus_on(state, n, pod))


class LeastAllocated(_K8sScoring):
    """NodeResourcesFit LeastAllocated + BalancedAllocation, equal weights (the default)."""

    name = "k8s-least-allocated"

    def score(self, cpu: np.ndarray, mem: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        least = ((1 - cpu) + (1 - mem) + (1 - gpu)) / 3
        stacked = np.stack([cpu, mem, gpu])
        balanced = 1 - stacked.std(axis=0)
        out: np.ndarray = least + balanced
        return out


class MostAllocated(_K8sScoring):
    """NodeResourcesFit MostAllocated (GKE's optimize-utilization profile)."""

    name = "k8s-most-allocated"

    def score(self, cpu: np.ndarray, mem: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        out: np.ndarray = (cpu + mem + gpu) / 3
        return out


@dataclass(frozen=True, slots=True)
class NodeType:
    """A node shape of the trace's fleet, how many of it the fleet may have, its price."""

    index: int
    model: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    cap: int
    usd_per_gpu_hour: float

    def fits(self, pod: PodRequest, cpu: int, mem: int, gpu_free: list[int]) -> bool:
        if pod.cpu_milli > cpu or pod.memory_mib > mem:
            return False
        if pod.gpu_models and self.model not in pod.gpu_models:
            return False
        return sum(1 for f in gpu_free if f >= pod.gpu_milli) >= pod.num_gpu


def pack_one(t: NodeType, pods: Sequence[PodRequest]) -> tuple[list[int], float]:
    """First fit of `pods` onto one empty node of type `t`: (indices placed, waste), waste
    being the mean unused fraction of its GPU and CPU (cluster-autoscaler's least-waste
    expander scores CPU and memory; GPUs are what these nodes are bought for)."""
    cpu, mem, gpu = t.cpu_milli, t.memory_mib, [GPU_MILLI] * t.gpus
    placed: list[int] = []
    for i, p in enumerate(pods):
        if not t.fits(p, cpu, mem, gpu):
            continue
        cpu -= p.cpu_milli
        mem -= p.memory_mib
        picks = sorted((g for g in range(t.gpus) if gpu[g] >= p.gpu_milli), key=lambda g: gpu[g])
        for g in picks[: p.num_gpu]:
            gpu[g] -= p.gpu_milli
        placed.append(i)
    if not placed:
        return [], float("inf")
    waste_gpu = sum(gpu) / (GPU_MILLI * t.gpus)
    waste_cpu = cpu / t.cpu_milli
    return placed, (waste_gpu + waste_cpu) / 2


def least_waste_type(
    types: Sequence[NodeType], counts: Sequence[int], pods: Sequence[PodRequest]
) -> tuple[NodeType, list[int]] | None:
    """The type (under its cap) whose one new node wastes least on `pods`, and which of them
    it takes; ties to the lower price per GPU-hour. None when no type with room fits any."""
    best: tuple[float, float, int] | None = None
    chosen: tuple[NodeType, list[int]] | None = None
    for t in types:
        if counts[t.index] >= t.cap:
            continue
        placed, waste = pack_one(t, pods)
        if not placed:
            continue
        key = (round(waste, 9), t.usd_per_gpu_hour, t.index)
        if best is None or key < best:
            best, chosen = key, (t, placed)
    return chosen
