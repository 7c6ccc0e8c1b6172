"""`make bench-share`: GPUs saved by sharing by measured use, replayed minute by minute on
Alibaba's GenAI serving trace (`alibaba-genai-2026/`: per-pod duty cycle and GPU memory).

**What is replayed.** HISTORY is a folder shaped as the trace; FUTURE (optional) one holding the
same pods' later samples. Without FUTURE, HISTORY's last third (by time) is held out and
replayed. `--split` replays HISTORY cut elsewhere (the validation in docs/slicer.md).

* Minutes: the trace samples once a period (57 s of its anonymised clock: the median spacing of
  its timestamps); a sample's minute is its offset from the first, in periods, rounded. A pod
  lives from its first to its last sample; a minute it has no sample of a kind repeats its
  previous one (1,355 of 79,191 duty and memory readings lack their twin).
* GPUs: 80 GB-class at the memory NVML reports as total for an NVIDIA A100-SXM4-80GB, 81,920
  MiB, less a per-pod reserve on each GPU (`SharingConfig.context_reserve_mib`, 528 MiB: the
  CUDA context a co-located process holds).
* Decisions: at the end of minute t, from the samples up to t only. A pod that appears without
  history starts alone (and is packed once it has one: `SharingConfig.min_history`).
* A move costs the pod a base-model load drawn from `basemodel_update_latency_anon.csv`
  (seeded): the pod holds its old GPU and the new one for that many periods, rounded up (the
  new replica loads while the old one serves), both counted below.

**Policies, on the same minutes.** `measured` (Seedance): `seedance.slicer.core.sharing`: each
pod's share from its past (p95 duty cycle, peak memory + 5 %), packed first-fit decreasing by
memory with best fit, then every minute the moves `plan_moves` decides (a pod that outgrew its
GPU moves; lone pods pair up). `ffd` (the issue's anchor): first-fit decreasing by the
history's peak memory and p99 duty cycle, no headroom, placed once (new pods alone, no moves).
`baseline`: one pod per GPU, as the fleet ran.

**Figures.** gpus: mean over the replayed minutes of the GPUs holding at least one pod;
baseline_gpus: the same one pod per GPU (pods alive); ratio = gpus / baseline_gpus. An overload
minute: a GPU-minute whose pods' duty cycles sum past 100 % (`overload_minute_pct`: of the
GPU-minutes); an OOM minute: one whose pods' memory sums past the GPU's (81,920 MiB less the
reserve per pod). mean_util_pct: mean over GPU-minutes of the pods' summed duty cycle (at most
100); baseline: of the pods' own. Last line (the issue's):
`share: pods= gpus= baseline_gpus= ratio= overload_minute_pct= oom_minutes= mean_util_pct=
baseline_mean_util_pct= moves=`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from seedance.slicer.core.sharing import (
    MeasuredUse,
    Move,
    ShareGrant,
    SharingConfig,
    grant_share,
    pack,
    plan_moves,
)
from seedance.traces.genai import BASEMODEL_FILE, read_load_latencies, read_pod_samples

__all__ = [
    "A100_80GB_TOTAL_MIB",
    "FfdAnchor",
    "Figures",
    "MeasuredSharing",
    "Trace",
    "load_trace",
    "main",
    "replay",
]

#: nvidia-smi's / NVML's memory.total of an NVIDIA A100-SXM4-80GB (and its A800 sibling, whose
#: reading is in tests/fixtures/gpu_names/corpus.toml): 81920 MiB.
A100_80GB_TOTAL_MIB = 81_920

Arr = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Trace:
    """Pods' samples on a grid of periods; minutes before `split` are the history."""

    pods: tuple[str, ...]
    duty: Arr  # [pod, minute], %, gaps filled
    mem: Arr  # [pod, minute], MiB, gaps filled
    alive: npt.NDArray[np.bool_]  # [pod, minute]
    split: int
    period_s: float
    loads_s: tuple[float, ...]

    @property
    def minutes(self) -> int:
        return int(self.duty.shape[1])

    def cut(self, start: int, split: int, end: int) -> Trace:
        """Minutes [start, end), replayed from `split` (validation splits of one folder)."""
        if not start < split < end <= self.minutes:
            raise ValueError(f"cut [{start}, {split}, {end}) outside 0..{self.minutes}")
        alive = self.alive[:, start:end]
        keep = alive.any(axis=1)
        return Trace(
            pods=tuple(self.pods[i] for i in np.flatnonzero(keep).tolist()),
            duty=self.duty[keep, start:end],
            mem=self.mem[keep, start:end],
            alive=alive[keep],
            split=split - start,
            period_s=self.period_s,
            loads_s=self.loads_s,
        )


