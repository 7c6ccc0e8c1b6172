"""Budgets and the guard: plan, forecast, and the decision to alert and pause a tenant.

Owns the budget model (a tenant's amount for a period, spread linearly or by a stated
schedule), the forecast of spend to the period's end from the recent burn rate, and the guard
decision: when the forecast deviates from the budget by more than the threshold (default 5 %)
it yields a ``BudgetDeviation``; when the deviation is an overspend it also yields a
``PauseDecision`` that the slicer honours for that tenant's new work (``mapping`` publishes
them as the bus's ``BudgetAlert`` and ``PauseRequest``; the core's names say what they are,
not what they are sent as). Must not publish, read a clock or keep state: the adapter passes
the spend history and ``now_ms`` in.

Forecast: ``spend(now) + burn × (end − now)`` with ``burn = (spend(now) − spend(now − L)) / L``
over the lookback ``L`` (default one hour); before a full lookback has passed, the burn is
measured from the period's start. Spend between points is a step function (the last point at or
before an instant), because spend only moves when the ledger closes a window.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Literal

import msgspec

from seedance.cost_ledger.core.lines import CostLine

__all__ = [
    "Budget",
    "BudgetDecision",
    "BudgetDeviation",
    "PauseDecision",
    "SpendPoint",
    "evaluate_budget",
    "plan_usd_micro",
    "spend_points",
]

PPM = 1_000_000


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's budget for ``[period_start_ms, period_end_ms)``.

    ``schedule`` states the plan as (instant, cumulative share of the budget in ppm) points,
    interpolated linearly between them, starting from (period_start, 0); empty means a linear
    spread over the whole period.
    """

    tenant: str
    period_start_ms: int
    period_end_ms: int
    amount_usd_micro: int
    schedule: tuple[tuple[int, int], ...] = ()
    threshold_ppm: int = 50_000
    lookback_ms: int = 3_600_000

    def __post_init__(self) -> None:
        if self.period_end_ms <= self.period_start_ms:
            raise ValueError(
                f"Budget.period_end_ms = {self.period_end_ms!r} must be after "
                f"period_start_ms = {self.period_start_ms!r}"
            )
        if self.amount_usd_micro <= 0:
            raise ValueError(f"Budget.amount_usd_micro = {self.amount_usd_micro!r} must be > 0")
        if self.threshold_ppm < 0:
            raise ValueError(f"Budget.threshold_ppm = {self.threshold_ppm!r} must be >= 0")
        last_t, last_share = self.period_start_ms, 0
        for t, share in self.schedule:
            if not (last_t < t <= self.period_end_ms and last_share <= share <= PPM):
                raise ValueError(
                    f"Budget.schedule point {(t, share)!r} must be inside the period, after the "
                    "previous point, with a non-decreasing share <= 1,000,000 ppm"
                )
            last_t, last_share = t, share


