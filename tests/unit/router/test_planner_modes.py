"""The planner's modes (issue 32): it follows its forecast only on a clean record, holds
otherwise, never plans below the work that just arrived, panics when an interval outruns the
plan, and answers an overspent error budget with a raise that expires."""

from __future__ import annotations

from dataclasses import replace

import pytest

from seedance.router.core.planning.demand import DemandWindow, replay_window
from seedance.router.core.planning.planner import (
    LoadForecast,
    ObservedSlo,
    PlannerConfig,
    PlannerMode,
    PlanReason,
    PlanState,
    ReplicaCapacity,
    plan,
    pooled_need,
)

# 5,000-token prompts take 0.5 s at 10k tokens/s; budget 2 s.
CAP = ReplicaCapacity(
    prefill_tokens_per_s=10_000.0,
    prefill_overhead_s=0.0,
    decode_step_s=0.0,
    kv_capacity_tokens=100_000,
)
CFG = PlannerConfig(interval_s=15.0, scale_down_window_s=60.0, startup_s=60.0, max_replicas=50)
WINDOWS = int(CFG.calibration_window_s / CFG.interval_s)


def load(rate: float) -> LoadForecast:
    return LoadForecast(
        horizon_s=0.0,
        arrivals_per_s=rate,
        prompt_tokens_mean=5_000.0,
        prompt_tokens_sq_mean=5_000.0**2,
        kv_used_tokens=0.0,
    )


def history(
    forecast: int, needed: int, *, until_s: float = 0.0
) -> tuple[tuple[int, DemandWindow], ...]:
    """A calibration window of intervals of 10 requests each that `needed` replicas serve in
    full (fewer serve none), judged against a forecast that asked for `forecast`."""
    met = tuple(0 if n < needed else 10 for n in range(1, needed + 1))
    return tuple(
        (
            forecast,
            DemandWindow(end_s=until_s - (WINDOWS - 1 - i) * CFG.interval_s, requests=10, met=met),
        )
        for i in range(WINDOWS)
    )


def arrivals(
    rate: float, start_s: float, end_s: float, prompt: float = 5_000.0
) -> list[tuple[float, float]]:
    n = round(rate * (end_s - start_s))
    return [(start_s + (k + 0.5) * (end_s - start_s) / n, prompt) for k in range(n)]


def run(state: PlanState, t0: float, steps: int, rate: float) -> list[tuple[PlanState, object]]:
    out = []
    for k in range(1, steps + 1):
        t = t0 + k * CFG.interval_s
        state, rec = plan(state, t, [load(rate)], CAP, CFG)
        out.append((state, rec))
    return out


def test_without_a_record_or_any_demand_the_planner_keeps_what_runs() -> None:
    steps = run(PlanState(replicas=8), 0.0, 20, rate=1.0)
    for _, rec in steps:
        assert rec.mode is PlannerMode.FLOOR
        assert rec.record is None
        assert rec.held == 8
    assert steps[-1][0].replicas == 8  # the forecast (1 req/s: 2 replicas) did not take it down


def calm(
    needed: int, until_s: float, n: int = WINDOWS, requests: int = 10
) -> tuple[DemandWindow, ...]:
    """`n` intervals up to `until_s` of `requests` each that `needed` replicas serve in full."""
    met = tuple(0 if k < needed else requests for k in range(1, needed + 1))
    return tuple(
        DemandWindow(end_s=until_s - (n - 1 - i) * CFG.interval_s, requests=requests, met=met)
        for i in range(n)
    )


def test_the_held_count_is_the_observed_demand_not_the_count_it_started_with() -> None:
    # Started with 8 (or 1); the last half hour's intervals each needed 3 replicas of one shared
    # queue: the held count is 3 either way (observed demand only), and 8 comes down to it.
    for start in (8, 1):
        state = PlanState(replicas=start, seen=calm(3, until_s=0.0))
        steps = run(state, 0.0, 12, rate=1.0)
        assert all(rec.held == 3 for _, rec in steps)
        assert steps[-1][0].replicas == 3
    # Demand that outgrew the hour before it: the pooled need follows what was observed.
    state = PlanState(replicas=3, seen=(*calm(3, -CFG.interval_s, 100), *calm(6, 0.0, 140)))
    _, rec = plan(state, 15.0, [load(1.0)], CAP, CFG)
    assert rec.held == 6


