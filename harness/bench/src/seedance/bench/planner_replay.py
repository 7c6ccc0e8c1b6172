"""Planner-only replay: bench-autoscale's `predictive` rows alone, and the first 15 min's cost.

What it replays: the trace through the bench's simulator (`seedance.bench.autoscale.replay`: the
same replica profile, least-outstanding routing, starting fleet `start_count`, attainable
requests and start-up times) with the bench's `PlannerScaler` and planner configuration, at
today's 60 s start-up and on measured start-up draws (`--draws`, the bench's `--startup-seed`
values; the planner's lead is the draws' p90, as the bench's). Nothing else runs (no reactive
grid, no oracle, no static search), so one Mooncake row takes seconds where the whole bench
takes minutes; its slo_% and GPU-hours equal the bench's `predictive` rows (`autoscale_60s:` at
60 s, `autoscale:` on a draw) to the digit: the planner is deterministic and sees what it sees
there.

Per run it prints slo_%, GPU-hours, `cold_%` (slo_% over the first 15 min, as the bench's
column), the planner's mode shares (forecast/panic/floor, as `planner_mode_pct`), GPU-hours /
static where `--static-gpu-hours` is given (the bench's `static_gpu_hours`), and with
`--cold-cost` the first 15 min's GPU-hours: the replay of the arrivals before 900 s alone (the
planner is causal, so its decisions there are the hour's; that replay runs on until those
requests are served).

With `--bound`, instead of the planner, the clairvoyant bound at each start-up: a scaler that
asks one constant count N at every tick from the planner's first decision (`ConstantScaler`, the
planner's interval), in the same simulator from the same start fleet, routing and start-up draws.
N is chosen in hindsight: the fewest replicas whose run meets the SLO target, scanned one by one
from the start count (upward while the run misses, downward while the next lower one still
meets), since the simulated SLO is not monotone in N to the digit (a bisection could step over
the first N that meets it). The run at N + 1 is reported beside it. What no policy that holds one
count from its first decision can beat (one that follows the load can: Azure conv), and so how
much of the cost goal (<= 1.10 x static) is left to what a planner must learn.

Usage: python -m tools.bench.planner_replay TRACE [--draws 60 0 1 2] [--static-gpu-hours G]
[--cold-cost] [--bound [--constant N ...]]. One line per run on stdout: `planner_replay:
trace=... startup=60|draw<k> ...`; with `--bound`, two per start-up (with `--constant`, one per
N given, no scan: the constant's curve): `planner_bound: trace=... startup=...
n=... slo_pct=... gpu_hours=... x_static=...` at N and at N + 1 (static: `--static-gpu-hours`,
else the bench's hindsight search, run first).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from seedance.bench import autoscale as bench
from seedance.bench.router_sim import TraceRequest, load_trace
from seedance.bench.router_sim.autoscale import ConstantScaler, PlannerScaler
from seedance.bench.router_sim.startup import StartupModel
from seedance.testing.paths import data_dir

__all__ = [
    "BoundRow",
    "ReplayRow",
    "clairvoyant_bound",
    "constant_runs",
    "main",
    "replay_planner",
]


@dataclass(frozen=True, slots=True)
class ReplayRow:
    startup: str  # "60" (today's constant) or "draw<seed>"
    slo_pct: float
    gpu_hours: float
    cold_slo_pct: float
    modes_pct: tuple[float, float, float]  # forecast / panic / floor, as planner_mode_pct
    cold_gpu_hours: float = math.nan  # the first COLD_S's arrivals replayed alone


@dataclass(frozen=True, slots=True)
class BoundRow:
    startup: str
    replicas: int  # the constant asked from the first decision
    slo_pct: float
    gpu_hours: float


class _Constants:
    """Runs of the trace with one constant count asked from the planner's first tick, cached."""

    def __init__(
        self, trace: list[TraceRequest], startup: float | tuple[float, ...], slo_s: float
    ) -> None:
        self.cfg = bench.planner_config(slo_s, 0.95, 60.0)  # target and lead play no part
        self.n0 = bench.start_count(trace, bench.replica_capacity(), self.cfg)
        self._args = (trace, bench.attainable(trace, slo_s), slo_s)
        self._startup = startup
        self._runs: dict[int, bench.Run] = {}

    def at(self, n: int) -> bench.Run:
        if n not in self._runs:
            trace, ok, slo_s = self._args
            scaler = ConstantScaler(n, self.cfg.interval_s)
            self._runs[n] = bench.replay(
                f"bound n={n}", trace, ok, slo_s, self.n0, self._startup, scaler
            )
        return self._runs[n]


def constant_runs(
    trace: list[TraceRequest],
    startup: float | tuple[float, ...],
    label: str,
    counts: list[int],
    *,
    slo_s: float = 2.0,
) -> list[BoundRow]:
    """The runs at the given constants (a curve of the bound's runs: slo_% and cost per N)."""
    c = _Constants(trace, startup, slo_s)
    return [BoundRow(label, n, c.at(n).slo_pct, c.at(n).gpu_hours) for n in counts]


