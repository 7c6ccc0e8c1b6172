"""`make bench-share-splits`: `make bench-share` on many cuts of one folder, so the sharing rule
is judged on data it was not shaped on (the kept-back later hours of the GenAI trace are not
here; these cuts of its first half stand in for them).

**Cuts** (T = the folder's periods; a cut is history [start, split), replayed [split, end)):
- from the start, the first 1/4, 1/3, 1/2 and 2/3 as history, the rest replayed (the future
  up to three times the history, harsher than the kept-back run's equal halves);
- sliding equal halves, as the kept-back run is: history and future of L periods each, for L
  of 120, 180, 240, 300 and 360 (2 to 6 hours), starting every 120 periods.

**Injected growth** (`--grow-gib 3,6 --grow-seeds 8`): "memory that grows later", which a
first half cannot show by itself: each pod, with probability 1/3 (seeded), steps up by that
many GiB at a uniformly drawn replayed minute and stays there (a larger model loaded), on the
first four cuts above. Every (size, seed, cut) is one run.

**Memory growth on the folder itself** (printed first; what the headroom is set against): for a
pod with n samples, its peak over its first 2n samples over its peak over the first n
(`peak x2 after n`, quantiles over the pods with 2n samples), and the size of each new peak a
pod sets once it has 240 samples (`new peaks after 240`: by how much it passed the previous).

`--set field=value` changes a `SharingConfig` field (e.g. `memory_headroom_frac=0`), so two
rules are compared on the same cuts. Each run prints Seedance's and the FFD anchor's figures;
the last line is `share_splits: runs=<n> ratio_median=<r> ratio_max=<r>
overload_max_pct=<p> oom_minutes=<n> runs_with_oom=<n> ffd_ratio_median=<r>
ffd_oom_minutes=<n> ffd_runs_with_oom=<n>`.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seedance.bench.share import FfdAnchor, MeasuredSharing, Trace, load_trace, replay
from seedance.slicer.core.sharing import SharingConfig

__all__ = ["cuts", "grown", "main", "peak_growth"]

_MIB_PER_GIB = 1024


def cuts(minutes: int) -> list[tuple[int, int, int]]:
    """(start, split, end) of every cut of a folder of `minutes` periods (module docstring)."""
    out = [(0, minutes * k // d, minutes) for k, d in ((1, 4), (1, 3), (1, 2), (2, 3))]
    for length in (120, 180, 240, 300, 360):
        out.extend(
            (start, start + length, start + 2 * length)
            for start in range(0, minutes - 2 * length + 1, 120)
        )
    return list(dict.fromkeys(out))  # the first half as history is also an equal-halves cut


def grown(trace: Trace, gib: float, seed: int) -> Trace:
    """`trace` with a third of its pods stepping up by `gib` at a random replayed minute."""
    rng = np.random.default_rng(seed)
    mem = trace.mem.copy()
    for p in range(mem.shape[0]):
        at = int(rng.integers(trace.split, trace.minutes))
        if rng.random() < 1 / 3:
            mem[p, at:] += gib * _MIB_PER_GIB
    return dataclasses.replace(trace, mem=mem)


def peak_growth(trace: Trace) -> list[str]:
    """The lines describing how pods' memory peaks grow in `trace` (module docstring)."""
    lives = [trace.mem[p, np.flatnonzero(trace.alive[p])] for p in range(len(trace.pods))]
    out = []
    for n in (60, 120, 240):
        ratios = [m[: 2 * n].max() / m[:n].max() for m in lives if m.size >= 2 * n]
        if not ratios:
            out.append(f"peak x2 after {n} samples: no pod has {2 * n}")
            continue
        q = np.percentile(ratios, [50, 75, 90, 100])
        out.append(
            f"peak x2 after {n} samples ({len(ratios)} pods): median {q[0]:.3f}, "
            f"p75 {q[1]:.3f}, p90 {q[2]:.3f}, max {q[3]:.3f}"
        )
    jumps = []
    for m in lives:
        if m.size > 240:
            running = np.maximum.accumulate(m)
            later = np.arange(240, m.size)
            rise = m[later] - running[later - 1]
            jumps.extend((rise[rise > 0] / _MIB_PER_GIB).tolist())
    q = np.percentile(jumps, [50, 90, 100]) if jumps else [np.nan] * 3
    out.append(
        f"new peaks after 240 samples: {len(jumps)}, above the previous by median "
        f"{q[0]:.2f} GiB, p90 {q[1]:.2f}, max {q[2]:.2f}"
    )
    return out


def _config(pairs: Sequence[str]) -> SharingConfig:
    fields = {f.name: f.type for f in dataclasses.fields(SharingConfig)}
    values: dict[str, float | int] = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in fields:
            raise SystemExit(
                f"--set {pair}: no SharingConfig field {name!r} (one of {sorted(fields)})"
            )
        values[name] = int(text) if fields[name] in (int, "int") else float(text)
    return SharingConfig(**values)  # type: ignore[arg-type]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench-share-splits", description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--grow-gib", type=_floats, default=[])
    ap.add_argument("--grow-seeds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    config = _config(args.set)
    whole = load_trace(args.history)
    runs: list[tuple[str, Trace]] = [
        (f"{c} +{gib:g} GiB seed {seed}", grown(whole.cut(*c), gib, seed))
        for gib in args.grow_gib
        for seed in range(args.grow_seeds)
        for c in cuts(whole.minutes)[:4]
    ] or [(str(c), whole.cut(*c)) for c in cuts(whole.minutes)]
    for line in peak_growth(whole):
        print(line)
    print(f"{config}; {len(runs)} runs")
    ours, ffd = [], []
    for label, trace in runs:
        o = replay(
            trace, MeasuredSharing(config), reserve_mib=config.context_reserve_mib, seed=args.seed
        )
        a = replay(
            trace,
            FfdAnchor(config.context_reserve_mib),
            reserve_mib=config.context_reserve_mib,
            seed=args.seed,
        )
        ours.append(o)
        ffd.append(a)
        print(
            f"{label}: ratio {o.ratio:.3f} overload {o.overload_minute_pct:.3f} % oom "
            f"{o.oom_minutes} moves {o.moves} | ffd ratio {a.ratio:.3f} oom {a.oom_minutes}",
            flush=True,
        )
    print(
        f"share_splits: runs={len(runs)} "
        f"ratio_median={statistics.median(o.ratio for o in ours):.3f} "
        f"ratio_max={max(o.ratio for o in ours):.3f} "
        f"overload_max_pct={max(o.overload_minute_pct for o in ours):.3f} "
        f"oom_minutes={sum(o.oom_minutes for o in ours)} "
        f"runs_with_oom={sum(o.oom_minutes > 0 for o in ours)} "
        f"ffd_ratio_median={statistics.median(a.ratio for a in ffd):.3f} "
        f"ffd_oom_minutes={sum(a.oom_minutes for a in ffd)} "
        f"ffd_runs_with_oom={sum(a.oom_minutes > 0 for a in ffd)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