def test_a_young_history_pools_as_a_long_one_does() -> None:
    # 40 calm intervals that 2 replicas serve and one burst interval that needs 6: pooled, 2.
    seen = (*calm(2, -CFG.interval_s, 40, requests=100), *calm(6, 0.0, 1, requests=100))
    assert pooled_need(seen, CFG.band[0]) == 2
    # Seen for 10 min (as for an hour), the held count is the pooled need: the largest interval
    # of a young history is an order statistic, not a calibration (held until 20 min, it kept
    # Mooncake's fleet at 34 where the pooled need asked for 25-27: 2.1-2.5 GPU-hours of an
    # hour, issue 32's tenth pass). A burst that outruns the plan is the panic's and the
    # floor's to answer, an overspent budget the raise's.
    _, rec = plan(PlanState(replicas=2, seen=seen), 15.0, [load(0.1)], CAP, CFG)
    assert rec.held == 2


def test_a_young_stationary_history_holds_its_pooled_need_throughout() -> None:
    # 20 min of stationary demand from the first request on: intervals that 2 replicas serve in
    # full, every fifth one (a noisy draw of the same traffic) 90 of its 100 requests on 2 and
    # all on 3. Pooled, 2 serve 98 % (above the band's lower edge); the largest interval alone
    # needs 3, which the old young-history rule held from the fifth interval to 20 min.
    def interval(i: int) -> DemandWindow:
        met = (0, 90, 100) if i % 5 == 4 else (0, 100)
        return DemandWindow(end_s=(i + 1) * CFG.interval_s, requests=100, met=met)

    state = PlanState(replicas=2)
    held = []
    for i in range(int(CFG.record_min_s / CFG.interval_s)):
        state = replace(state, seen=(*state.seen, interval(i)))
        state, rec = plan(state, (i + 1) * CFG.interval_s, [load(0.1)], CAP, CFG)
        held.append(rec.held)
    assert max(w.need(CFG.band[0]) for w in state.seen) == 3
    assert held == [2] * len(held)


def test_pooled_need_serves_the_target_of_every_request_observed() -> None:
    # 90 intervals served by 2, 10 by 5: 96.7 % of all requests needs 5, 90 % needs 2.
    seen = (*calm(2, 0.0, 90), *calm(5, 1500.0, 10))
    assert pooled_need(seen, CFG.band[0]) == 5
    assert pooled_need(seen, 0.9) == 2
    assert pooled_need((), 0.95) is None


SURPLUS = ((-1.0, 1000, 1000),)  # the last hour kept every request in time


def test_a_clean_record_that_saves_lets_the_forecast_take_the_count_down() -> None:
    state = PlanState(replicas=8, windows=history(forecast=2, needed=2), budget=SURPLUS)
    steps = run(state, 0.0, 8, rate=1.0)
    # With no demand observed the held count stays at 8 but follows the count down (what
    # runs): the forecast sets it while following saves against it.
    assert steps[0][1].mode is PlannerMode.FORECAST
    assert steps[0][1].record == 1.0
    final = steps[-1][0]
    assert final.replicas < 8  # after the scale-down window, to the forecast's need
    assert any(rec.reason is PlanReason.SCALE_DOWN for _, rec in steps)


def test_without_a_surplus_a_clean_record_does_not_take_the_count_down() -> None:
    # The held fleet keeps 95.4 % (Mooncake's hour at its hindsight count): below the band's
    # upper edge, so nothing says a smaller one would do, whatever the record in model units.
    tight = ((-1.0, 954, 1000),)
    state = PlanState(replicas=8, windows=history(forecast=2, needed=2), budget=tight)
    steps = run(state, 0.0, 8, rate=1.0)
    assert all(rec.mode is PlannerMode.FLOOR for _, rec in steps)
    assert steps[-1][0].replicas == 8


