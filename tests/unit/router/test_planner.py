"""The replica planner's core: SLO sizing, KV sizing, start-up lead time, hysteresis, feedback.

Where a test is about following the forecast, the planner is given a clean record (`reliable`):
without one it holds the count it started with (test_planner_modes.py)."""

from __future__ import annotations

import math

import pytest

from seedance.router.core.planning.demand import DemandWindow
from seedance.router.core.planning.planner import (  # the model's pieces
    Binding,
    LoadForecast,
    ObservedSlo,
    PlannerConfig,
    PlanReason,
    PlanState,
    ReplicaCapacity,
    plan,
    replicas_needed,
)
from seedance.router.core.planning.sizing import _attainment, _erlang_c

CAP = ReplicaCapacity(
    prefill_tokens_per_s=10_000.0,
    prefill_overhead_s=0.0,
    decode_step_s=0.0,
    kv_capacity_tokens=100_000,
)
CFG = PlannerConfig(interval_s=15.0, scale_down_window_s=60.0, startup_s=60.0, max_replicas=50)


def reliable(replicas: int, until_s: float = 0.0, **kwargs: float) -> PlanState:
    """A planner whose forecast (one replica) served every interval of the half hour up to
    `until_s` (a record that stays valid while the test's clock is inside it)."""
    n = int(CFG.calibration_window_s / CFG.interval_s)
    windows = tuple(
        (1, DemandWindow(end_s=until_s - (n - 1 - i) * CFG.interval_s, requests=10, met=(10,)))
        for i in range(n)
    )
    # ... and whose SLO budget has room (a surplus: it may scale below what it holds).
    kwargs.setdefault("budget", ((until_s - 1.0, 1000, 1000),))  # type: ignore[arg-type]
    return PlanState(replicas=replicas, windows=windows, **kwargs)  # type: ignore[arg-type]


def load(rate: float, prompt: float = 5_000.0, kv: float = 0.0, h: float = 0.0) -> LoadForecast:
    # Every request the same size: E[S] = 0.5 s, E[S^2] = 0.25 s^2.
    return LoadForecast(
        horizon_s=h,
        arrivals_per_s=rate,
        prompt_tokens_mean=prompt,
        prompt_tokens_sq_mean=prompt * prompt,
        kv_used_tokens=kv,
    )


def test_erlang_c_matches_known_values() -> None:
    assert _erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert _erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)
    assert _erlang_c(10, 0.0) == 0.0


def test_no_load_needs_the_minimum() -> None:
    assert replicas_needed(load(0.0), CAP, CFG) == (1, Binding.MIN_REPLICAS)


def test_the_count_is_the_fewest_that_meets_the_slo_target() -> None:
    rate = 20.0  # offered load 10 replicas of prefill
    n, binding = replicas_needed(load(rate), CAP, CFG)
    assert binding is Binding.PREFILL
    budget = [CFG.ttft_slo_s - 0.5]
    assert _attainment(n, rate, 0.5, 0.25, budget) >= CFG.slo_target
    assert _attainment(n - 1, rate, 0.5, 0.25, budget) < CFG.slo_target
    assert n > 10  # never at or past saturation


def test_the_count_grows_with_the_rate_and_with_a_stricter_slo() -> None:
    counts = [replicas_needed(load(r), CAP, CFG)[0] for r in (1.0, 5.0, 10.0, 20.0, 40.0)]
    assert counts == sorted(counts)
    assert counts[-1] > counts[0]
    strict = PlannerConfig(ttft_slo_s=0.6, max_replicas=50)
    assert replicas_needed(load(20.0), CAP, strict)[0] > replicas_needed(load(20.0), CAP, CFG)[0]


def test_kv_in_use_can_bind() -> None:
    # 10 pools' worth at 85 % headroom: ceil(1e6 / 85e3) = 12.
    assert replicas_needed(load(0.1, kv=1_000_000.0), CAP, CFG) == (12, Binding.KV)


def test_the_maximum_caps_and_says_so() -> None:
    small = PlannerConfig(max_replicas=3)
    assert replicas_needed(load(100.0), CAP, small) == (3, Binding.MAX_REPLICAS)


