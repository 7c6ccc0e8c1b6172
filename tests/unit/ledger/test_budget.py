"""Budget guard: plan, forecast from burn rate, alert and pause decisions."""

from __future__ import annotations

import pytest

from seedance.cost_ledger.core import Budget, SpendPoint, evaluate_budget
from seedance.cost_ledger.core.budget import plan_usd_micro, spend_points
from seedance.cost_ledger.core.lines import Amounts, CostLine
from seedance.cost_ledger.core.mapping import alert_to_bus

H = 3_600_000
DAY = 24 * H


def budget(**kw) -> Budget:
    base = {
        "tenant": "acme",
        "period_start_ms": 0,
        "period_end_ms": 10 * H,
        "amount_usd_micro": 100_000_000,
    }
    base.update(kw)
    return Budget(**base)


def steady(rate_usd_micro_per_h: int, hours: int) -> list[SpendPoint]:
    return [
        SpendPoint(at_ms=h * H, spend_usd_micro=rate_usd_micro_per_h * h)
        for h in range(1, hours + 1)
    ]


def test_linear_plan():
    b = budget()
    assert plan_usd_micro(b, 0) == 0
    assert plan_usd_micro(b, 5 * H) == 50_000_000
    assert plan_usd_micro(b, 20 * H) == 100_000_000


def test_stated_schedule_plan():
    # spend 20 % in the first half, the rest in the second
    b = budget(schedule=((5 * H, 200_000), (10 * H, 1_000_000)))
    assert plan_usd_micro(b, 5 * H) == 20_000_000
    assert plan_usd_micro(b, 7 * H + H // 2) == 60_000_000


def test_on_plan_spend_is_ok():
    d = evaluate_budget(budget(), steady(10_000_000, 4), 4 * H)
    assert d.status == "ok"
    assert d.forecast_usd_micro == 100_000_000
    assert d.alert is None
    assert d.pause is None


def test_overspend_forecast_alerts_and_pauses():
    # burning $11/h for 4 h forecasts $110 against $100: +10 % > 5 %
    d = evaluate_budget(budget(), steady(11_000_000, 4), 4 * H)
    assert d.status == "over"
    assert d.deviation_ppm == 100_000
    assert d.alert is not None
    assert d.alert.direction == "over"
    assert d.pause is not None
    assert d.pause.tenant == "acme"
    assert d.pause.alert_id == d.alert.alert_id
    assert "+10.0 %" in d.alert.reason


def test_just_inside_the_threshold_does_not_pause():
    d = evaluate_budget(budget(), steady(10_400_000, 4), 4 * H)  # +4 %
    assert d.status == "ok"
    assert d.pause is None


def test_underspend_alerts_without_pausing():
    d = evaluate_budget(budget(), steady(8_000_000, 4), 4 * H)
    assert d.status == "under"
    assert d.alert is not None
    assert d.pause is None


def test_forecast_follows_the_recent_burn_not_the_average():
    # $5/h for 5 h, then $20/h for the last hour: the one-hour lookback sees $20/h
    points = [*steady(5_000_000, 5), SpendPoint(at_ms=6 * H, spend_usd_micro=45_000_000)]
    d = evaluate_budget(budget(), points, 6 * H)
    assert d.forecast_usd_micro == 45_000_000 + 4 * 20_000_000
    assert d.status == "over"


def test_threshold_is_configurable_and_validated():
    d = evaluate_budget(budget(threshold_ppm=150_000), steady(11_000_000, 4), 4 * H)
    assert d.status == "ok"
    with pytest.raises(ValueError, match="amount_usd_micro = 0"):
        budget(amount_usd_micro=0)
    with pytest.raises(ValueError, match="period_end_ms"):
        budget(period_end_ms=0)
    with pytest.raises(ValueError, match="schedule point"):
        budget(schedule=((5 * H, 900_000), (6 * H, 100_000)))


def test_before_the_period_nothing_is_decided():
    d = evaluate_budget(budget(period_start_ms=DAY, period_end_ms=2 * DAY), [], 0)
    assert d.status == "not_started"
    assert d.alert is None


def test_spend_points_from_entries():
    def entry(tenant, end, micro):
        return CostLine(
            entry_id=f"{tenant}{end}",
            kind="usage",
            revision=0,
            tenant=tenant,
            job_id="j",
            node="n",
            gpu_model="X",
            pricing_tier="on_demand",
            window_start_ms=end - H,
            window_end_ms=end,
            amounts=Amounts(cost_usd_micro=micro),
            activity_ppm=None,
            source_event_ids=(),
        )

    points = spend_points(
        [entry("acme", H, 5), entry("beta", H, 7), entry("acme", 2 * H, 3), entry("acme", H, 1)],
        budget(),
    )
    assert points == [
        SpendPoint(at_ms=H, spend_usd_micro=6),
        SpendPoint(at_ms=2 * H, spend_usd_micro=9),
    ]


def test_an_under_and_an_over_verdict_at_one_instant_are_two_alerts():
    # No spend yet forecasts 0 ("under"); the placement settled at the same event time brings
    # "over". Their ids (the bus's Nats-Msg-Id) must differ, or the stream drops the "over".
    under = evaluate_budget(budget(), [], 4 * H)
    over = evaluate_budget(budget(), steady(11_000_000, 4), 4 * H)
    assert (under.status, over.status) == ("under", "over")
    assert under.alert is not None
    assert over.alert is not None
    assert under.alert.alert_id != over.alert.alert_id
    assert alert_to_bus(under.alert, seq=1).event.id != alert_to_bus(over.alert, seq=1).event.id