def test_a_record_of_missed_bursts_keeps_the_planner_holding() -> None:
    # The forecast asked for 2 where the intervals needed 6: its record is 0.
    state = PlanState(replicas=8, windows=history(forecast=2, needed=6), budget=SURPLUS)
    steps = run(state, 0.0, 8, rate=1.0)
    assert all(rec.mode is PlannerMode.FLOOR for _, rec in steps)
    assert steps[0][1].record == 0.0
    assert steps[-1][0].replicas == 8


def test_a_reliable_forecast_above_the_held_count_scales_up() -> None:
    state = PlanState(replicas=2, windows=history(forecast=2, needed=2))
    state, rec = plan(state, 15.0, [load(20.0)], CAP, CFG)
    assert rec.mode is PlannerMode.FORECAST
    assert rec.reason is PlanReason.SCALE_UP
    assert rec.replicas > 10  # 20 req/s x 0.5 s = 10 replicas offered


def test_the_floor_is_the_work_that_just_arrived() -> None:
    # Held at 1, forecast 0.1 req/s; but the last minute brought 8 replicas' worth of prefill
    # work (16 req/s x 0.5 s): never below it.
    state = PlanState(replicas=1)
    seen = arrivals(16.0, -60.0, 0.0)
    state, rec = plan(state, 0.0, [load(0.1)], CAP, CFG, arrivals=seen)
    assert rec.replicas >= 8
    assert rec.mode in (PlannerMode.FLOOR, PlannerMode.PANIC)


def test_an_interval_that_outruns_the_plan_panics_and_blocks_scale_down() -> None:
    state = PlanState(replicas=2, seen=calm(1, until_s=-CFG.interval_s, requests=100))
    # The last 15 s: 12 req/s of 0.5 s prefills, six replicas' worth, three times the plan
    # (pooled with the calm half hour before it, the held count stays at 1).
    burst = arrivals(12.0, -15.0, 0.0)
    state, rec = plan(state, 0.0, [load(0.1)], CAP, CFG, arrivals=burst)
    assert rec.mode is PlannerMode.PANIC
    assert rec.observed_need >= 6
    assert rec.replicas >= rec.observed_need
    assert state.panic_until_s == CFG.panic_hold_s
    # Quiet again: within the panic hold it does not come down.
    state, rec = plan(state, 30.0, [load(0.1)], CAP, CFG)
    assert rec.mode is PlannerMode.PANIC
    assert rec.reason is PlanReason.STABILISING


def test_an_overspent_budget_raises_the_held_count_once_at_a_time_and_the_raise_expires() -> None:
    bad = ObservedSlo(met=800, requests=1000)
    state = PlanState(replicas=4, holding=True)
    state, rec = plan(state, 1000.0, [load(1.0)], CAP, CFG, bad)
    # One raise: the budget (80 %) is below the band and the fleet as it is now misses.
    assert state.raises == (1000.0,)
    assert rec.held == 5
    assert rec.replicas == 5
    # The next decision judges the fleet only once the raise's replica has served.
    state, rec = plan(state, 1015.0, [load(1.0)], CAP, CFG, bad)
    assert state.raises == (1000.0,)
    # After `raise_s` the raise is gone and the held count is back to the start.
    good = ObservedSlo(met=400, requests=400)
    t = 1015.0
    while t < 1000.0 + CFG.raise_s + CFG.interval_s:
        t += CFG.interval_s
        state, rec = plan(state, t, [load(1.0)], CAP, CFG, good)
    assert rec.held == 4


def test_too_few_requests_do_not_touch_the_budget() -> None:
    state = PlanState(replicas=4, holding=True)
    state, rec = plan(state, 0.0, [load(1.0)], CAP, CFG, ObservedSlo(met=0, requests=100))
    assert state.raises == ()
    assert rec.held == 4