def test_requests_no_replica_serves_in_time_ask_only_for_stability() -> None:
    # 30k-token prompts take 3 s > the 2 s SLO: only a stable queue (a < n) is asked for.
    n, _ = replicas_needed(load(1.0, prompt=30_000.0), CAP, CFG)
    assert n == 4  # offered load 3 replicas; 4 is the fewest with a < n


def test_prompt_quantiles_set_the_budgets() -> None:
    mixed = LoadForecast(
        horizon_s=0.0,
        arrivals_per_s=10.0,
        prompt_tokens_mean=5_000.0,
        prompt_tokens_sq_mean=5_000.0**2,
        kv_used_tokens=0.0,
        # Half the requests nearly fill the SLO on their own: they need a shorter wait.
        prompt_tokens_quantiles=(1_000.0, 19_000.0),
    )
    assert replicas_needed(mixed, CAP, CFG)[0] > replicas_needed(load(10.0), CAP, CFG)[0]


def test_scale_up_is_immediate() -> None:
    state, rec = plan(reliable(2), 0.0, [load(20.0)], CAP, CFG)
    assert rec.reason is PlanReason.SCALE_UP
    assert rec.replicas == rec.needed == state.replicas > 2


def test_the_lead_time_forecast_sets_the_count() -> None:
    now, later = load(1.0, h=0.0), load(20.0, h=CFG.lead_s)
    _, rec = plan(reliable(1), 0.0, [now, later], CAP, CFG)
    assert rec.horizon_s == CFG.lead_s
    assert rec.replicas == replicas_needed(later, CAP, CFG)[0]
    assert CFG.lead_s == CFG.startup_s + CFG.interval_s


def test_scale_down_waits_for_a_whole_window_then_takes_its_highest_need() -> None:
    high = replicas_needed(load(20.0), CAP, CFG)[0]
    mid = replicas_needed(load(10.0), CAP, CFG)[0]
    state, _ = plan(reliable(1), 0.0, [load(20.0)], CAP, CFG)
    assert state.replicas == high
    reasons = []
    t = 0.0
    for rate in (10.0, 2.0, 2.0, 2.0, 2.0, 2.0):
        t += CFG.interval_s
        state, rec = plan(state, t, [load(rate)], CAP, CFG)
        reasons.append((t, rec.reason, rec.replicas))
    # Until the window (60 s) after the high need is covered, the count holds.
    assert all(r == high for tt, _, r in reasons if tt < 60.0)
    assert {why for tt, why, _ in reasons if tt < 60.0} == {PlanReason.STABILISING}
    # Then it goes down, but only to the highest need still in the window (the 10/s one at
    # t=15 until it ages out), never straight to the lowest.
    first_down = next((tt, r) for tt, why, r in reasons if why is PlanReason.SCALE_DOWN)
    assert first_down[1] == mid
    assert reasons[-1][2] == replicas_needed(load(2.0), CAP, CFG)[0]


def test_a_spike_inside_the_window_stops_the_scale_down() -> None:
    state = reliable(10)
    t = 0.0
    for rate in (1.0, 1.0, 1.0, 19.0, 1.0, 1.0):
        t += CFG.interval_s
        state, rec = plan(state, t, [load(rate)], CAP, CFG)
    assert rec.replicas >= replicas_needed(load(19.0), CAP, CFG)[0]


def test_the_count_holds_when_the_need_equals_it() -> None:
    n = replicas_needed(load(10.0), CAP, CFG)[0]
    _, rec = plan(PlanState(replicas=n), 0.0, [load(10.0)], CAP, CFG)
    assert (rec.reason, rec.replicas) == (PlanReason.HOLD, n)


