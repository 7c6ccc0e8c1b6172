"""Where a gang goes: all members on one GPU model, in the tightest topology domain holding them.

Owns gang placement for the placement queue: how many members of a request each node can take
now (`member_fit`), the group of nodes a gang is placed inside (`best_group`: one GPU model,
and the innermost topology domain, the node labels of `SchedulerConfig.topology_levels`, say a
multi-node NVLink clique, then a rack, then a block, that holds every member; among such
domains the one with the least room to spare, so large domains stay whole for large gangs; the
whole model's pool when no domain does), the placement itself (`place_gang`: each member by
the policy inside the group, all or nothing), and what to take back for a gang that fits
nowhere (`reclaim_plan`: the preemptible work the caller's rule allows, on the fewest nodes
of the group that would then hold it, the least GPU share first). Inside a node the policy's
`choose_whole_gpus` keeps a member in one NVLink domain.

It must not evict anything (the queue does, and says so), decide who may be evicted (the
caller's rule: its tenant's lower-priority work, or its cohort's borrowers), read a clock or
do I/O. CPU-only gangs have no model: their group is the whole pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from seedance.slicer.core.model import (
    MAX_TOPOLOGY_LEVELS,
    ClusterState,
    NodeGpus,
    PodRequest,
    Rejection,
)
from seedance.slicer.core.policies import Policy

__all__ = ["Group", "Reclaim", "best_group", "member_fit", "place_gang", "reclaim_plan"]

_MANY = np.iinfo(np.int64).max // 4
#: Free (CPU, memory, GPU shares) per node, as `member_fit` counts with.
_Free = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class Group:
    """The nodes a gang goes inside: one model's, and one domain at `level` (a topology level,
    innermost 0; `MAX_TOPOLOGY_LEVELS` for the model's whole pool)."""

    mask: np.ndarray
    level: int
    spare: int


@dataclass(frozen=True, slots=True)
class Reclaim:
    """What to evict (per node, the victims' ids) so that `group` holds the gang."""

    group: Group
    victims: dict[int, list[str]]