def test_while_holding_a_miss_raises_the_factor_and_a_surplus_lowers_it() -> None:
    # The held count is the queue model's too (pooled observed demand), so the factor learns
    # in every mode.
    state = PlanState(replicas=4, holding=True, capacity_factor=1.2)
    miss = ObservedSlo(met=10, requests=100)
    state, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, miss)
    assert state.capacity_factor == pytest.approx(1.2 * (1.0 + CFG.feedback_up))
    state = PlanState(replicas=4, holding=True, capacity_factor=1.2)
    state, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, ObservedSlo(met=100, requests=100))
    assert state.capacity_factor == pytest.approx(1.2 * (1.0 - CFG.feedback_down))


def test_a_miss_sets_the_factor_to_what_routing_made_of_one_shared_queue() -> None:
    # 4 replicas served 50 % of requests that one shared queue of 2 serves in full and of 1
    # serves half: the fleet is worth 1 such replica, so the factor becomes 4 / 1.
    met = (5, 10)
    seen = tuple(DemandWindow(end_s=100.0 - 15.0 * i, requests=10, met=met) for i in range(3))
    state = PlanState(replicas=4, seen=seen[::-1], observed=((80.0, 30, 60),))
    state, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, ObservedSlo(met=15, requests=30))
    assert state.capacity_factor == pytest.approx(4.0)


def test_a_window_too_small_to_resolve_the_band_does_not_move_the_factor() -> None:
    # 4 misses in 40 requests (90 %) are not read: one miss moves 40 requests' attainment by
    # 2.5 points, more than the band is wide (1.67). At 60 requests (6 misses, the same 90 %)
    # the window is read, and its evidence of a shortfall steps the factor.
    assert CFG.band_requests == 60
    met = (5, 10)
    seen = tuple(DemandWindow(end_s=100.0 - 15.0 * i, requests=10, met=met) for i in range(3))
    state = PlanState(replicas=4, seen=seen[::-1], capacity_factor=1.5)
    small, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, ObservedSlo(met=36, requests=40))
    assert small.capacity_factor == pytest.approx(1.5)
    assert small.evidence == 0.0
    enough, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, ObservedSlo(met=54, requests=60))
    assert enough.capacity_factor > 1.5


def test_each_observation_moves_the_factor_once() -> None:
    # A window below the band steps the factor; the next decision, with no new first tokens,
    # sees the same window (it slides over 120 s) and must not step it again.
    state = PlanState(replicas=4, capacity_factor=1.5)
    state, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, ObservedSlo(met=92, requests=100))
    assert state.capacity_factor == pytest.approx(1.5 * (1.0 + CFG.feedback_up))
    again, _ = plan(state, 115.0, [load(1.0)], CAP, CFG, ObservedSlo(met=0, requests=0))
    assert again.capacity_factor == pytest.approx(state.capacity_factor)
    # New first tokens below the band are read.
    new = ObservedSlo(met=92, requests=100)
    later, _ = plan(state, 130.0, [load(1.0)], CAP, CFG, new)
    assert later.capacity_factor == pytest.approx(state.capacity_factor * (1.0 + CFG.feedback_up))


def test_the_fleet_that_served_an_interval_teaches_the_factor_through_a_start_up() -> None:
    # 4 replicas ready at both ends of the interval [60, 75), a scale-up asked at 50 s whose
    # replicas are not ready yet (start-up 60 s). The interval's requests met 50 %, which one
    # shared queue of 1 serves: the fleet that served them (4 ready) is worth 1 such replica.
    # Read at 77 s: no first token after the interval's end + the SLO (2 s) is met.
    met = (5, 10)
    seen = (DemandWindow(end_s=75.0, requests=10, met=met),)
    state = PlanState(replicas=6, seen=seen, last_scale_up_s=50.0, ready_log=((60.0, 4),))
    served = ObservedSlo(met=30, requests=60, by_arrival=((60.0, 30, 60),), ready=4)
    after, _ = plan(state, 77.0, [load(1.0)], CAP, CFG, served)
    assert after.capacity_factor == pytest.approx(4.0)
    # The same requests with the ready count changed within their interval (a replica came up
    # at its end) are not the fleet's: nothing is learnt while the start-up runs.
    grew = replace(served, ready=5)
    moved, _ = plan(state, 77.0, [load(1.0)], CAP, CFG, grew)
    assert moved.capacity_factor == pytest.approx(1.0)
    # The service decides anywhere in its bins: decisions at 57 s and 78 s bracket [60, 75).
    off_edges = replace(state, ready_log=((57.0, 4),))
    service, _ = plan(off_edges, 78.0, [load(1.0)], CAP, CFG, served)
    assert service.capacity_factor == pytest.approx(4.0)