class SpendPoint(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The tenant's cumulative spend in the period at an instant (micro-USD)."""

    at_ms: int
    spend_usd_micro: int


class BudgetDeviation(msgspec.Struct, frozen=True, kw_only=True, tag="budget_alert"):
    """Forecast spend deviates from the budget by more than the threshold."""

    alert_id: str
    tenant: str
    at_ms: int
    period_start_ms: int
    period_end_ms: int
    budget_usd_micro: int
    plan_to_date_usd_micro: int
    spend_to_date_usd_micro: int
    forecast_usd_micro: int
    deviation_ppm: int
    direction: Literal["over", "under"]
    reason: str


class PauseDecision(msgspec.Struct, frozen=True, kw_only=True, tag="pause_request"):
    """Ask the slicer to admit no new work for ``tenant`` (running work continues)."""

    request_id: str
    tenant: str
    at_ms: int
    reason: str
    alert_id: str


class BudgetDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The guard's verdict at ``at_ms``; ``alert`` and ``pause`` are None when within plan."""

    tenant: str
    at_ms: int
    status: Literal["ok", "over", "under", "not_started", "ended"]
    plan_to_date_usd_micro: int
    spend_to_date_usd_micro: int
    forecast_usd_micro: int
    deviation_ppm: int
    alert: BudgetDeviation | None = None
    pause: PauseDecision | None = None


def plan_usd_micro(budget: Budget, at_ms: int) -> int:
    """Planned cumulative spend at ``at_ms`` (rounded half to even)."""
    t = min(max(at_ms, budget.period_start_ms), budget.period_end_ms)
    points = [(budget.period_start_ms, 0), *budget.schedule]
    if points[-1][0] < budget.period_end_ms:
        points.append((budget.period_end_ms, PPM if not budget.schedule else points[-1][1]))
    share = Fraction(points[-1][1], PPM)
    for (t0, s0), (t1, s1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            share = Fraction(s0, PPM) + Fraction(s1 - s0, PPM) * Fraction(t - t0, t1 - t0)
            break
    return round(budget.amount_usd_micro * share)


def _spend_at(points: Sequence[SpendPoint], t: int) -> int:
    spend = 0
    for p in points:
        if p.at_ms > t:
            break
        spend = p.spend_usd_micro
    return spend


def evaluate_budget(budget: Budget, points: Iterable[SpendPoint], now_ms: int) -> BudgetDecision:
    """Plan vs forecast for the tenant at ``now_ms`` and, past the threshold, alert/pause."""
    history = sorted(
        (p for p in points if budget.period_start_ms <= p.at_ms <= now_ms),
        key=lambda p: p.at_ms,
    )
    spend = _spend_at(history, now_ms)
    plan_now = plan_usd_micro(budget, now_ms)
    if now_ms <= budget.period_start_ms:
        return BudgetDecision(
            tenant=budget.tenant,
            at_ms=now_ms,
            status="not_started",
            plan_to_date_usd_micro=0,
            spend_to_date_usd_micro=0,
            forecast_usd_micro=0,
            deviation_ppm=0,
        )
    horizon = min(now_ms, budget.period_end_ms)
    since = max(budget.period_start_ms, horizon - budget.lookback_ms)
    elapsed = horizon - since
    # Before a full lookback has passed, ``since`` is the period start and spend there is 0.
    burn = Fraction(
        spend - _spend_at(history, since) if since > budget.period_start_ms else spend, elapsed
    )
    forecast = round(spend + burn * (budget.period_end_ms - horizon))
    deviation = Fraction(forecast - budget.amount_usd_micro, budget.amount_usd_micro)
    deviation_ppm = round(deviation * PPM)
    status: Literal["ok", "over", "under", "ended"] = "ok"
    if deviation_ppm > budget.threshold_ppm:
        status = "over"
    elif deviation_ppm < -budget.threshold_ppm and now_ms < budget.period_end_ms:
        status = "under"
    elif now_ms >= budget.period_end_ms:
        status = "ended"
    alert = pause = None
    if status in ("over", "under"):
        # The verdict is part of the id: a first "under" (no spend yet) and the "over" that the
        # next input brings at the same event time are two alerts, and one id for both had the
        # stream drop the "over" as a duplicate of the "under".
        alert_id = f"budget:{budget.tenant}:{budget.period_start_ms}:{now_ms}:{status}"
        reason = (
            f"forecast {forecast / 1e6:.2f} USD is {deviation_ppm / 1e4:+.1f} % against the "
            f"budget {budget.amount_usd_micro / 1e6:.2f} USD (threshold "
            f"{budget.threshold_ppm / 1e4:.1f} %)"
        )
        alert = BudgetDeviation(
            alert_id=alert_id,
            tenant=budget.tenant,
            at_ms=now_ms,
            period_start_ms=budget.period_start_ms,
            period_end_ms=budget.period_end_ms,
            budget_usd_micro=budget.amount_usd_micro,
            plan_to_date_usd_micro=plan_now,
            spend_to_date_usd_micro=spend,
            forecast_usd_micro=forecast,
            deviation_ppm=deviation_ppm,
            direction=status,
            reason=reason,
        )
        if status == "over":
            pause = PauseDecision(
                request_id=f"pause:{budget.tenant}:{budget.period_start_ms}:{now_ms}",
                tenant=budget.tenant,
                at_ms=now_ms,
                reason=reason,
                alert_id=alert_id,
            )
    return BudgetDecision(
        tenant=budget.tenant,
        at_ms=now_ms,
        status=status,
        plan_to_date_usd_micro=plan_now,
        spend_to_date_usd_micro=spend,
        forecast_usd_micro=forecast,
        deviation_ppm=deviation_ppm,
        alert=alert,
        pause=pause,
    )


def spend_points(entries: Iterable[CostLine], budget: Budget) -> list[SpendPoint]:
    """Cumulative spend of the budget's tenant at each window end, from cost entries."""
    by_end: dict[int, int] = {}
    for e in entries:
        if e.kind != "usage" or e.tenant != budget.tenant:
            continue
        end = e.window_end_ms
        if budget.period_start_ms < end <= budget.period_end_ms:
            by_end[end] = by_end.get(end, 0) + e.amounts.total_usd_micro
    out, running = [], 0
    for end in sorted(by_end):
        running += by_end[end]
        out.append(SpendPoint(at_ms=end, spend_usd_micro=running))
    return out
