"""The planner-only replay (`seedance.bench.planner_replay`) runs on a tiny synthetic trace and
gives the bench's `predictive` row there (slo_%, GPU-hours, cold_%, mode shares); its clairvoyant
bound (`--bound`) is the fewest constant replicas, asked from the first tick, that meet the
target."""

from __future__ import annotations

import argparse
import math

from seedance.bench import autoscale as bench
from seedance.bench.planner_replay import clairvoyant_bound, constant_runs, replay_planner
from seedance.bench.router_sim import TraceRequest, simulate
from seedance.bench.router_sim.autoscale import ConstantScaler
from seedance.bench.router_sim.interfaces import FleetObservation, Scaler
from seedance.router.core.policy import LeastOutstanding


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


class _Asks(Scaler):
    """The test's own constant scaler at the planner's tick, so the bound's runs are checked
    against replays it did not make."""

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def tick_s(self) -> float:
        return 15.0

    def desired(self, obs: FleetObservation) -> int:
        return self.n


def _step_trace(rise_s: float) -> list[TraceRequest]:
    # A light first minute (the start fleet's evidence), then eight times the rate from `rise_s`:
    # the start count is below what the rest needs, so the bound scans up from it.
    out = []
    t = 20.0
    while t < 400.0:
        rate = 1.0 if t < rise_s else 8.0
        out.append(
            TraceRequest(arrival_s=t, prompt_tokens=1500 + int(7 * t) % 1200, output_tokens=120)
        )
        t += 1.0 / rate
    return out


def _slo_pct(trace: list[TraceRequest], n0: int, startup_s: float, n: int) -> float:
    res = simulate(trace, LeastOutstanding(), n0, bench.P, scaler=_Asks(n), startup_s=startup_s)
    ok = bench.attainable(trace, 2.0)
    met = sum(1 for a, t in zip(ok, res.ttft_s, strict=True) if a and t <= 2.0)
    return 100.0 * met / sum(ok)


def _start(trace: list[TraceRequest]) -> int:
    return bench.start_count(trace, bench.replica_capacity(), bench.planner_config(2.0, 0.95, 60.0))


def test_the_bound_at_zero_start_up_is_the_static_search_when_nothing_arrives_before_a_tick() -> (
    None
):
    # No arrival before the first tick (20 s > 15 s) and no start-up: the constant fleet serves
    # every request as a static fleet of N does, so the bound must find the static search's N.
    trace = _step_trace(rise_s=80.0)
    ok = bench.attainable(trace, 2.0)
    n_static, static_runs = bench.static_count(trace, ok, 2.0, 95.0)
    first, second = clairvoyant_bound(trace, 0.0, "0")
    assert _start(trace) < n_static  # the scan had to go up
    assert first.replicas == n_static
    assert first.slo_pct == static_runs[n_static].slo_pct
    assert second.replicas == n_static + 1
    assert second.gpu_hours > first.gpu_hours


def test_the_bound_asks_its_count_from_the_first_tick_and_is_the_fewest_that_meets() -> None:
    # The rise comes before a replica asked at the first tick (15 s) is ready (75 s): the start
    # fleet serves it alone, so N pays for the start-up and exceeds the static count.
    trace = _step_trace(rise_s=50.0)
    n0 = _start(trace)
    first, second = clairvoyant_bound(trace, 60.0, "60")
    ok = bench.attainable(trace, 2.0)
    n_static, _ = bench.static_count(trace, ok, 2.0, 95.0)
    assert first.replicas > n_static
    assert first.slo_pct == _slo_pct(trace, n0, 60.0, first.replicas) >= 95.0
    assert _slo_pct(trace, n0, 60.0, first.replicas - 1) < 95.0
    assert second.slo_pct == _slo_pct(trace, n0, 60.0, second.replicas)
    res = simulate(
        trace,
        LeastOutstanding(),
        n0,
        bench.P,
        scaler=ConstantScaler(first.replicas, 15.0),
        startup_s=60.0,
    )
    assert res.fleet_timeline[0] == (15.0, first.replicas)
    assert {n for _, n in res.fleet_timeline} == {first.replicas}


def test_the_constants_curve_gives_the_runs_of_the_counts_asked() -> None:
    trace = _step_trace(rise_s=50.0)
    n0 = _start(trace)
    rows = constant_runs(trace, 60.0, "60", [3, 4, 5])
    assert [r.replicas for r in rows] == [3, 4, 5]
    assert [r.slo_pct for r in rows] == [_slo_pct(trace, n0, 60.0, n) for n in (3, 4, 5)]
    assert rows[0].gpu_hours < rows[1].gpu_hours < rows[2].gpu_hours


def test_the_bound_scans_down_from_a_start_fleet_larger_than_the_rest_needs() -> None:
    # A burst in the first 10 s sizes the start fleet; the start fleet serves it before the first
    # tick (15 s), so a constant below the start count meets the target on what follows.
    out = []
    t = 0.0
    while t < 400.0:
        out.append(
            TraceRequest(arrival_s=t, prompt_tokens=1500 + int(7 * t) % 1200, output_tokens=120)
        )
        t += 1.0 / (16.0 if t < 10.0 else 4.0)
    n0 = _start(out)
    first, _ = clairvoyant_bound(out, 60.0, "60")
    assert 1 < first.replicas < n0
    assert first.slo_pct == _slo_pct(out, n0, 60.0, first.replicas) >= 95.0
    assert _slo_pct(out, n0, 60.0, first.replicas - 1) < 95.0