def test_a_shortfall_within_the_slo_steps_a_learnt_factor_and_a_breach_re_estimates_it() -> None:
    # The same fleet and windows as above (worth 2 shared replicas: the estimate is 4 / 2).
    # 96 % is above the SLO target and below the band, but 4 misses in 100 requests are not
    # evidence enough of a shortfall to step (`PlanState.evidence`). 92 % is: a factor already
    # learnt takes the +5 % step only, for it is a breach within two standard errors of 100
    # requests (4.4 points) of the target (one window's noise re-estimating it held Mooncake at
    # 1.3x static; Mooncake's factor jumped 2.2 -> 3.4 on such bins). The queue model's own
    # factor (1.0, nothing learnt) and a breach beyond the noise (90 %) re-estimate it.
    met = (5, 10)
    seen = tuple(DemandWindow(end_s=100.0 - 15.0 * i, requests=10, met=met) for i in range(3))
    assert CFG.slo_target < 0.96 < CFG.band[0]

    def after(factor: float, attained: int) -> float:
        state = PlanState(replicas=4, seen=seen[::-1], capacity_factor=factor)
        obs = ObservedSlo(met=attained, requests=100)
        state, _ = plan(state, 100.0, [load(1.0)], CAP, CFG, obs)
        return state.capacity_factor

    assert after(1.5, 96) == pytest.approx(1.5)
    assert after(1.5, 92) == pytest.approx(1.5 * (1.0 + CFG.feedback_up))
    assert after(1.0, 96) == pytest.approx(1.0)
    assert after(1.0, 92) == pytest.approx(2.0)
    assert after(1.5, 90) == pytest.approx(2.0)


def test_saturated_replicas_floor_the_factor_with_what_they_served() -> None:
    # Two ready replicas, both behind the SLO at both ends of every interval, served 15 s of
    # prefill work in 30 replica-seconds: one replica is worth half a replayed one.
    state = PlanState(replicas=2, holding=True, held_base=2, backlog_s=20.0, saturated=2)
    busy = ObservedSlo(met=0, requests=0, backlog_s=20.0, ready=2, behind=2, served_s=15.0)
    factors = []
    t = 100.0
    for _ in range(CFG.saturated_min_samples):
        state, _ = plan(state, t, [load(0.1)], CAP, CFG, busy)
        factors.append(state.capacity_factor)
        t += CFG.interval_s
    # Fewer intervals than the minimum are not evidence; then the pooled ratio floors it.
    assert factors == [1.0] * (CFG.saturated_min_samples - 1) + [pytest.approx(2.0)]
    assert state.saturated == 2
    # A replica with a short queue (not every one busy) is no measurement, and ends the run.
    idle = replace(busy, behind=1)
    fresh = PlanState(replicas=2, holding=True, held_base=2, backlog_s=20.0, saturated=2)
    for _ in range(CFG.saturated_min_samples):
        fresh, _ = plan(fresh, t, [load(0.1)], CAP, CFG, idle)
        t += CFG.interval_s
    assert fresh.saturated_samples == ()
    assert fresh.saturated == 0
    # A surplus in the error budget releases the floor (a queue the band keeps short is not
    # a saturated one).
    surplus = replace(state, budget=((t - 60.0, 2_000, 2_000),), capacity_factor=1.0)
    after, _ = plan(surplus, t, [load(0.1)], CAP, CFG, busy)
    assert after.capacity_factor == pytest.approx(1.0)