def clairvoyant_bound(
    trace: list[TraceRequest],
    startup: float | tuple[float, ...],
    label: str,
    *,
    slo_s: float = 2.0,
    target_pct: float = 95.0,
) -> tuple[BoundRow, BoundRow]:
    """The fewest replicas N that, asked at every tick from the first, meet `target_pct` on
    `trace` at `startup` (the module docstring: why a scan), and the run at N + 1."""
    c = _Constants(trace, startup, slo_s)
    at, cfg = c.at, c.cfg
    n = c.n0
    if at(n).slo_pct >= target_pct:
        while n > 1 and at(n - 1).slo_pct >= target_pct:
            n -= 1
    else:
        while at(n).slo_pct < target_pct:
            if n >= cfg.max_replicas:
                raise SystemExit(f"no constant fleet up to {n} replicas meets {target_pct}%")
            n += 1
    first, second = at(n), at(n + 1)
    return (
        BoundRow(label, n, first.slo_pct, first.gpu_hours),
        BoundRow(label, n + 1, second.slo_pct, second.gpu_hours),
    )


def _startups(
    draws: list[str], startup_data: Path | None
) -> list[tuple[str, float | tuple[float, ...], float]]:
    """(label, start-ups, the planner's lead) per entry of `draws`, as bench-autoscale runs
    them: "60" every replica 60 s, lead 60 s; a seed, the measured draws, lead their p90."""
    out: list[tuple[str, float | tuple[float, ...], float]] = []
    measured: StartupModel | None = None
    for d in draws:
        if d == "60":
            out.append(("60", 60.0, 60.0))
            continue
        if measured is None:
            path = startup_data or data_dir() / "alibaba-genai-2026" / bench.LOAD_LATENCY_FILE
            measured = StartupModel.measured(path, weight_bytes=bench.P.weight_bytes)
        out.append(
            (
                f"draw{int(d)}",
                measured.draws(bench.STARTUP_DRAWS, seed=int(d)),
                measured.quantile(bench.STARTUP_PLAN_QUANTILE),
            )
        )
    return out


def _run(
    trace: list[TraceRequest],
    slo_s: float,
    startup: float | tuple[float, ...],
    lead_s: float,
) -> tuple[bench.Run, tuple[float, float, float]]:
    capacity = bench.replica_capacity()
    cfg = bench.planner_config(slo_s, 0.95, lead_s)
    n0 = bench.start_count(trace, capacity, cfg)
    planner = PlannerScaler(cfg, capacity, n0)
    ok = bench.attainable(trace, slo_s)
    run = bench.replay("predictive", trace, ok, slo_s, n0, startup, planner)
    return run, bench.mode_shares(planner)


def replay_planner(
    trace: list[TraceRequest],
    draws: list[str],
    *,
    slo_s: float = 2.0,
    cold_cost: bool = False,
    startup_data: Path | None = None,
) -> list[ReplayRow]:
    """One row per entry of `draws`: "60" (every replica 60 s, lead 60 s) or a seed of the
    measured start-up draws (lead: their p90), as bench-autoscale runs them."""
    rows = []
    for label, startup, lead_s in _startups(draws, startup_data):
        run, modes = _run(trace, slo_s, startup, lead_s)
        cold_gpu_h = math.nan
        if cold_cost:
            head = [r for r in trace if r.arrival_s < bench.COLD_S]
            if head:
                cold_gpu_h = _run(head, slo_s, startup, lead_s)[0].gpu_hours
        rows.append(
            ReplayRow(label, run.slo_pct, run.gpu_hours, run.cold_slo_pct, modes, cold_gpu_h)
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--draws", nargs="+", default=["60", "0", "1", "2"])
    ap.add_argument("--slo-s", type=float, default=2.0)
    ap.add_argument("--static-gpu-hours", type=float, default=None)
    ap.add_argument("--cold-cost", action="store_true")
    ap.add_argument(
        "--bound", action="store_true", help="the clairvoyant constant, not the planner"
    )
    ap.add_argument(
        "--constant", type=int, nargs="+", default=None, help="with --bound: these N, no scan"
    )
    args = ap.parse_args()
    trace = load_trace(args.trace)
    if args.bound:
        static_h = args.static_gpu_hours
        if static_h is None:  # the bench's hindsight static search (zero start-up)
            ok = bench.attainable(trace, args.slo_s)
            n, runs = bench.static_count(trace, ok, args.slo_s, 95.0)
            static_h = runs[n].gpu_hours
        for label, startup, _ in _startups(args.draws, None):
            rows = (
                constant_runs(trace, startup, label, args.constant, slo_s=args.slo_s)
                if args.constant
                else clairvoyant_bound(trace, startup, label, slo_s=args.slo_s)
            )
            for b in rows:
                print(
                    f"planner_bound: trace={args.trace.stem} startup={b.startup} n={b.replicas} "
                    f"slo_pct={b.slo_pct:.2f} gpu_hours={b.gpu_hours:.3f} "
                    f"x_static={b.gpu_hours / static_h:.3f}",
                    flush=True,
                )
        return
    for row in replay_planner(trace, args.draws, slo_s=args.slo_s, cold_cost=args.cold_cost):
        ratio = (
            f" x_static={row.gpu_hours / args.static_gpu_hours:.3f}"
            if args.static_gpu_hours
            else ""
        )
        cold_h = (
            "" if math.isnan(row.cold_gpu_hours) else f" cold_gpu_hours={row.cold_gpu_hours:.2f}"
        )
        print(
            f"planner_replay: trace={args.trace.stem} startup={row.startup} "
            f"slo_pct={row.slo_pct:.2f} gpu_hours={row.gpu_hours:.3f}{ratio} "
            f"cold_pct={row.cold_slo_pct:.2f}{cold_h} "
            f"planner_mode_pct={'/'.join(f'{x:.1f}' for x in row.modes_pct)}",
            flush=True,
        )
