"""The FGD paper's fragmentation metric (Weng et al., USENIX ATC'23), kept incrementally.

Owns the target workload (task classes and their popularity) and, per node, the numbers the
metric needs for every class: how many GPUs could host the class's per-GPU share, and the
free share stranded on GPUs that could not. From those it gives each node's fragmentation
F_n(M) and the fragmentation a candidate placement would leave, for all candidates at once.

Definitions (research/slicer.md §2.1, from the paper and its simulator's `frag.go`):
  * task class m = (CPU request, per-GPU share, GPU count, allowed GPU models);
  * F_n(m) = all free GPU share on n if m asks no GPU or n cannot host m (model not allowed,
    CPU left < m's CPU, or fewer than #GPU(m) GPUs with free share >= m's share); otherwise
    the free share of the GPUs whose free share < m's share;
  * F_n(M) = sum_m p_m F_n(m); cluster F = sum_n F_n(M); memory does not enter.

It must not place anything or mutate the cluster state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from seedance.slicer.core.model import GPU_MILLI, ClusterState, PodRequest
from seedance.slicer.core.signatures import NodeSignatures

__all__ = ["FragmentationIndex", "TargetWorkload", "TaskClass", "cluster_fragmentation"]

# Above this many rows to compute, they are computed once per node signature (when the index
# has the nodes' signatures): grouping costs a few vector operations.
_BY_SIGNATURE_FROM = 32


@dataclass(frozen=True, slots=True)
class TaskClass:
    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_models: frozenset[str]

    @classmethod
    def of(cls, pod: PodRequest) -> TaskClass:
        return cls(pod.cpu_milli, pod.gpu_milli, pod.num_gpu, pod.gpu_models)


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """Task classes with popularities that sum to 1."""

    classes: tuple[TaskClass, ...]
    weights: tuple[float, ...]

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], coverage: float = 0.95) -> TargetWorkload:
        """The paper's rule: most popular classes until they cover `coverage` of the pods,
        then renormalised (`podPopularityThreshold = 95`). Ties keep first-seen order."""
        return cls.from_counts(((p, 1) for p in pods), coverage)

    @classmethod
    def from_counts(
        cls, pods: Iterable[tuple[PodRequest, int]], coverage: float = 0.95
    ) -> TargetWorkload:
        """`from_pods` of pods given as (pod, how many such pods), in first-seen order."""
        counts: Counter[TaskClass] = Counter()
        for p, c in pods:
            counts[TaskClass.of(p)] += c
        total = sum(counts.values())
        if total == 0:
            raise ValueError("target workload needs at least one pod")
        kept: list[tuple[TaskClass, int]] = []
        covered = 0
        for tc, c in sorted(counts.items(), key=lambda kv: -kv[1]):
            kept.append((tc, c))
            covered += c
            if covered >= coverage * total:
                break
        norm = sum(c for _, c in kept)
        return cls(tuple(tc for tc, _ in kept), tuple(c / norm for _, c in kept))


class FragmentationIndex:
    """Per-node, per-shape counts behind F_n(M), refreshed only for nodes that changed.

    Classes that differ only in their CPU request share a GPU *shape* (per-GPU share, GPU
    count, allowed models), so the index keeps counts per shape (G of them, a third to a
    quarter of the classes) and folds the CPU condition into a weight looked up by the node's
    free CPU:  F_n(M) = tot_n − Σ_g W_g(cpu_n) · ok_g(n) · (tot_n − part_g(n)),
    where W_g(cpu) is the popularity of the shape's classes whose CPU request is <= cpu
    (CPU-only classes never host, so they only contribute tot_n), ok_g says the node can host
    the shape (model allowed, enough GPUs with free share >= the shape's share), and part_g is
    the free share on GPUs below that share. This equals Σ_m p_m F_n(m) exactly.

    Arrays: `cnt`/`part` (N × G), `tot` and `frag` (N), N the state's row capacity (rows of
    nodes not there yet are unused); nodes added or re-described are followed at `sync`.
    `desc` (N × GPU slots) holds each node's free GPU shares largest first, so whether a node
    has k GPUs with at least s free is one lookup (``desc[n, k - 1] >= s``) for any request,
    not a count over every GPU of every node per scoring.
    """

    def __init__(
        self,
        state: ClusterState,
        workload: TargetWorkload,
        previous: FragmentationIndex | None = None,
        signatures: NodeSignatures | None = None,
    ) -> None:
        """`previous`, an index of another workload on the same state, lends the columns of
        the GPU shapes both have (they depend on the shape, not on its weight): a refreshed
        policy computes only its new shapes' columns and the weighted sum, not the fleet's.
        `signatures` (of the same state) let many rows be computed once per signature: a row
        depends only on its node's signature."""
        self.state = state
        self.workload = workload
        self._signatures = signatures
        shapes: dict[tuple[int, int, frozenset[str]], int] = {}
        for c in workload.classes:
            if c.num_gpu:
                shapes.setdefault((c.gpu_milli, c.num_gpu, c.gpu_models), len(shapes))
        keys = list(shapes)
        self._models = [k[2] for k in keys]
        self.share = np.array([k[0] for k in keys], dtype=np.int64)
        self.need = np.array([k[1] for k in keys], dtype=np.int64)
        pairs = zip(workload.classes, workload.weights, strict=True)
        gpu_classes = [(c, w) for c, w in pairs if c.num_gpu]
        self.cpu_steps = np.array(sorted({c.cpu_milli for c, _ in gpu_classes}), dtype=np.int64)
        # weight_at[b, g]: popularity of shape g's classes with CPU <= cpu_steps[b - 1].
        w = np.zeros((len(self.cpu_steps) + 1, len(keys)), dtype=np.float64)
        for c, p in gpu_classes:
            b = int(np.searchsorted(self.cpu_steps, c.cpu_milli)) + 1
            w[b, shapes[(c.gpu_milli, c.num_gpu, c.gpu_models)]] += p
        self.weight_at = np.cumsum(w, axis=0)
        # Rows are allocated to the state's capacity, so nodes added later only fill rows.
        rows, g = state.capacity, len(keys)
        self.host_ok = np.ones((rows, g), dtype=bool)
        self.cnt = np.zeros((rows, g), dtype=np.int64)
        self.part = np.zeros((rows, g), dtype=np.int64)
        self.tot = np.zeros(rows, dtype=np.int64)
        self.frag = np.zeros(rows, dtype=np.float64)
        self.desc = np.zeros((rows, state.gpu_free.shape[1]), dtype=np.int64)
        self._seen = np.full(rows, -1, dtype=np.int64)
        self._hw_seen = np.full(rows, -1, dtype=np.int64)
        self._hw_epoch = -1  # the state's `hw_epoch` at the last `_fit_nodes`
        self._tick = -1  # the state's `tick` at the last sync (`ClusterState.stale_rows`)
        # Change tables for a shared placement: indexed by the GPU's free share f before,
        # they give the change of cnt and part per shape when s is taken from that GPU.
        self._share_tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._keys = keys
        if previous is not None and previous.state is state and len(previous._seen) == rows:
            self._borrow(previous)
        self.sync()

    def _borrow(self, previous: FragmentationIndex) -> None:
        """Take `previous`'s rows as they were synced, its columns for the shapes it has, and
        compute the other columns and every node's F_n(M) under this workload."""
        st, n = self.state, len(self.state)
        self._seen[:] = previous._seen
        self._hw_seen[:] = previous._hw_seen
        self._hw_epoch, self._tick = previous._hw_epoch, previous._tick
        self.tot[:] = previous.tot
        self.desc[:] = previous.desc
        old = {k: j for j, k in enumerate(previous._keys)}
        new = [j for j, k in enumerate(self._keys) if k not in old]
        kept = [(j, old[k]) for j, k in enumerate(self._keys) if k in old]
        if kept:
            # One gather per array (not one strided copy per column), of the nodes' rows only
            # (the rows above are unused, as initialised: ~5x faster on the x4 fleet).
            to, fro = (np.array(c, dtype=np.intp) for c in zip(*kept, strict=True))
            self.host_ok[:n, to] = previous.host_ok[:n, fro]
            self.cnt[:n, to] = previous.cnt[:n, fro]
            self.part[:n, to] = previous.part[:n, fro]
        if new:
            # From the nodes as they are (a row changed since `previous` saw it is recomputed
            # whole by the sync below), once per signature.
            some, at = self._groups(np.arange(n))
            free = st.gpu_free[some]
            share = self.share[new]
            ge = free[:, :, None] >= share[None, None, :]
            self.cnt[:n, new] = ge.sum(axis=1)[at]
            self.part[:n, new] = np.where(ge, 0, free[:, :, None]).sum(axis=1)[at]
            for j in new:
                if self._models[j]:
                    self.host_ok[:n, j] = st.model_mask(self._models[j])
        self.sync()  # every row as the nodes are now, so the signatures below stand for them
        some, at = self._groups(np.arange(n))
        self.frag[:n] = self._frag(
            self.tot[some], st.cpu_free[some], self.cnt[some], self.part[some], self.host_ok[some]
        )[at]

    def _groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the rows to compute, where each of `rows` takes its values from): one row per
        signature when there are many rows and signatures; otherwise every row itself."""
        if self._signatures is None or rows.size <= _BY_SIGNATURE_FROM:
            return rows, np.arange(rows.size)
        return self._signatures.groups(rows)

    def _frag(
        self, tot: np.ndarray, cpu: np.ndarray, cnt: np.ndarray, part: np.ndarray, ok: np.ndarray
    ) -> np.ndarray:
        w = self.weight_at[np.searchsorted(self.cpu_steps, cpu, side="right")]
        usable = np.where(ok & (cnt >= self.need), tot[:, None] - part, 0)
        left: np.ndarray = tot - np.einsum("ij,ij->i", w, usable)
        return left

    def _fit_nodes(self) -> None:
        """Follow nodes added or re-described since the last sync: grow the rows to the state's
        capacity, and recompute which shapes each new or changed node's model can host."""
        st = self.state
        if st.hw_epoch == self._hw_epoch:
            return  # no node added or re-described since: no row to compare
        self._hw_epoch = st.hw_epoch
        n = len(st)
        if len(self._seen) < n:
            rows = st.capacity
            for name, fill in (("host_ok", True), ("cnt", 0), ("part", 0), ("tot", 0),
                               ("frag", 0.0), ("desc", 0), ("_seen", -1),
                               ("_hw_seen", -1)):  # fmt: skip
                old = getattr(self, name)
                grown = np.full((rows, *old.shape[1:]), fill, dtype=old.dtype)
                grown[: len(old)] = old
                setattr(self, name, grown)
        changed = np.flatnonzero(self._hw_seen[:n] != st.hw_version)
        if changed.size == 0:
            return
        for j, models in enumerate(self._models):
            if models:
                self.host_ok[changed, j] = st.model_mask(models, changed)
        self._hw_seen[changed] = st.hw_version[changed]
        self._seen[changed] = -1

    def sync(self) -> None:
        """Recompute the rows of nodes whose state changed since the last sync."""
        st = self.state
        self._fit_nodes()
        rows = st.stale_rows(self._seen, self._tick)
        self._tick = st.tick
        if rows.size == 0:
            return
        # host_ok is per row already (`_fit_nodes`); the rest once per signature.
        some, at = self._groups(rows)
        free = st.gpu_free[some]
        ge = free[:, :, None] >= self.share[None, None, :]
        cnt = ge.sum(axis=1)
        part = np.where(ge, 0, free[:, :, None]).sum(axis=1)
        tot = free.sum(axis=1)
        self.cnt[rows] = cnt[at]
        self.part[rows] = part[at]
        self.tot[rows] = tot[at]
        self.desc[rows] = (-np.sort(-free, axis=1))[at]
        self.frag[rows] = self._frag(tot, st.cpu_free[some], cnt, part, self.host_ok[some])[at]
        self._seen[rows] = st.version[rows]

    def share_tables(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        tab = self._share_tables.get(s)
        if tab is None:
            f = np.arange(GPU_MILLI + 1, dtype=np.int64)[:, None]
            after = np.maximum(f - s, 0)
            sh = self.share[None, :]
            dcnt = (after >= sh).astype(np.int64) - (f >= sh)
            dpart = np.where(after < sh, after, 0) - np.where(f < sh, f, 0)
            tab = (dcnt, dpart)
            self._share_tables[s] = tab
        return tab

    def frag_after(
        self,
        nodes: np.ndarray,
        pod: PodRequest,
        gpu_free_before: np.ndarray | None,
    ) -> np.ndarray:
        """F_n(M) after placing `pod` on each candidate.

        For a shared request each candidate is (node, GPU with free share `gpu_free_before`);
        for whole-GPU and CPU-only requests each candidate is a node (whole GPUs are taken
        from fully free ones, so which ones does not change the metric).
        """
        cpu_after = self.state.cpu_free[nodes] - pod.cpu_milli
        tot_after = self.tot[nodes] - pod.gpu_milli_total
        cnt = self.cnt[nodes]
        part = self.part[nodes]
        if pod.num_gpu and gpu_free_before is not None and pod.gpu_milli < GPU_MILLI:
            dcnt, dpart = self.share_tables(pod.gpu_milli)
            cnt = cnt + dcnt[gpu_free_before]
            part = part + dpart[gpu_free_before]
        elif pod.num_gpu:
            cnt = cnt - pod.num_gpu
        return self._frag(tot_after, cpu_after, cnt, part, self.host_ok[nodes])

    def hosts(self, nodes: np.ndarray, num_gpu: int, gpu_milli: int) -> np.ndarray:
        """Per node of `nodes` (synced): whether `num_gpu` of its GPUs have `gpu_milli` free
        each (the same as counting them, read off the sorted shares)."""
        if num_gpu > self.desc.shape[1]:
            return np.zeros(nodes.size, dtype=bool)
        ok: np.ndarray = self.desc[nodes, num_gpu - 1] >= gpu_milli
        return ok


def cluster_fragmentation(state: ClusterState, workload: TargetWorkload) -> tuple[float, float]:
    """(fragmentation in milli-GPUs, unallocated GPU in milli-GPUs) for the whole cluster."""
    idx = FragmentationIndex(state, workload)
    return float(idx.frag.sum()), float(state.gpu_free.sum())