def test_the_floor_is_released_once_its_answer_has_served_a_surplus() -> None:
    # Three saturated intervals measured 2.0 and left 3,000 misses in the hour's budget: the
    # hour never shows a surplus again. The requests that arrived a start-up after the last
    # saturated interval (its answer's replicas ready) all met the SLO: the floor is released,
    # whatever the hour's budget still holds.
    last_s = 1_000.0
    samples = tuple((last_s - CFG.interval_s * i, 30.0, 15.0) for i in range(3))[::-1]
    misses = (last_s - 30.0, 0, 3_000)
    state = PlanState(
        replicas=2, holding=True, held_base=2, saturated_samples=samples, capacity_factor=1.0
    )
    now_s = last_s + CFG.startup_s + 120.0
    answered = (last_s + CFG.startup_s + 60.0, 1_500, 1_500)
    after, _ = plan(replace(state, budget=(misses, answered)), now_s, [load(0.1)], CAP, CFG)
    assert after.capacity_factor == pytest.approx(1.0)
    # The same requests, arrived before the answer could serve them, do not release it.
    early = (last_s + CFG.startup_s - 1.0, 1_500, 1_500)
    held, _ = plan(replace(state, budget=(misses, early)), now_s, [load(0.1)], CAP, CFG)
    assert held.capacity_factor == pytest.approx(2.0)
    # Released for good: the next interval's 3,000 requests at 97 % (inside the band) leave
    # the requests since the answer without a surplus, and the floor stays released (judged
    # again on every tick, it came back: 2.0, decaying 1 % per interval). So many requests
    # below the band's middle are evidence of a shortfall: the factor takes one step.
    in_band = ObservedSlo(met=2_910, requests=3_000)
    kept, _ = plan(after, now_s + CFG.interval_s, [load(0.1)], CAP, CFG, in_band)
    assert kept.capacity_factor == pytest.approx(1.0 + CFG.feedback_up)
    # A new saturated interval moves the answer on: the hour's measurement floors it again.
    busy = ObservedSlo(met=0, requests=0, backlog_s=20.0, ready=2, behind=2, served_s=15.0)
    again, _ = plan(
        replace(kept, saturated=2), now_s + 2 * CFG.interval_s, [load(0.1)], CAP, CFG, busy
    )
    assert again.capacity_factor == pytest.approx(2.0)


def test_misses_are_blamed_on_the_fleet_ready_when_the_requests_arrived() -> None:
    # The last scale-up's replicas were ready at 160 s. The tick's first tokens are a burst's
    # backlog that arrived before then (all late) and requests that arrived after (all met).
    state = PlanState(replicas=8, holding=True, capacity_factor=1.2, last_scale_up_s=100.0)
    backlog_then_served = ObservedSlo(
        met=100, requests=400, by_arrival=((135.0, 0, 300), (165.0, 100, 100))
    )
    after, _ = plan(state, 180.0, [load(1.0)], CAP, CFG, backlog_then_served)
    # By arrival, the fleet as it is now served everything: neither the factor nor the held
    # count rises.
    assert after.capacity_factor == pytest.approx(1.2)
    assert after.raises == ()
    # The same first tokens filed at the decision's time read as the fleet's misses.
    lumped = ObservedSlo(met=100, requests=400)
    blamed, _ = plan(state, 180.0, [load(1.0)], CAP, CFG, lumped)
    assert blamed.capacity_factor > 1.2
    # The budget keeps every group, by arrival: 400 requests, 100 met.
    assert sum(x[2] for x in after.budget) == 400
    assert sum(x[1] for x in after.budget) == 100


