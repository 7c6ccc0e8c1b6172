"""Sharing by measured use: the share a pod is granted from its past, which pods fit one GPU
together, and which packed pods must move (and why).

Owns the rule (`SharingConfig`, its stated defaults and their reasons), a pod's measured use as
an incremental summary (`MeasuredUse`: how many samples, a histogram of its duty cycle in 1 %
bins, its peak GPU memory; `UseRecord` is its persisted form), the share granted from it
(`grant_share`), the fit of pods on one GPU (`fits`), the packing of measured pods onto GPUs
(`pack`, first-fit decreasing by memory, best fit) and the move decisions (`plan_moves`: a
packed pod that outgrew its share, lone pods that can now share).

It must not move anything: a move is a preemption with reason `consolidation` plus the pod's
re-placement, which the scheduler makes from the `Move`s returned here. No clock, no I/O: the
samples come in as numbers from whoever read them (the node agent's per-pod shares in the
service, a recorded trace in `make bench-share`).

**The share.** A pod that may share gets, from its own past (at least `min_history` samples):
- compute: the `duty_quantile` (0.95) of its duty cycle, as milli-GPUs (the slicer's unit,
  1000 = the whole GPU; the node agent sets `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` from it). The
  shares of a GPU sum to at most 1000, so the GPU is overloaded only in a minute in which a pod
  is above its own 95th percentile while the other is busy too;
- memory: its peak GPU memory plus `memory_headroom_frac` of it (the pinned-memory limit). The
  peak, not a quantile: memory past the GPU's is an out-of-memory error, not a slowdown. The
  headroom is what the pod may grow into before it contends: a pod whose peak rises grants
  itself a larger share (`grant_share` again) and, if that no longer fits its GPU, it or its
  partner moves while its use is still inside the share it held (`plan_moves`).
A GPU holds at most `max_pods_per_gpu` pods, each with `context_reserve_mib` of the GPU's
memory set aside for the CUDA context a co-located pod brings. A pod with a shorter past gets no
share (`grant_share` is None): it runs alone, or at the share it asked for, until it has one.
The defaults and the evidence for each are `SharingConfig`'s.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from seedance.slicer.core.model import GPU_MILLI

__all__ = [
    "DUTY_BINS",
    "MeasuredUse",
    "Move",
    "MoveReason",
    "ShareGrant",
    "SharingConfig",
    "UseRecord",
    "fits",
    "grant_share",
    "pack",
    "plan_moves",
]

#: Duty-cycle histogram bins: 0, 1, ..., 100 %. A sample is counted in the bin of its value
#: rounded *up*, so a quantile read from the histogram is never below the exact one.
DUTY_BINS = 101

P = TypeVar("P", bound=Hashable)
G = TypeVar("G", bound=Hashable)


@dataclass(frozen=True, slots=True, kw_only=True)
class SharingConfig:
    """The sharing rule. Defaults and why (figures in docs/slicer.md, "Sharing by measured
    use", with the commands that measure them; none was chosen on the kept-back hours):

    * `duty_quantile` 0.95: the compute share covers all but the busiest 5 % of a pod's minutes.
      Overload needs both pods of a GPU busy at once, which the recorded fleet rarely is: on
      18 cuts of the GenAI trace's first half (`make bench-share-splits`) p95 shares overloaded
      at most 0.31 % of the GPU-minutes against a 1 % budget; p99 shares (at most 0.05 %) kept
      the busiest pods (p99 near a whole GPU) from sharing at all and split pairs for
      compute that never contended (GPUs 0.598 of one pod per GPU at the median cut, 0.620 at
      the worst, against p95's 0.592 and 0.601); p90 went past the budget (1.72 %).
    * `memory_headroom_frac` 0.05 of the peak (~1.9 GiB at the median pod's 37 GiB; a new
      peak a pod sets after 4 hours of samples is a median 2.35 GiB above its last, as
      `make bench-share-splits` prints for the folder it reads): room to grow into
      while a move is decided and made (one sample's decision plus a base-model load, p95
      45 s), so that half of the new peaks never reach contention. It is a buffer for reacting,
      not a forecast: a quarter of the pods' peaks still rise by 15 % or more when their
      history doubles, so the peak a pod later reaches is learned as it happens (its grant
      rises) and a pod that outgrows its GPU, or its partner, moves (`plan_moves`). With
      injected growth (`make bench-share-splits SHARE_ARGS="--grow-gib 3,6"`, 64 runs) it left
      4 out-of-memory minutes where no headroom left 7 (first-fit decreasing: 336), for about
      0.01 more of the baseline's GPUs (median 0.600 against 0.589).
    * `context_reserve_mib` 528: GPU memory set aside per pod on a shared GPU for the CUDA
      context a co-located process holds besides the others' (a bare driver context measured
      on an H200, driver 580: 528 MiB each, additive over 1-3 processes; torch with cuBLAS
      718 MiB).
    * `max_pods_per_gpu` 2: serving pods on 80 GB GPUs peak at 30-47 GiB, so a third fits only
      beside two small ones; the bound also keeps a GPU's failure and overload to two pods.
    * `min_history` 60 samples (an hour at one a minute): a shorter past says too little about
      a peak (it grows by 30 % or more for a tenth of the pods on doubling an hour's history).
    * `settle_samples` 30: a pod whose memory peak rose in the last 30 samples may still be
      loading a model; it is not moved in beside another pod until it has settled.
    """

    duty_quantile: float = 0.95
    memory_headroom_frac: float = 0.05
    context_reserve_mib: int = 528
    max_pods_per_gpu: int = 2
    min_history: int = 60
    settle_samples: int = 30

    def __post_init__(self) -> None:
        if not 0.5 <= self.duty_quantile <= 1.0:
            raise ValueError(f"duty_quantile={self.duty_quantile} not in [0.5, 1]")
        if not 0.0 <= self.memory_headroom_frac <= 1.0:
            raise ValueError(f"memory_headroom_frac={self.memory_headroom_frac} not in [0, 1]")
        if self.context_reserve_mib < 0:
            raise ValueError(f"context_reserve_mib={self.context_reserve_mib} is negative")
        if self.max_pods_per_gpu < 1:
            raise ValueError(f"max_pods_per_gpu={self.max_pods_per_gpu} is below 1")
        if self.min_history < 1:
            raise ValueError(f"min_history={self.min_history} is below 1")


class UseRecord(msgspec.Struct, frozen=True, kw_only=True):
    """`MeasuredUse` as plain data (a service's persisted state)."""

    samples: int = 0
    duty_counts: tuple[int, ...] = ()
    peak_mem_mib: float = 0.0
    since_peak: int = 0


class MeasuredUse:
    """A pod's measured use so far: sample count, duty-cycle histogram, peak memory.

    Incremental (a sample costs O(1)) and small (101 counters and a peak) whatever the history's
    length, so the slicer can keep one per shared pod in its state."""

    __slots__ = ("_counts", "peak_mem_mib", "samples", "since_peak")

    def __init__(self) -> None:
        self._counts: npt.NDArray[np.int64] = np.zeros(DUTY_BINS, dtype=np.int64)
        self.samples = 0
        self.peak_mem_mib = 0.0
        #: Samples since the memory peak last rose (0: the latest sample set it).
        self.since_peak = 0

    def add(self, duty_pct: float, mem_mib: float) -> None:
        """One sample: the duty cycle in % (0..100) and the memory in use in MiB."""
        if not (0.0 <= duty_pct <= 100.0) or math.isnan(duty_pct):
            raise ValueError(f"duty_pct={duty_pct} not in [0, 100]")
        if not mem_mib >= 0.0:
            raise ValueError(f"mem_mib={mem_mib} is negative or not a number")
        self._counts[min(DUTY_BINS - 1, math.ceil(duty_pct))] += 1
        self.samples += 1
        if mem_mib > self.peak_mem_mib:
            self.peak_mem_mib = float(mem_mib)
            self.since_peak = 0
        else:
            self.since_peak += 1

    def add_many(self, duty_pct: npt.ArrayLike, mem_mib: npt.ArrayLike) -> None:
        """Samples in bulk (equal lengths): as `add` for each, in one numpy pass."""
        duty = np.asarray(duty_pct, dtype=np.float64)
        mem = np.asarray(mem_mib, dtype=np.float64)
        if duty.shape != mem.shape or duty.ndim != 1:
            raise ValueError(f"duty_pct {duty.shape} and mem_mib {mem.shape} differ in shape")
        if duty.size == 0:
            return
        if np.isnan(duty).any() or duty.min() < 0.0 or duty.max() > 100.0:
            raise ValueError(f"duty_pct holds values outside [0, 100]: {duty.min()}..{duty.max()}")
        if np.isnan(mem).any() or mem.min() < 0.0:
            raise ValueError(f"mem_mib holds negative or missing values: min {mem.min()}")
        bins = np.minimum(DUTY_BINS - 1, np.ceil(duty).astype(np.int64))
        self._counts += np.bincount(bins, minlength=DUTY_BINS)
        self.samples += int(duty.size)
        top = int(np.argmax(mem))  # the first of the batch's highest
        if mem[top] > self.peak_mem_mib:
            self.peak_mem_mib = float(mem[top])
            self.since_peak = int(duty.size) - 1 - top
        else:
            self.since_peak += int(duty.size)

    def duty_quantile(self, q: float) -> int:
        """The `q`-quantile of the duty cycle in whole % (rounded up); 0 with no samples."""
        if self.samples == 0:
            return 0
        need = q * self.samples
        return int(np.searchsorted(np.cumsum(self._counts), need - 1e-9, side="left"))

    def record(self) -> UseRecord:
        return UseRecord(
            samples=self.samples,
            duty_counts=tuple(int(c) for c in self._counts),
            peak_mem_mib=self.peak_mem_mib,
            since_peak=self.since_peak,
        )

    @classmethod
    def from_record(cls, rec: UseRecord) -> MeasuredUse:
        use = cls()
        if rec.duty_counts:
            if len(rec.duty_counts) != DUTY_BINS or sum(rec.duty_counts) != rec.samples:
                raise ValueError(
                    f"use record: {len(rec.duty_counts)} duty bins summing to "
                    f"{sum(rec.duty_counts)} for samples={rec.samples}"
                )
            use._counts = np.asarray(rec.duty_counts, dtype=np.int64)
        use.samples = rec.samples
        use.peak_mem_mib = rec.peak_mem_mib
        use.since_peak = rec.since_peak
        return use


@dataclass(frozen=True, slots=True)
class ShareGrant:
    """A share of one GPU: compute in milli-GPUs, memory in MiB."""

    milli: int
    mem_mib: int

    def covers(self, other: ShareGrant) -> bool:
        return self.milli >= other.milli and self.mem_mib >= other.mem_mib

    def union(self, other: ShareGrant) -> ShareGrant:
        return ShareGrant(max(self.milli, other.milli), max(self.mem_mib, other.mem_mib))


def grant_share(use: MeasuredUse, config: SharingConfig) -> ShareGrant | None:
    """The share `use` earns (module docstring), or None while it has too short a past."""
    if use.samples < config.min_history:
        return None
    milli = min(GPU_MILLI, max(1, use.duty_quantile(config.duty_quantile) * GPU_MILLI // 100))
    mem = math.ceil(use.peak_mem_mib * (1.0 + config.memory_headroom_frac))
    return ShareGrant(milli=milli, mem_mib=mem)


def fits(grants: Sequence[ShareGrant], gpu_mem_mib: int, config: SharingConfig) -> bool:
    """Whether pods with these shares fit one GPU of `gpu_mem_mib` (NVML's total): at most
    `max_pods_per_gpu`, compute summing to at most one GPU, memory to at most the GPU's less a
    context reserve per pod. One pod always fits (it has the GPU to itself)."""
    n = len(grants)
    if n <= 1:
        return True
    if n > config.max_pods_per_gpu or sum(g.milli for g in grants) > GPU_MILLI:
        return False
    return sum(g.mem_mib for g in grants) + n * config.context_reserve_mib <= gpu_mem_mib


def _mem_slack(grants: Sequence[ShareGrant], gpu_mem_mib: int, config: SharingConfig) -> int:
    return gpu_mem_mib - sum(g.mem_mib for g in grants) - len(grants) * config.context_reserve_mib


def pack(
    items: Sequence[tuple[P, ShareGrant]], gpu_mem_mib: int, config: SharingConfig
) -> list[list[P]]:
    """Pods with shares onto as few GPUs as the rule allows: first-fit decreasing by memory
    (then compute), each pod onto the open GPU it leaves the least memory on (best fit). Memory
    first because it is the hard limit and the scarcer one on the recorded fleet. Deterministic:
    ties keep the input order."""
    order = sorted(range(len(items)), key=lambda i: (-items[i][1].mem_mib, -items[i][1].milli, i))
    bins: list[tuple[list[P], list[ShareGrant]]] = []
    for i in order:
        pod, grant = items[i]
        best: tuple[int, int] | None = None
        for b, (_, grants) in enumerate(bins):
            if fits([*grants, grant], gpu_mem_mib, config):
                slack = _mem_slack([*grants, grant], gpu_mem_mib, config)
                if best is None or slack < best[0]:
                    best = (slack, b)
        if best is None:
            bins.append(([pod], [grant]))
        else:
            bins[best[1]][0].append(pod)
            bins[best[1]][1].append(grant)
    return [pods for pods, _ in bins]


class MoveReason(enum.StrEnum):
    #: The pod's memory need (peak + headroom) no longer fits beside its GPU's other pods.
    OUTGROWN_MEMORY = "outgrown_memory"
    #: Its compute need (duty quantile) no longer fits beside them.
    OUTGROWN_COMPUTE = "outgrown_compute"
    #: A pod alone on its GPU joins another lone pod it fits beside: a GPU is freed.
    CONSOLIDATION = "consolidation"


@dataclass(frozen=True, slots=True)
class Move(Generic[P, G]):
    """Move `pod` from GPU `source` to `target` (None: a GPU of its own), and why."""

    pod: P
    source: G
    target: G | None
    reason: MoveReason
    detail: str


def _target(
    pod: P,
    want: ShareGrant,
    gpus: Mapping[G, Sequence[P]],
    need: Mapping[P, ShareGrant],
    gpu_mem_mib: int,
    config: SharingConfig,
    skip: Collection[G],
) -> G | None:
    """The GPU (not in `skip`) that takes `pod` leaving the least memory, every pod there
    measured; None when none does."""
    best: tuple[int, G] | None = None
    for gpu, pods in gpus.items():
        if gpu in skip or not pods or any(p not in need for p in pods):
            continue
        grants = [need[p] for p in pods] + [want]
        if fits(grants, gpu_mem_mib, config):
            slack = _mem_slack(grants, gpu_mem_mib, config)
            if best is None or slack < best[0]:
                best = (slack, gpu)
    return None if best is None else best[1]


def plan_moves(
    gpus: Mapping[G, Sequence[P]],
    held: Mapping[P, ShareGrant],
    need: Mapping[P, ShareGrant | None],
    gpu_mem_mib: int,
    config: SharingConfig,
    *,
    busy: Collection[G] = (),
    unsettled: Collection[P] = (),
    consolidate: bool = True,
) -> list[Move[P, G]]:
    """Which pods to move now, and why.

    `gpus`: the pods on each GPU; `held`: the share each packed pod holds; `need`: the share
    each pod's use earns now (`grant_share`; None: too short a past); `busy`: GPUs with a move
    in flight (neither a source nor a target until it lands); `unsettled`: pods whose memory
    peak rose lately (`MeasuredUse.since_peak` below `settle_samples`): they may still be
    growing (a base model loading), so they are never moved in beside another pod.

    1. **Outgrown.** On a GPU whose pods' needs (each at least what it holds) no longer fit,
       a pod moves while the one that outgrew its share is still inside the headroom of what it
       held, i.e. before it contends. The partner moves if a GPU takes it (then the grower keeps
       the GPU to grow on, and no GPU is added); else the grower moves, to the GPU that takes it
       leaving the least memory or, when none does or it is unsettled, to one of its own. A need
       that still fits is granted where the pod is (no move).
    2. **Consolidation** (`consolidate`): settled pods alone on their GPU pair up, the largest
       memory first with the partner leaving the *most* memory free (unlike `pack`'s best fit:
       a pair formed late joins pods whose memory has already been seen to rise, so it keeps
       the most room to grow into); the smaller moves.
    3. **Exchange** (`consolidate`): two lone pods X and Y that do not fit together, and a
       pair A + B where X fits beside A and B beside Y: B moves beside Y now, and X beside A
       once B has left A's GPU (consolidation, a later round: until B's replica has loaded
       elsewhere it still holds A's GPU). Two moves free a GPU (an augmenting path of the
       pairing): pairs formed as pods came and went drift from the best pairing, and this
       brings them back to it a GPU at a time. Among exchanges, the one leaving the most memory
       free, as consolidation.

    Deterministic for a given input order.
    """
    want = {p: (n.union(held[p]) if p in held else n) for p, n in need.items() if n is not None}
    plan = _Plan(gpus, want, gpu_mem_mib, config, set(busy), unsettled)
    for gpu, pods in gpus.items():
        if gpu in plan.touched or len(pods) < 2 or any(p not in want for p in pods):
            continue
        if not fits([want[p] for p in pods], gpu_mem_mib, config):
            plan.outgrown(gpu, pods, held)
    if consolidate:
        plan.consolidate()
        plan.exchange()
    return plan.moves


class _Plan(Generic[P, G]):
    """One round of `plan_moves`: the moves so far and the GPUs they touch."""

    def __init__(
        self,
        gpus: Mapping[G, Sequence[P]],
        want: Mapping[P, ShareGrant],
        gpu_mem_mib: int,
        config: SharingConfig,
        touched: set[G],
        unsettled: Collection[P],
    ) -> None:
        self.gpus, self.want, self.mem, self.config = gpus, want, gpu_mem_mib, config
        #: GPUs a move leaves or lands on this round: neither again until it is made.
        self.touched = touched
        self.unsettled = unsettled
        self.moves: list[Move[P, G]] = []

    def _move(self, pod: P, source: G, target: G | None, reason: MoveReason, why: str) -> None:
        self.touched.add(source)
        if target is not None:
            self.touched.add(target)
        self.moves.append(Move(pod, source, target, reason, why))

    def _target(self, pod: P, skip: G) -> G | None:
        if pod in self.unsettled:
            return None
        return _target(
            pod, self.want[pod], self.gpus, self.want, self.mem, self.config, {skip, *self.touched}
        )

    def outgrown(self, gpu: G, pods: Sequence[P], held: Mapping[P, ShareGrant]) -> None:
        want = self.want
        grown = [p for p in pods if p in held and not held[p].covers(want[p])] or list(pods)
        grower = max(grown, key=lambda p: (want[p].mem_mib, want[p].milli))
        was = held.get(grower, ShareGrant(0, 0))
        reason = (
            MoveReason.OUTGROWN_MEMORY
            if want[grower].mem_mib > was.mem_mib
            else MoveReason.OUTGROWN_COMPUTE
        )
        why = (
            f"{grower!s} needs {want[grower].milli} milli / {want[grower].mem_mib} MiB, held "
            f"{was.milli} / {was.mem_mib}: the GPU's pods no longer fit {self.mem} MiB"
        )
        for partner in pods:
            if partner == grower:
                continue
            target = self._target(partner, gpu)
            if target is not None:
                self._move(partner, gpu, target, reason, why)
                return
        self._move(grower, gpu, self._target(grower, gpu), reason, why)

    def consolidate(self) -> None:
        want = self.want
        lone = [
            (gpu, pods[0])
            for gpu, pods in self.gpus.items()
            if len(pods) == 1
            and gpu not in self.touched
            and pods[0] in want
            and pods[0] not in self.unsettled
        ]
        lone.sort(key=lambda gp: (-want[gp[1]].mem_mib, -want[gp[1]].milli))
        paired: set[P] = set()
        for i, (gpu, pod) in enumerate(lone):
            if pod in paired:
                continue
            best: tuple[int, int] | None = None
            for j in range(i + 1, len(lone)):
                other = lone[j][1]
                grants = [want[pod], want[other]]
                if other not in paired and fits(grants, self.mem, self.config):
                    slack = _mem_slack(grants, self.mem, self.config)
                    if best is None or slack > best[0]:
                        best = (slack, j)
            if best is None:
                continue
            src, other = lone[best[1]]
            paired.update((pod, other))
            self._move(
                other,
                src,
                gpu,
                MoveReason.CONSOLIDATION,
                f"alone on its GPU; fits beside {pod!s} ({want[pod].milli} + "
                f"{want[other].milli} milli, {want[pod].mem_mib} + "
                f"{want[other].mem_mib} MiB)",
            )

    def exchange(self) -> None:
        want = self.want
        lone = [
            (gpu, pods[0])
            for gpu, pods in self.gpus.items()
            if len(pods) == 1 and gpu not in self.touched and pods[0] in want
        ]
        lone.sort(key=lambda gp: (-want[gp[1]].mem_mib, -want[gp[1]].milli))
        pairs = [
            (gpu, (pods[0], pods[1]))
            for gpu, pods in self.gpus.items()
            if len(pods) == 2 and all(p in want for p in pods)
        ]
        for x_gpu, x in lone:
            if x_gpu in self.touched or x in self.unsettled:
                continue
            found = self._exchange_for(x, lone, pairs)
            if found is None:
                continue
            gpu, a, b, y_gpu, y = found
            why = (
                f"exchange: {b!s} fits beside {y!s} and, once it has left, {x!s} beside {a!s}; "
                f"frees {x!s}'s GPU"
            )
            self._move(b, gpu, y_gpu, MoveReason.CONSOLIDATION, why)
            self.touched.add(x_gpu)  # X waits for A's GPU: not a target for anyone else now

    def _exchange_for(
        self, x: P, lone: Sequence[tuple[G, P]], pairs: Sequence[tuple[G, tuple[P, P]]]
    ) -> tuple[G, P, P, G, P] | None:
        """The exchange freeing `x`'s GPU that leaves the most memory free: (A's GPU, A, B,
        Y's GPU, Y); None when there is none."""
        best: tuple[int, tuple[G, P, P, G, P]] | None = None
        ys = [(g, y) for g, y in lone if y != x and g not in self.touched]
        ys = [(g, y) for g, y in ys if not self._fit(x, y)]  # else consolidation's
        for gpu, (p0, p1) in pairs:
            if gpu in self.touched:
                continue
            for a, b in ((p0, p1), (p1, p0)):
                if b in self.unsettled or not self._fit(x, a):
                    continue
                for y_gpu, y in ys:
                    if self._fit(b, y):
                        slack = self._slack(x, a) + self._slack(b, y)
                        if best is None or slack > best[0]:
                            best = (slack, (gpu, a, b, y_gpu, y))
        return None if best is None else best[1]

    def _fit(self, p: P, q: P) -> bool:
        return fits([self.want[p], self.want[q]], self.mem, self.config)

    def _slack(self, p: P, q: P) -> int:
        return _mem_slack([self.want[p], self.want[q]], self.mem, self.config)