def test_missed_slos_raise_the_capacity_factor_once_start_ups_are_done() -> None:
    base = replicas_needed(load(10.0), CAP, CFG)[0]
    state = reliable(base, until_s=1900.0)
    bad = ObservedSlo(met=80, requests=100)
    state, rec = plan(state, 100.0, [load(10.0)], CAP, CFG, bad)
    assert state.capacity_factor == pytest.approx(1.0 + CFG.feedback_up)
    assert rec.replicas >= base
    # The scale-up it caused is still starting: more misses do not wind the factor up.
    if rec.reason is PlanReason.SCALE_UP:
        frozen, _ = plan(state, 115.0, [load(10.0)], CAP, CFG, bad)
        assert frozen.capacity_factor == state.capacity_factor
    for k in range(1, 30):
        state, rec = plan(state, 100.0 + 61.0 * k, [load(10.0)], CAP, CFG, bad)
    assert state.capacity_factor == CFG.factor_max
    assert rec.needed >= base


def test_met_slos_lower_the_factor_but_never_below_one() -> None:
    state = PlanState(replicas=5, capacity_factor=1.02)
    good = ObservedSlo(met=100, requests=100)
    for k in range(10):
        state, _ = plan(state, 1000.0 + 15.0 * k, [load(1.0)], CAP, CFG, good)
    assert state.capacity_factor == 1.0


def test_few_observations_do_not_move_the_factor() -> None:
    state, _ = plan(
        PlanState(replicas=2), 0.0, [load(1.0)], CAP, CFG, ObservedSlo(met=0, requests=3)
    )
    assert state.capacity_factor == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"slo_target": 1.0},
        {"slo_target": 0.0},
        {"kv_headroom": 0.0},
        {"ttft_slo_s": 0.0},
        {"interval_s": 0.0},
        {"startup_s": -1.0},
        {"min_replicas": 0},
        {"min_replicas": 5, "max_replicas": 4},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need 1 <="):
        PlannerConfig(**kwargs)  # type: ignore[arg-type]


def test_bad_forecasts_and_capacities_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        load(-1.0)
    with pytest.raises(ValueError, match="below the square"):
        LoadForecast(
            horizon_s=0.0,
            arrivals_per_s=1.0,
            prompt_tokens_mean=10.0,
            prompt_tokens_sq_mean=10.0,
            kv_used_tokens=0.0,
        )
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        ReplicaCapacity(
            prefill_tokens_per_s=1.0,
            prefill_overhead_s=0.0,
            decode_step_s=0.0,
            kv_capacity_tokens=0,
        )
    with pytest.raises(ValueError, match="at least one"):
        plan(PlanState(replicas=1), 0.0, [], CAP, CFG)


def test_attainment_is_zero_when_unstable_and_one_when_idle() -> None:
    assert _attainment(2, 10.0, 0.5, 0.25, [1.0]) == 0.0
    assert _attainment(2, 0.0, 0.5, 0.25, [1.0]) == 1.0
    assert 0.0 < _attainment(6, 10.0, 0.5, 0.25, [1.0]) < 1.0
    assert math.isclose(
        _attainment(6, 10.0, 0.5, 0.25, [1.0, 1.0]), _attainment(6, 10.0, 0.5, 0.25, [1.0])
    )


def test_misses_from_before_the_last_scale_up_was_ready_do_not_raise_the_factor() -> None:
    bad, good = ObservedSlo(met=50, requests=100), ObservedSlo(met=100, requests=100)
    # (A budget deep enough that these misses leave it a surplus: the model keeps the count.)
    state = reliable(3, last_scale_up_s=0.0, budget=((-1.0, 100_000, 100_000),))
    # t=30: the misses were served while the scale-up at t=0 was still starting.
    state, _ = plan(state, 30.0, [load(1.0)], CAP, CFG, bad)
    assert state.capacity_factor == 1.0
    # t=75: the new replicas are ready since t=60, and what they served met the SLO.
    state, _ = plan(state, 75.0, [load(1.0)], CAP, CFG, good)
    assert state.capacity_factor == 1.0
    # A miss served by the ready fleet does count.
    state, _ = plan(state, 90.0, [load(1.0)], CAP, CFG, ObservedSlo(met=0, requests=100))
    assert state.capacity_factor == pytest.approx(1.0 + CFG.feedback_up)
