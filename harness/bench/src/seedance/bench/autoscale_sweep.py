"""Sweep of bench-autoscale over many traces: which runs meet every goal of issue 32.

Usage: python -m tools.bench.autoscale_sweep TRACE_OR_DIR... [--jobs 1] [--startup-seeds 0]

Runs `bench_autoscale` (a subprocess each, unchanged) on every trace given (a directory: every
`.csv` and `.jsonl` in it, and in its subdirectories, so one directory per generator seed works),
and for each start-up setting of each run (`autoscale_60s:` and `autoscale:`) says whether it
meets every goal: slo_pct >= 95, GPU-hours <= 1.10 x static, and ratio <= 0.80 where the
oracle's own ratio is <= 0.75. One line per run (`run:`), then the count (`sweep:`, last line).
With several `--startup-seeds`, every trace runs once per seed (its 60 s line once).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SLO_GOAL = 95.0
STATIC_GOAL = 1.10
RATIO_GOAL = 0.80
ORACLE_RATIO_GATE = 0.75
_KV = re.compile(r"(\w+)=([^\s]+)")


@dataclass(frozen=True, slots=True)
class Outcome:
    trace: str
    label: str
    slo_pct: float
    over_static: float
    ratio: float
    oracle_ratio: float
    modes: str

    @property
    def met(self) -> bool:
        ratio_ok = self.oracle_ratio > ORACLE_RATIO_GATE or self.ratio <= RATIO_GOAL
        return self.slo_pct >= SLO_GOAL and self.over_static <= STATIC_GOAL and ratio_ok


def parse(trace: str, stdout: str, startup_seed: int) -> list[Outcome]:
    """The outcomes of one bench run's stdout (both lines; the `oracle ratio:` line before
    each)."""
    out: list[Outcome] = []
    oracle_ratio = float("nan")
    for line in stdout.splitlines():
        if line.startswith("oracle ratio:"):
            oracle_ratio = float(line.split(":")[1])
        key = line.split(":", 1)[0]
        if key not in ("autoscale_60s", "autoscale"):
            continue
        kv = dict(_KV.findall(line))
        label = "60s" if key == "autoscale_60s" else f"measured#{startup_seed}"
        out.append(
            Outcome(
                trace=trace,
                label=label,
                slo_pct=float(kv["slo_pct"]),
                over_static=float(kv["gpu_hours"]) / float(kv["static_gpu_hours"]),
                ratio=float(kv["ratio"]),
                oracle_ratio=oracle_ratio,
                modes=kv["planner_mode_pct"],
            )
        )
    return out


def traces(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found += sorted(q for q in p.rglob("*") if q.suffix in (".csv", ".jsonl"))
        else:
            found.append(p)
    return found


def run_one(path: Path, root: Path | None, startup_seed: int) -> list[Outcome]:
    name = str(path.relative_to(root)) if root is not None else f"{path.parent.name}/{path.name}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.bench_autoscale",
            str(path),
            "--startup-seed",
            str(startup_seed),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench_autoscale failed on {path}:\n{proc.stderr[-2000:]}")
    got = parse(name, proc.stdout, startup_seed)
    if len(got) != 2:
        raise SystemExit(f"bench_autoscale on {path} printed {len(got)} result lines, not 2")
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", type=Path, nargs="+")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--startup-seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    root = args.paths[0] if len(args.paths) == 1 and args.paths[0].is_dir() else None
    jobs = [(p, s) for p in traces(args.paths) for s in args.startup_seeds]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda js: run_one(js[0], root, js[1]), jobs))
    outcomes: list[Outcome] = []
    seen_60s: set[str] = set()
    for got in results:
        for o in got:
            if o.label == "60s":
                if o.trace in seen_60s:
                    continue
                seen_60s.add(o.trace)
            outcomes.append(o)
    for o in outcomes:
        print(
            f"run: trace={o.trace} startup={o.label} slo_pct={o.slo_pct:.2f} "
            f"over_static={o.over_static:.3f} ratio={o.ratio:.3f} "
            f"oracle_ratio={o.oracle_ratio:.3f} modes={o.modes} met={'yes' if o.met else 'no'}"
        )
    met = sum(o.met for o in outcomes)
    slo = sorted(o.slo_pct for o in outcomes)
    print(
        f"sweep: runs={len(outcomes)} met_every_goal={met} "
        f"slo_ge_95={sum(s >= SLO_GOAL for s in slo)} "
        f"static_le_110={sum(o.over_static <= STATIC_GOAL for o in outcomes)} "
        f"median_slo_pct={slo[len(slo) // 2]:.2f} min_slo_pct={slo[0]:.2f}"
    )