def test_queues_that_are_behind_and_growing_panic_by_the_work_they_gained() -> None:
    # 3 ready replicas held at 3; the engines' queues hold 30 s of prefill work (10 s per
    # replica: a new arrival waits past the 2 s SLO), 15 s more than at the last decision,
    # read one interval before.
    state = PlanState(replicas=3, holding=True, held_base=3, backlog_s=15.0, backlog_at_s=85.0)
    behind = ObservedSlo(met=0, requests=0, backlog_s=30.0, ready=3)
    after, rec = plan(state, 100.0, [load(0.1)], CAP, CFG, behind)
    # The interval's gain is one replica's worth of work (15 s over 15 s): 3 + 1.
    assert rec.mode is PlannerMode.PANIC
    assert rec.replicas == 4
    assert after.backlog_s == 30.0
    assert after.panic_until_s == 100.0 + CFG.panic_hold_s
    # Draining (less than last time) or short (under the SLO per replica): no panic.
    for backlog_s in (10.0, 5.0):
        _, rec = plan(
            replace(state, backlog_s=40.0 if backlog_s == 10.0 else 0.0),
            100.0,
            [load(0.1)],
            CAP,
            CFG,
            ObservedSlo(met=0, requests=0, backlog_s=backlog_s, ready=3),
        )
        assert rec.mode is PlannerMode.FLOOR
        assert rec.replicas == 3
    # Without the gauges the rule is off, whatever the state remembers.
    _, rec = plan(state, 100.0, [load(0.1)], CAP, CFG, ObservedSlo(met=0, requests=0))
    assert rec.replicas == 3


def test_the_record_judges_each_window_against_the_forecast_made_a_lead_time_before() -> None:
    # A forecast of 2 replicas at t=0; the interval ending a lead time later brings a burst
    # that needs more: its error is the need minus 2, and the window joins the record.
    state, _ = plan(PlanState(replicas=2), 0.0, [load(1.0)], CAP, CFG)
    end = CFG.lead_s
    burst = arrivals(12.0, end - CFG.interval_s, end)
    state, rec = plan(state, end, [load(1.0)], CAP, CFG, arrivals=burst)
    assert rec.forecast_error == rec.observed_need - 1  # 1 req/s: the model asks for 1
    assert rec.observed_need >= 6
    assert state.windows[-1][0] == 1
    assert state.windows[-1][1].requests == len(burst)


def test_replay_serves_a_burst_as_it_came() -> None:
    # Six requests at once, 0.5 s each, 2 s budget: one replica serves the first four in time.
    burst = [(0.0, 5_000.0)] * 6
    w = replay_window(
        burst,
        count_from_s=0.0,
        end_s=15.0,
        slo_s=2.0,
        prefill_tokens_per_s=10_000.0,
        prefill_overhead_s=0.0,
        decode_step_s=0.0,
        max_replicas=10,
    )
    assert w.requests == 6
    assert w.met == (4, 6)  # two replicas serve all: the replay stops there
    assert w.met_at(5) == 6
    assert w.need(0.95) == 2
    assert w.need(0.5) == 1


def test_replay_counts_only_the_window_and_only_what_an_idle_replica_serves_in_time() -> None:
    warm = [(-1.0, 5_000.0)] * 4  # before the window: they occupy the replica, uncounted
    late = [(0.5, 30_000.0)]  # 3 s of prefill > 2 s budget: unattainable, uncounted
    now = [(0.5, 5_000.0)]
    w = replay_window(
        warm + late + now,
        count_from_s=0.0,
        end_s=15.0,
        slo_s=2.0,
        prefill_tokens_per_s=10_000.0,
        prefill_overhead_s=0.0,
        decode_step_s=0.0,
        max_replicas=10,
    )
    assert w.requests == 1
    # One replica: the warm-up queue (2 s) then the long prompt (3 s) delay it past the budget.
    assert w.met_at(1) == 0
    assert w.met_at(3) == 1
    empty = replay_window(
        [],
        count_from_s=0.0,
        end_s=15.0,
        slo_s=2.0,
        prefill_tokens_per_s=1.0,
        prefill_overhead_s=0.0,
        decode_step_s=0.0,
        max_replicas=3,
    )
    assert (empty.requests, empty.need(0.95), empty.met_at(2)) == (0, 0, 0)


@pytest.mark.parametrize(
    "kwargs",
    [{"follow_saving": 1.0}, {"panic_threshold": 0.5}, {"floor_window_s": 0.0}],
)
def test_bad_mode_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"must|need"):
        PlannerConfig(**kwargs)  # type: ignore[arg-type]
