"""The planner-only replay (`seedance.bench.planner_replay`) runs on a tiny synthetic trace and
gives the bench's `predictive` row there (slo_%, GPU-hours, cold_%, mode shares)."""

from __future__ import annotations

import argparse
import math

from seedance.bench import autoscale as bench
from seedance.bench.planner_replay import replay_planner
from seedance.bench.router_sim import TraceRequest


def _trace() -> list[TraceRequest]:
    # Ten minutes: a quiet start, then a burst at four times the rate, then quiet again.
    out = []
    t = 0.0
    while t < 600.0:
        rate = 8.0 if 200.0 <= t < 320.0 else 2.0
        out.append(TraceRequest(arrival_s=t, prompt_tokens=1500 + int(t) % 700, output_tokens=120))
        t += 1.0 / rate
    return out


def test_planner_replay_gives_the_bench_predictive_row_on_a_tiny_trace() -> None:
    trace = _trace()
    (row,) = replay_planner(trace, ["60"], cold_cost=True)
    args = argparse.Namespace(slo_s=2.0, slo_target=95.0)
    ok = bench.attainable(trace, 2.0)
    c = bench.compare("60s", trace, ok, args, 60.0, 60.0)
    assert row.startup == "60"
    assert (row.slo_pct, row.gpu_hours, row.cold_slo_pct) == (
        c.ours.slo_pct,
        c.ours.gpu_hours,
        c.ours.cold_slo_pct,
    )
    assert row.modes_pct == c.modes_pct
    assert row.gpu_hours > 0.0
    assert 0.0 < row.slo_pct <= 100.0
    # The whole trace arrives within the first 15 min: its cold replay is the run itself.
    assert math.isclose(row.cold_gpu_hours, row.gpu_hours)
