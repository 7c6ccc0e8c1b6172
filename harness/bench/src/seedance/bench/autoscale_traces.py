"""Synthetic robustness traces for bench-autoscale, cut from the Azure conversation trace.

Usage: python -m tools.bench.autoscale_traces AZURE_CONV_CSV OUT_DIR [--seed 3]
Writes OUT_DIR/onoff.csv (the trace's own requests kept only in "on" periods, exponential on
90 s / off 150 s on average: bursts shorter than start-up plus the scale-down window) and
OUT_DIR/ramp.csv (requests kept with probability 0.25 + 0.75 sin²(πt / 3600): a slow swell and
ebb). Same Azure CSV format, real prompt and output sizes; only which requests stay is drawn.
These are checks of the planner's behaviour off the two traces it was developed on, not
benchmarks of record.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from collections.abc import Callable
from pathlib import Path

from seedance.traces.llm_requests import load_trace, read_azure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    arrivals_s = [r.arrival_s for r in load_trace(args.trace)]  # sorted, from the first request
    rows = sorted(read_azure(args.trace), key=lambda r: r.time_s)  # stable, as load_trace sorts
    periods: list[tuple[float, float, bool]] = []
    t, on = 0.0, True
    while t < arrivals_s[-1] + 1.0:
        d = rng.expovariate(1.0 / (90.0 if on else 150.0))
        periods.append((t, t + d, on))
        t, on = t + d, not on

    def in_on(x: float) -> bool:
        return next(o for a, b, o in periods if a <= x < b)

    keeps: dict[str, Callable[[float], bool]] = {
        "onoff": in_on,
        "ramp": lambda x: rng.random() < 0.25 + 0.75 * math.sin(math.pi * x / 3600.0) ** 2,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for name, keep in keeps.items():
        with (args.out / f"{name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
            for row, x in zip(rows, arrivals_s, strict=True):
                if keep(x):
                    w.writerow([row.timestamp, row.context_tokens, row.generated_tokens])
