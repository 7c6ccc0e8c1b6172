"""NodeGpus policies: given the cluster state and one request, choose a node and GPUs.

Owns the `Policy` protocol and its implementations: first-fit, BestFit, a faithful FGD, and
Seedance's own policy (`SeedancePolicy`). Policies only read the state; the caller applies the
placement. They must not read clocks, sleep, or do I/O; they keep only caches derived from the
state (invalidated by `ClusterState.version`, or per node signature: `core.signatures`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from seedance.slicer.core.fragmentation import FragmentationIndex, TargetWorkload
from seedance.slicer.core.model import GPU_MILLI, ClusterState, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.signatures import NodeSignatures

__all__ = [
    "BestFit",
    "FirstFit",
    "FragmentationGradientDescent",
    "Policy",
    "SeedancePolicy",
    "choose_whole_gpus",
    "reject_reason",
]

# BestFit's normalisation in the paper's artifact: 128 cores and 8 GPUs.
_BF_CPU_MILLI = 128_000.0
_BF_GPU_MILLI = 8 * GPU_MILLI * 1.0
# Fragmentation deltas are float sums of integer counts times weights: round before comparing
# so that equal deltas computed along different paths tie exactly.
_KEY_SCALE = 1e6
_GPU_SLOTS = 2048  # > GPU_MILLI: the in-node GPU tie-break lives below one key step
_INFEASIBLE = np.iinfo(np.int64).max
# Distinct request shapes whose scores are cached (per node signature: 24 bytes a signature,
# ~75 KB each on the 17,112-node fleet's 3,133 signatures); openb's lists have 150–430 shapes.
_CACHE_REQUESTS = 4096


class Policy(Protocol):
    """Chooses where one request goes; does not change the state."""

    name: str

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        """`allowed` (bool per node) restricts the choice, e.g. to keep reserved nodes."""
        ...


def reject_reason(state: ClusterState, pod: PodRequest) -> Rejection:
    """Name the first resource no node has enough of (a closed set, used as a metric label)."""
    if pod.mig_profile is not None:
        return Rejection("mig_not_supported", "MIG requests go to the MIG planner")
    if pod.gpu_models and not state.model_mask(pod.gpu_models).any():
        # The answer says what was asked and which models the fleet has (by their identity).
        match = state.model_match(pod.gpu_models)
        return Rejection("no_allowed_gpu_model", match.reason(state.model_names))
    if not (state.cpu_free >= pod.cpu_milli).any():
        return Rejection("insufficient_cpu")
    if not (state.mem_free >= pod.memory_mib).any():
        return Rejection("insufficient_memory")
    if pod.num_gpu and not ((state.gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu).any():
        return Rejection("insufficient_gpu")
    return Rejection("no_single_node_fits", "each resource is free somewhere, not together")


def choose_whole_gpus(state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
    """Pick `pod.num_gpu` GPUs with enough free share on `node`, all or nothing.

    For several GPUs it prefers one NVLink domain: the domain with the fewest free GPUs that
    still holds the whole gang (best fit, so large domains stay whole for larger gangs); if no
    domain can hold it, it fills from the largest domains down.
    """
    free = state.gpu_free[node]
    ok = np.flatnonzero(free >= pod.gpu_milli)
    k = pod.num_gpu
    if ok.size < k:
        raise ValueError(f"node {node} has {ok.size} GPUs free for {k}")
    if k <= 1:
        return (int(ok[0]),) if k else ()
    doms = state.nvlink[node, ok]
    uniq, counts = np.unique(doms, return_counts=True)
    if uniq.size == 1:
        return tuple(int(g) for g in ok[:k])
    holding = counts >= k
    if holding.any():
        best = uniq[holding][np.argmin(counts[holding])]
        return tuple(int(g) for g in ok[doms == best][:k])
    order = np.argsort(-counts, kind="stable")
    picked: list[int] = []
    for d in uniq[order]:
        picked.extend(int(g) for g in ok[doms == d])
    return tuple(picked[:k])


class FirstFit:
    """Nodes in inventory order; the first GPU with enough free share."""

    name = "first-fit"

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        if pod.mig_profile is not None:
            return reject_reason(state, pod)
        ok = np.flatnonzero(_masked(state.feasible(pod), allowed))
        if ok.size == 0:
            return reject_reason(state, pod)
        n = int(ok[0])
        return NodeGpus(n, choose_whole_gpus(state, n, pod))


def _masked(ok: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    return ok if allowed is None else ok & allowed


def _bestfit_score(
    state: ClusterState, nodes: np.ndarray, pod: PodRequest, gpu_free_total: np.ndarray
) -> np.ndarray:
    """BestFit's score of `nodes` (lower fits tighter); `gpu_free_total`: each one's free GPU
    share summed over its GPUs (FGD reads it off its index instead of summing)."""
    cpu_left = state.cpu_free[nodes] - pod.cpu_milli
    gpu_left = gpu_free_total - pod.gpu_milli_total
    score: np.ndarray = 0.5 * cpu_left / _BF_CPU_MILLI + 0.5 * gpu_left / _BF_GPU_MILLI
    return score


def _tightest_gpu(state: ClusterState, node: int, pod: PodRequest) -> tuple[int, ...]:
    if not pod.is_shared:
        return choose_whole_gpus(state, node, pod)
    free = state.gpu_free[node]
    slack = np.where(free >= pod.gpu_milli, free, GPU_MILLI + 1)
    return (int(np.argmin(slack)),)


class BestFit:
    """The paper's BestFit: least 0.5·CPU left/128 cores + 0.5·GPU left/8 GPUs; tightest GPU.
    Ties go to the lowest node index (deterministic)."""

    name = "bestfit"

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        if pod.mig_profile is not None:
            return reject_reason(state, pod)
        ok = np.flatnonzero(_masked(state.feasible(pod), allowed))
        if ok.size == 0:
            return reject_reason(state, pod)
        n = int(ok[np.argmin(_bestfit_score(state, ok, pod, state.gpu_free[ok].sum(axis=1)))])
        return NodeGpus(n, _tightest_gpu(state, n, pod))


class FragmentationGradientDescent:
    """FGD: the candidate (node, and GPU for shared requests) whose placement increases the
    node's fragmentation F_n(M) least (exact Δ, not the simulator's quantised sigmoid score).

    Tie-break (research note §3): among equal Δ, BestFit's score, then the tighter GPU, then
    the lower node index. Random ties lose about 4 points of allocation on openb, because the
    95 % popularity cut leaves 8-GPU classes out of M and nothing else keeps 8-GPU nodes whole.
    """

    name = "fgd"

    def __init__(self, workload: TargetWorkload) -> None:
        self.workload = workload
        self._index: FragmentationIndex | None = None
        self._previous: FragmentationIndex | None = None
        self._model_ok: dict[frozenset[str], np.ndarray] = {}
        self._model_ok_epoch = -1
        self._signatures: NodeSignatures | None = None

    def inherit(self, other: Policy) -> None:
        """Start from `other`'s fragmentation index (this policy replaces it: a refresh of the
        target workload), reusing the columns of the GPU shapes both workloads have, and from
        its node signatures (they depend on the nodes only)."""
        if isinstance(other, FragmentationGradientDescent):
            self._previous = other._index
            self._signatures = other._signatures

    def signatures(self, state: ClusterState) -> NodeSignatures:
        """The nodes' signatures (`core.signatures`), kept across refreshes (`inherit`)."""
        if self._signatures is None or self._signatures.state is not state:
            self._signatures = NodeSignatures(state)
        return self._signatures

    def index(self, state: ClusterState) -> FragmentationIndex:
        if self._index is None or self._index.state is not state:
            sigs = self.signatures(state)
            self._index = FragmentationIndex(state, self.workload, self._previous, sigs)
            self._previous = None
            self._model_ok = {}
        self._index.sync()
        return self._index

    def _model_mask(self, state: ClusterState, models: frozenset[str]) -> np.ndarray:
        if self._model_ok_epoch != state.hw_epoch:
            # A node came or changed: the masks (one vector op each) are rebuilt as needed.
            self._model_ok = {}
            self._model_ok_epoch = state.hw_epoch
        mask = self._model_ok.get(models)
        if mask is None:
            mask = self._model_ok[models] = state.model_mask(models)
        return mask

    def node_scores(
        self, state: ClusterState, pod: PodRequest, nodes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per node of `nodes`: (score key, GPU for a shared request), key = `_INFEASIBLE`
        where the pod does not fit. The key orders by Δ (rounded to 1e-6 milli) and, inside
        a node, by the tighter GPU; it depends on that node's state only, so it can be cached
        until the node changes."""
        key = np.full(nodes.size, _INFEASIBLE, dtype=np.int64)
        gpu = np.full(nodes.size, -1, dtype=np.int64)
        st = state
        ok = (st.cpu_free[nodes] >= pod.cpu_milli) & (st.mem_free[nodes] >= pod.memory_mib)
        if pod.num_gpu:
            # The GPUs' free shares are read for the nodes that pass, not the whole fleet.
            idx = self._index if self._index is not None else self.index(state)
            ok &= idx.hosts(nodes, pod.num_gpu, pod.gpu_milli)
            if pod.gpu_models:
                ok &= self._model_mask(state, pod.gpu_models)[nodes]
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return key, gpu
        if not pod.is_shared:
            d = self.deltas(state, pod, nodes[rows], None)
            key[rows] = np.rint(d * _KEY_SCALE).astype(np.int64) * _GPU_SLOTS
            return key, gpu
        # Shared request: one candidate per (node, GPU); fully free GPUs of a node are
        # interchangeable, so only the first of them is scored.
        free = st.gpu_free[nodes[rows]]
        fits = free >= pod.gpu_milli
        full = free == GPU_MILLI
        fits &= ~full | (np.cumsum(full, axis=1) == 1)
        r, g = np.nonzero(fits)
        f = free[r, g]
        d = self.deltas(state, pod, nodes[rows[r]], f)
        comp = np.rint(d * _KEY_SCALE).astype(np.int64) * _GPU_SLOTS + (f - pod.gpu_milli)
        # Candidates come grouped by row (np.nonzero is row-major): take each group's minimum.
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        best = np.minimum.reduceat(comp, starts)
        counts = np.diff(np.r_[starts, r.size])
        hit = np.flatnonzero(comp == np.repeat(best, counts))
        first = hit[np.r_[True, r[hit[1:]] != r[hit[:-1]]]]
        key[rows] = best
        gpu[rows[r[first]]] = g[first]
        return key, gpu

    def deltas(
        self, state: ClusterState, pod: PodRequest, nodes: np.ndarray, free: np.ndarray | None
    ) -> np.ndarray:
        """Change of F_n(M) per candidate (node, and GPU free share for shared requests)."""
        idx = self._index if self._index is not None else self.index(state)
        delta: np.ndarray = idx.frag_after(nodes, pod, free) - idx.frag[nodes]
        return delta

    def select(
        self,
        state: ClusterState,
        pod: PodRequest,
        key: np.ndarray,
        gpu: np.ndarray,
        allowed: np.ndarray | None = None,
    ) -> NodeGpus | Rejection:
        """Least key; ties by BestFit's score, then the lower node index."""
        if allowed is not None:
            key = np.where(allowed, key, _INFEASIBLE)
        low = key.min()
        if low == _INFEASIBLE:
            return reject_reason(state, pod)
        tied = np.flatnonzero(key == low)
        n = int(tied[0])
        if tied.size > 1:
            tot = self._gpu_free_total(state, tied)
            n = int(tied[np.argmin(_bestfit_score(state, tied, pod, tot))])
        if pod.is_shared:
            return NodeGpus(n, (int(gpu[n]),))
        return NodeGpus(n, choose_whole_gpus(state, n, pod))

    def _gpu_free_total(self, state: ClusterState, nodes: np.ndarray) -> np.ndarray:
        """Each node's free GPU share, read off the index (synced by `place`) rather than summed
        over its GPUs: the same values, without a gather of every GPU of every tied node
        (thousands on a fleet of identical nodes)."""
        idx = self._index
        total: np.ndarray = (
            state.gpu_free[nodes].sum(axis=1)
            if idx is None or idx.state is not state
            else idx.tot[nodes]
        )
        return total

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        if pod.mig_profile is not None:
            return reject_reason(state, pod)
        self.index(state)
        key, gpu = self.node_scores(state, pod, np.arange(len(state)))
        return self.select(state, pod, key, gpu, allowed)


class _Scores:
    """One request shape's scores per node signature id (`core.signatures`): the key and GPU
    of `node_scores` for the signature's nodes, and the id's generation they were computed
    for (-1: never). Sized to the ids, not to the fleet (3,133 signatures on 17,112 nodes)."""

    __slots__ = ("gen", "gpu", "key", "state")

    def __init__(self, state: ClusterState, ids: int) -> None:
        self.state = state
        self.key = np.full(ids, _INFEASIBLE, dtype=np.int64)
        self.gpu = np.full(ids, -1, dtype=np.int64)
        self.gen = np.full(ids, -1, dtype=np.int64)

    def fit(self, ids: int) -> None:
        """Room for `ids` ids (new ones never scored)."""
        if len(self.key) < ids:
            size = max(ids, 2 * len(self.key))
            for name, fill in (("key", _INFEASIBLE), ("gpu", -1), ("gen", -1)):
                old = getattr(self, name)
                grown = np.full(size, fill, dtype=np.int64)
                grown[: len(old)] = old
                setattr(self, name, grown)


class SeedancePolicy(FragmentationGradientDescent):
    """Seedance's placement: FGD's descent over the full target workload (no 95 % cut, so
    8-GPU classes count), plus a look-ahead penalty on GPU share that a node's CPU and memory
    can no longer feed at the workload's own CPU-per-GPU and memory-per-GPU ratios.
    See docs/slicer.md for what each part buys."""

    name = "seedance"

    def __init__(
        self,
        workload: TargetWorkload,
        *,
        cpu_per_gpu_milli: float,
        mem_mib_per_gpu_milli: float,
        strand_weight: float = 1.0,
    ) -> None:
        super().__init__(workload)
        self.cpu_per_gpu_milli = cpu_per_gpu_milli
        self.mem_mib_per_gpu_milli = mem_mib_per_gpu_milli
        self.strand_weight = strand_weight
        self._cache: dict[PodRequest, _Scores] = {}

    @classmethod
    def for_trace(cls, pods: list[PodRequest], **kw: float) -> SeedancePolicy:
        gpu = sum(p.gpu_milli_total for p in pods) or 1
        return cls(
            TargetWorkload.from_pods(pods, coverage=1.0),
            cpu_per_gpu_milli=sum(p.cpu_milli for p in pods) / gpu,
            mem_mib_per_gpu_milli=sum(p.memory_mib for p in pods) / gpu,
            **kw,
        )

    def _stranded(self, tot: np.ndarray, cpu: np.ndarray, mem: np.ndarray) -> np.ndarray:
        fed = np.minimum(cpu / self.cpu_per_gpu_milli, mem / self.mem_mib_per_gpu_milli)
        unfed: np.ndarray = np.maximum(tot - fed, 0.0)
        return unfed

    def deltas(
        self, state: ClusterState, pod: PodRequest, nodes: np.ndarray, free: np.ndarray | None
    ) -> np.ndarray:
        d = super().deltas(state, pod, nodes, free)
        if not self.strand_weight:
            return d
        idx = self._index if self._index is not None else self.index(state)
        tot = idx.tot[nodes]
        cpu, mem = state.cpu_free[nodes], state.mem_free[nodes]
        before = self._stranded(tot, cpu, mem)
        after = self._stranded(tot - pod.gpu_milli_total, cpu - pod.cpu_milli, mem - pod.memory_mib)
        scored: np.ndarray = d + self.strand_weight * (after - before)
        return scored

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        """FGD's selection, scored once per node signature (`core.signatures`: nodes of one
        signature score alike) and cached per request shape and signature: a shape asked
        again scores only the signatures new since (a placement moves a node to another
        signature, most often one already scored); a shape new to the policy (first seen,
        or each shape after a refresh of the target workload, which changes every score)
        scores every signature. The least key is found among the signatures, and the nodes
        of the tied ones only are read, so nothing here passes over the whole fleet."""
        if pod.mig_profile is not None:
            return reject_reason(state, pod)
        self.index(state)
        sigs = self.signatures(state)
        scores = self._cache.get(pod)
        if scores is None or scores.state is not state:
            if scores is None and len(self._cache) >= _CACHE_REQUESTS:
                del self._cache[next(iter(self._cache))]  # oldest request shape
            scores = self._cache[pod] = _Scores(state, sigs.bound)
        live, rep, gen = sigs.held()
        scores.fit(sigs.bound)
        stale = np.flatnonzero(scores.gen[live] != gen)
        if stale.size:
            ids = live[stale]
            scores.key[ids], scores.gpu[ids] = self.node_scores(state, pod, rep[stale])
            scores.gen[ids] = gen[stale]
        if allowed is not None:
            # Some nodes closed (reservations): per node, as FGD selects.
            of = sigs.of_nodes()
            return self.select(state, pod, scores.key[of], scores.gpu[of], allowed)
        key = scores.key[live]
        if key.size == 0 or (low := key.min()) == _INFEASIBLE:
            return reject_reason(state, pod)
        tied = np.flatnonzero(key == low)
        n, sig = int(rep[tied[0]]), int(live[tied[0]])
        if tied.size > 1 or sigs.count(sig) > 1:
            # FGD's tie-break (BestFit's score, then the lower node): one score per tied
            # signature, the lowest node of the best ones.
            nodes = rep[tied]
            bf = _bestfit_score(state, nodes, pod, self._gpu_free_total(state, nodes))
            best = np.flatnonzero(bf == bf.min())
            pick = best[np.argmin(nodes[best])]
            n, sig = int(nodes[pick]), int(live[tied[pick]])
        if pod.is_shared:
            return NodeGpus(n, (int(scores.gpu[sig]),))
        return NodeGpus(n, choose_whole_gpus(state, n, pod))