def member_fit(
    state: ClusterState,
    pod: PodRequest,
    allowed: np.ndarray | None = None,
    free: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Per node, how many members of `pod` fit (`free`: (cpu, mem, gpu) to count with instead
    of the state's). A shared member is counted per GPU share, a whole one per GPUs."""
    cpu, mem, gpu = free if free is not None else (state.cpu_free, state.mem_free, state.gpu_free)
    model_ok = state.model_mask(pod.gpu_models) if pod.num_gpu and pod.gpu_models else None
    fit = _fit(pod, cpu, mem, gpu, model_ok)
    return fit if allowed is None else np.where(allowed, fit, 0)


def _fit(
    pod: PodRequest,
    cpu: np.ndarray,
    mem: np.ndarray,
    gpu: np.ndarray,
    model_ok: np.ndarray | None,
) -> np.ndarray:
    fit = np.full(len(cpu), _MANY, dtype=np.int64)
    if pod.cpu_milli:
        fit = np.minimum(fit, cpu // pod.cpu_milli)
    if pod.memory_mib:
        fit = np.minimum(fit, mem // pod.memory_mib)
    if pod.num_gpu:
        if pod.is_shared:
            per_gpu = (gpu // pod.gpu_milli).sum(axis=1)
        else:
            per_gpu = (gpu >= pod.gpu_milli).sum(axis=1) // pod.num_gpu
        fit = np.minimum(fit, per_gpu)
        if model_ok is not None:
            fit = np.where(model_ok, fit, 0)
    return np.maximum(fit, 0)


def best_group(state: ClusterState, pod: PodRequest, fit: np.ndarray, need: int) -> Group | None:
    """The group `need` members go inside (see the module docstring), None when no one model
    holds them all. Ties: the tighter level, then the least spare room, then the model's name
    and the domain's number (so the same state always gives the same group)."""
    best: tuple[tuple[int, int, int, int], Group] | None = None
    pools = (
        [(m, state.model_id == m) for m in range(len(state.model_names))]
        if pod.num_gpu
        else [(0, np.ones(len(state), dtype=bool))]
    )
    for model, in_model in pools:
        rows = in_model & (fit > 0)
        total = int(fit[rows].sum())
        if total < need:
            continue
        found: tuple[tuple[int, int, int, int], Group] | None = None
        for level in range(MAX_TOPOLOGY_LEVELS):
            dom = state.topo[:, level]
            sel = rows & (dom >= 0)
            if not sel.any():
                continue
            sums = np.bincount(dom[sel], weights=fit[sel])
            holding = np.flatnonzero(sums >= need)
            if holding.size == 0:
                continue
            d = int(holding[np.argmin(sums[holding])])
            spare = int(sums[d]) - need
            found = ((level, spare, model, d), Group(in_model & (dom == d), level, spare))
            break
        if found is None:
            found = (
                (MAX_TOPOLOGY_LEVELS, total - need, model, -1),
                Group(in_model, MAX_TOPOLOGY_LEVELS, total - need),
            )
        if best is None or found[0] < best[0]:
            best = found
    return best[1] if best is not None else None


def place_gang(
    state: ClusterState,
    policy: Policy,
    pod: PodRequest,
    replicas: int,
    allowed: np.ndarray | None,
    group: Group | None = None,
) -> tuple[NodeGpus, ...] | Rejection:
    """All `replicas` members inside one group, or none (applied as it goes, rolled back on
    the first failure). Without a group that holds them, the rejection names what is short."""
    if group is None:
        group = best_group(state, pod, member_fit(state, pod, allowed), replicas)
    if group is None:
        return _shortage(state, policy, pod, replicas, allowed)
    mask = group.mask if allowed is None else group.mask & allowed
    done: list[NodeGpus] = []
    for _ in range(replicas):
        res = policy.place(state, pod, mask)
        if isinstance(res, Rejection):
            _roll_back(state, pod, done)
            return res
        state.apply(pod, res)
        done.append(res)
    return tuple(done)


def _shortage(
    state: ClusterState,
    policy: Policy,
    pod: PodRequest,
    replicas: int,
    allowed: np.ndarray | None,
) -> Rejection:
    """Why no group holds the gang, in the words the queue has always used: the member that
    first fits nowhere when they are placed one by one anywhere (then rolled back), or, when
    they would all fit only across GPU models, short of GPUs of one model."""
    done: list[NodeGpus] = []
    for _ in range(replicas):
        res = policy.place(state, pod, allowed)
        if isinstance(res, Rejection):
            _roll_back(state, pod, done)
            return res
        state.apply(pod, res)
        done.append(res)
    _roll_back(state, pod, done)
    return Rejection("insufficient_gpu", "no one GPU model has room for every member")


def _roll_back(state: ClusterState, pod: PodRequest, done: Sequence[NodeGpus]) -> None:
    for p in reversed(done):
        state.release(pod, p)


def reclaim_plan(
    state: ClusterState,
    pod: PodRequest,
    replicas: int,
    allowed: np.ndarray | None,
    victims_on: Callable[[int], list[tuple[str, PodRequest, tuple[int, ...]]]],
) -> Reclaim | None:
    """The evictions that let a gang in, None when even they would not.

    `victims_on(node)` lists the work on a node the caller may evict for this gang, in the
    order it would evict it: (id, request, GPUs held there). Of the groups that would hold the
    gang once evicted (one model's pool, or one of its domains), the one that evicts the least
    GPU share wins, then the tighter topology (a block cleared whole is no better than free
    nodes in the pool beside a few evictions); inside it, nodes with room now come first, then
    the nodes whose eviction frees a member for the least GPU share."""
    fit_now = member_fit(state, pod, allowed)
    order, freed = _evictable(state, pod, allowed, victims_on)
    if not order:
        return None
    fit_after = member_fit(state, pod, allowed, freed)
    cost = np.zeros(len(state))  # GPU share evicted per member gained, on each node
    gain = np.zeros(len(state), dtype=np.int64)
    for n, victims in order.items():
        gain[n] = int(fit_after[n] - fit_now[n])
        if gain[n] > 0:
            cost[n] = sum(req.gpu_milli_total for _, req, _ in victims) / gain[n]
    group = _cheapest_group(state, pod, fit_now, fit_after, cost, gain, replicas)
    if group is None:
        return None
    have = int(fit_now[group.mask].sum())
    plan: dict[int, list[str]] = {}
    for n in sorted(np.flatnonzero(group.mask & (gain > 0)).tolist(), key=lambda n: cost[n]):
        if have >= replicas:
            break
        taken, gained = _evict_until(state, pod, n, order[n], replicas - have, int(fit_now[n]))
        plan[n] = taken
        have += gained
    return Reclaim(group, plan) if have >= replicas else None


def _cheapest_group(
    state: ClusterState,
    pod: PodRequest,
    fit_now: np.ndarray,
    fit_after: np.ndarray,
    cost: np.ndarray,
    gain: np.ndarray,
    need: int,
) -> Group | None:
    """Of the groups `fit_after` says would hold `need` members, the one evicting least."""
    best: tuple[tuple[float, int, int], Group] | None = None
    pools = (
        [state.model_id == m for m in range(len(state.model_names))]
        if pod.num_gpu
        else [np.ones(len(state), dtype=bool)]
    )
    for in_model in pools:
        groups = [(MAX_TOPOLOGY_LEVELS, in_model)]
        for level in range(MAX_TOPOLOGY_LEVELS):
            dom = state.topo[:, level]
            sel = in_model & (dom >= 0)
            if sel.any():
                sums = np.bincount(dom[sel], weights=fit_after[sel])
                groups += [(level, in_model & (dom == d)) for d in np.flatnonzero(sums >= need)]
        for level, mask in groups:
            free = int(fit_now[mask].sum())
            if int(fit_after[mask].sum()) < need:
                continue
            evicted, have = 0.0, free
            for n in sorted(np.flatnonzero(mask & (gain > 0)).tolist(), key=lambda n: cost[n]):
                if have >= need:
                    break
                evicted += cost[n] * gain[n]
                have += int(gain[n])
            spare = int(fit_after[mask].sum()) - need
            key = (evicted, level, spare)
            if best is None or key < best[0]:
                best = (key, Group(mask, level, spare))
    return best[1] if best is not None else None


def _evictable(
    state: ClusterState,
    pod: PodRequest,
    allowed: np.ndarray | None,
    victims_on: Callable[[int], list[tuple[str, PodRequest, tuple[int, ...]]]],
) -> tuple[dict[int, list[tuple[str, PodRequest, tuple[int, ...]]]], _Free]:
    """The evictable work per node that could host a member, and the free resources every
    node would have with all of it evicted."""
    cpu, mem, gpu = state.cpu_free.copy(), state.mem_free.copy(), state.gpu_free.copy()
    could = state.gpu_count >= pod.num_gpu
    if pod.num_gpu and pod.gpu_models:
        could &= state.model_mask(pod.gpu_models)
    if allowed is not None:
        could &= allowed
    order: dict[int, list[tuple[str, PodRequest, tuple[int, ...]]]] = {}
    for n in np.flatnonzero(could).tolist():
        victims = victims_on(n)
        if not victims:
            continue
        order[n] = victims
        for _, req, gpus in victims:
            cpu[n] += req.cpu_milli
            mem[n] += req.memory_mib
            gpu[n, list(gpus)] += req.gpu_milli
    return order, (cpu, mem, gpu)


def _evict_until(
    state: ClusterState,
    pod: PodRequest,
    n: int,
    victims: list[tuple[str, PodRequest, tuple[int, ...]]],
    want: int,
    now: int,
) -> tuple[list[str], int]:
    """Victims of node `n` taken in order until it holds `want` more members (or all are)."""
    cpu = state.cpu_free[n : n + 1].copy()
    mem = state.mem_free[n : n + 1].copy()
    gpu = state.gpu_free[n : n + 1].copy()
    model_ok = state.model_mask(pod.gpu_models, np.array([n])) if pod.gpu_models else None
    taken: list[str] = []
    gained = 0
    for vid, req, gpus in victims:
        taken.append(vid)
        cpu[0] += req.cpu_milli
        mem[0] += req.memory_mib
        gpu[0, list(gpus)] += req.gpu_milli
        gained = int(_fit(pod, cpu, mem, gpu, model_ok)[0]) - now
        if gained >= want:
            break
    return taken, max(gained, 0)