def _fill(values: Arr, alive: npt.NDArray[np.bool_]) -> Arr:
    """Each pod's missing minutes inside its life take its previous value (0 before any)."""
    out = values.copy()
    for i in range(out.shape[0]):
        row = out[i]
        have = ~np.isnan(row)
        idx = np.where(have, np.arange(row.size), -1)
        np.maximum.accumulate(idx, out=idx)
        row[:] = np.where(idx >= 0, row[np.maximum(idx, 0)], 0.0)
        row[~alive[i]] = np.nan
    return out


def load_trace(history: Path, future: Path | None = None) -> Trace:
    """HISTORY (and FUTURE) on one grid; without FUTURE the last third of HISTORY is held out."""
    past = read_pod_samples(history)
    if not past:
        raise ValueError(f"{history} holds no samples")
    later = read_pod_samples(future) if future is not None else []
    times = np.unique([s.at_s for s in past])
    period = float(np.median(np.diff(times))) if times.size > 1 else 60.0
    t0 = float(times[0])
    if later and min(s.at_s for s in later) <= float(times[-1]):
        raise ValueError(f"{future}'s samples do not all follow {history}'s (last {times[-1]})")
    pods = tuple(sorted({s.pod for s in past} | {s.pod for s in later}))
    row = {p: i for i, p in enumerate(pods)}
    minutes = 1 + max(round((s.at_s - t0) / period) for s in (*past, *later))
    duty = np.full((len(pods), minutes), np.nan)
    mem = np.full((len(pods), minutes), np.nan)
    for s in (*past, *later):
        m = round((s.at_s - t0) / period)
        if s.duty_pct is not None:
            duty[row[s.pod], m] = min(100.0, max(0.0, s.duty_pct))
        if s.mem_mib is not None:
            mem[row[s.pod], m] = s.mem_mib
    seen = ~np.isnan(duty) | ~np.isnan(mem)
    alive = np.zeros_like(seen)
    for i in range(len(pods)):
        w = np.flatnonzero(seen[i])
        alive[i, w[0] : w[-1] + 1] = True
    hist_minutes = 1 + round((float(times[-1]) - t0) / period)
    split = hist_minutes if later else hist_minutes - hist_minutes // 3
    loads = history / BASEMODEL_FILE
    loads_s = (
        tuple(r.latency_ms / 1000 for r in read_load_latencies(loads)) if loads.is_file() else ()
    )
    return Trace(
        pods, _fill(duty, alive), _fill(mem, alive), alive, split, period, loads_s or (0.0,)
    )


class Policy(Protocol):
    name: str

    def start(self, trace: Trace, split: int) -> dict[int, int]:
        """The packing at `split` (pod row -> GPU id) of the pods with a past."""
        ...

    def after_minute(
        self, trace: Trace, m: int, gpus: dict[int, list[int]], busy: set[int]
    ) -> list[Move[int, int]]:
        """Having seen minute `m`, the moves to make (targets None: a new GPU)."""
        ...


@dataclass
class MeasuredSharing:
    """Seedance: `seedance.slicer.core.sharing`, fed minute by minute."""

    config: SharingConfig = field(default_factory=SharingConfig)
    gpu_mem_mib: int = A100_80GB_TOTAL_MIB
    name: str = "measured"
    _uses: dict[int, MeasuredUse] = field(default_factory=dict)
    _held: dict[int, ShareGrant] = field(default_factory=dict)

    def _use(self, p: int) -> MeasuredUse:
        return self._uses.setdefault(p, MeasuredUse())

    def start(self, trace: Trace, split: int) -> dict[int, int]:
        self._uses, self._held = {}, {}
        for p in range(len(trace.pods)):
            past = trace.alive[p, :split]
            if past.any():
                self._use(p).add_many(trace.duty[p, :split][past], trace.mem[p, :split][past])
        items = []
        for p in np.flatnonzero(trace.alive[:, split]).tolist():
            g = grant_share(self._use(p), self.config)
            if g is not None:
                items.append((p, g))
        self._held = dict(items)
        return {p: i for i, b in enumerate(pack(items, self.gpu_mem_mib, self.config)) for p in b}

    def after_minute(
        self, trace: Trace, m: int, gpus: dict[int, list[int]], busy: set[int]
    ) -> list[Move[int, int]]:
        need: dict[int, ShareGrant | None] = {}
        for pods in gpus.values():
            for p in pods:
                self._use(p).add(float(trace.duty[p, m]), float(trace.mem[p, m]))
                need[p] = grant_share(self._uses[p], self.config)
        unsettled = {p for p in need if self._uses[p].since_peak < self.config.settle_samples}
        moves = plan_moves(
            gpus, self._held, need, self.gpu_mem_mib, self.config, busy=busy, unsettled=unsettled
        )
        for p, n in need.items():  # what fits where it is is granted there
            if n is not None:
                self._held[p] = n.union(self._held[p]) if p in self._held else n
        return moves


@dataclass
class FfdAnchor:
    """The issue's anchor: first-fit decreasing by the history's peak memory and p99 duty
    cycle, no headroom, placed once."""

    reserve_mib: int = SharingConfig().context_reserve_mib
    gpu_mem_mib: int = A100_80GB_TOTAL_MIB
    name: str = "ffd"

    def start(self, trace: Trace, split: int) -> dict[int, int]:
        items = []
        for p in np.flatnonzero(trace.alive[:, split]).tolist():
            past = trace.alive[p, :split]
            if past.any():
                duty = float(np.percentile(trace.duty[p, :split][past], 99))
                items.append((float(trace.mem[p, :split][past].max()), duty, p))
        items.sort(key=lambda x: (-x[0], -x[1], x[2]))
        bins: list[list[float]] = []  # [mem, duty, pods]
        place: dict[int, int] = {}
        for mem, duty, p in items:
            for i, b in enumerate(bins):
                n = b[2] + 1
                if b[1] + duty <= 100 and b[0] + mem + n * self.reserve_mib <= self.gpu_mem_mib:
                    b[0], b[1], b[2] = b[0] + mem, b[1] + duty, n
                    place[p] = i
                    break
            else:
                place[p] = len(bins)
                bins.append([mem, duty, 1])
        return place

    def after_minute(
        self, trace: Trace, m: int, gpus: dict[int, list[int]], busy: set[int]
    ) -> list[Move[int, int]]:
        return []


@dataclass(frozen=True, slots=True)
class Figures:
    pods: int
    gpus: float
    baseline_gpus: float
    overload_minute_pct: float
    oom_minutes: int
    mean_util_pct: float
    baseline_mean_util_pct: float
    moves: int
    move_load_s: float
    moves_by_reason: dict[str, int]

    @property
    def ratio(self) -> float:
        return self.gpus / self.baseline_gpus if self.baseline_gpus else math.nan

    def line(self, label: str = "share") -> str:
        return (
            f"{label}: pods={self.pods} gpus={self.gpus:.2f} "
            f"baseline_gpus={self.baseline_gpus:.2f} ratio={self.ratio:.3f} "
            f"overload_minute_pct={self.overload_minute_pct:.3f} oom_minutes={self.oom_minutes} "
            f"mean_util_pct={self.mean_util_pct:.2f} "
            f"baseline_mean_util_pct={self.baseline_mean_util_pct:.2f} moves={self.moves}"
        )


def replay(
    trace: Trace,
    policy: Policy,
    *,
    reserve_mib: int = SharingConfig().context_reserve_mib,
    seed: int = 0,
    gpu_mem_mib: int = A100_80GB_TOTAL_MIB,
) -> Figures:
    """Replay `trace` from its split to its end under `policy` (module docstring)."""
    rng = np.random.default_rng(seed)
    loads = np.asarray(trace.loads_s)
    split, end = trace.split, trace.minutes
    place = policy.start(trace, split)
    next_gpu = max(place.values(), default=-1) + 1
    #: pod -> (the GPU it is leaving, the last minute it still holds it)
    leaving: dict[int, tuple[int, int]] = {}
    gpu_minutes = over = oom = moves = 0
    used: list[int] = []
    util: list[float] = []
    by_reason: dict[str, int] = {}
    load_s = 0.0
    ever = np.flatnonzero(trace.alive[:, split:].any(axis=1))
    for m in range(split, end):
        live = trace.alive[:, m]
        for p in [p for p in place if not live[p]]:  # ended
            del place[p]
            leaving.pop(p, None)
        for p in np.flatnonzero(live).tolist():  # appeared without a past (or not packed): alone
            if p not in place:
                place[p] = next_gpu
                next_gpu += 1
        for p in [p for p, (_, last) in leaving.items() if last < m]:
            del leaving[p]
        holders = [*place.items(), *((p, g) for p, (g, _) in leaving.items())]
        pods = np.fromiter((p for p, _ in holders), dtype=np.int64, count=len(holders))
        gids = np.fromiter((g for _, g in holders), dtype=np.int64, count=len(holders))
        ids, slot = np.unique(gids, return_inverse=True)
        duty = np.bincount(slot, weights=trace.duty[pods, m], minlength=ids.size)
        mem = np.bincount(slot, weights=trace.mem[pods, m], minlength=ids.size)
        count = np.bincount(slot, minlength=ids.size)
        used.append(int(ids.size))
        gpu_minutes += int(ids.size)
        over += int((duty > 100.0 + 1e-9).sum())
        oom += int((mem > gpu_mem_mib - reserve_mib * count).sum())
        util.extend(np.minimum(duty, 100.0).tolist())
        gpus: dict[int, list[int]] = {}
        for p, g in place.items():
            gpus.setdefault(g, []).append(p)
        busy = {g for _, (g, _) in leaving.items()} | {place[p] for p in leaving}
        for mv in policy.after_minute(trace, m, gpus, busy):
            lat_s = float(rng.choice(loads))
            periods = max(1, math.ceil(lat_s / trace.period_s))
            leaving[mv.pod] = (mv.source, m + periods)
            if mv.target is None:
                place[mv.pod] = next_gpu
                next_gpu += 1
            else:
                place[mv.pod] = mv.target
            moves += 1
            by_reason[mv.reason.value] = by_reason.get(mv.reason.value, 0) + 1
            load_s += lat_s
    span = trace.alive[:, split:end]
    return Figures(
        pods=int(ever.size),
        gpus=float(np.mean(used)),
        baseline_gpus=float(span.sum(axis=0).mean()),
        overload_minute_pct=100.0 * over / gpu_minutes if gpu_minutes else 0.0,
        oom_minutes=oom,
        mean_util_pct=float(np.mean(util)) if util else 0.0,
        baseline_mean_util_pct=float(np.nanmean(trace.duty[:, split:end][span])),
        moves=moves,
        move_load_s=load_s,
        moves_by_reason=by_reason,
    )


def _fraction(text: str) -> float:
    return float(Fraction(text))


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench-share", description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=Path, required=True)
    ap.add_argument("--future", type=Path, default=None)
    ap.add_argument(
        "--split",
        type=_fraction,
        default=None,
        help="replay HISTORY from this fraction of it (e.g. 1/2) instead",
    )
    ap.add_argument("--minutes", type=int, default=None, help="replay only this many minutes")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    trace = load_trace(args.history, args.future)
    if args.split is not None:
        if args.future is not None:
            raise SystemExit("--split cuts HISTORY alone: leave out --future")
        trace = trace.cut(0, max(1, round(trace.minutes * args.split)), trace.minutes)
    if args.minutes is not None:
        trace = trace.cut(0, trace.split, min(trace.minutes, trace.split + args.minutes))
    config = SharingConfig()
    print(
        f"trace: {len(trace.pods)} pods, {trace.minutes} periods of {trace.period_s:.0f} s; "
        f"history {trace.split}, replayed {trace.minutes - trace.split}; GPU "
        f"{A100_80GB_TOTAL_MIB} MiB less {config.context_reserve_mib} MiB per pod; "
        f"{len(trace.loads_s)} base-model loads to draw from"
    )
    anchor = replay(
        trace,
        FfdAnchor(config.context_reserve_mib),
        reserve_mib=config.context_reserve_mib,
        seed=args.seed,
    )
    ours = replay(
        trace, MeasuredSharing(config), reserve_mib=config.context_reserve_mib, seed=args.seed
    )
    print(anchor.line("ffd_anchor"))
    print(
        f"measured: moves {ours.moves_by_reason or 'none'}, {ours.move_load_s:.0f} s of "
        f"base-model loads; gpus {ours.gpus:.2f} vs the anchor's {anchor.gpus:.2f} "
        f"({ours.gpus / anchor.gpus:.3f} of it)"
    )
    print(ours.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
