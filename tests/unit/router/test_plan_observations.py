"""The fleet planner's merge of every gateway's reports (review finding 4).

Two gateways that each route half of a fleet's traffic must, merged, give the planner exactly
what one gateway routing all of it gives: the same arrivals in its estimator, the same outcome
groups, and so the same recommendation. On main each router planned from its own half.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from seedance.events import decode, encode
from seedance.events.routing import PlanObservations
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import PlannerConfig, PlanState, ReplicaCapacity, plan
from seedance.router.plan_observations import (
    ArrivalLog,
    ObservationMerge,
    bin_end_s,
    observation_events,
)
from seedance.router.planner_feed import OutcomesByArrival, observed_slo

CFG = PlannerConfig()
CAP = ReplicaCapacity(
    prefill_tokens_per_s=7000,
    prefill_overhead_s=0.02,
    decode_step_s=0.028,
    kv_capacity_tokens=180_000,
)
T0 = 1_767_225_600.0  # a bin edge
AT = datetime(2026, 1, 1, tzinfo=UTC)


class _Gateway:
    """One gateway's request path (arrivals, outcomes by arrival) and its reports."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrivals = ArrivalLog()
        self.outcomes = OutcomesByArrival(CFG.interval_s)

    def report(self, since_s: float, until_s: float) -> list[PlanObservations]:
        events = observation_events(
            fleet="f",
            gateway=self.name,
            models=("m",),
            since_s=since_s,
            until_s=until_s,
            arrivals=self.arrivals.take(until_s),
            outcomes=self.outcomes.take(),
            at=AT,
        )
        # Through the wire format, as the planner receives them.
        return [decode(encode(e), PlanObservations) for _, e in events]


def _run(gateways: list[_Gateway], intervals: int, seed: int = 3) -> list[tuple[int, float]]:
    """20 req/s over the fleet, spread over `gateways` at random; the planner merges their
    reports each bin and plans. Returns (replicas, capacity factor) per decision."""
    rnd = random.Random(seed)
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s)
    state = PlanState(replicas=1)
    out = []
    t = T0
    for k in range(intervals):
        since, until = T0 + k * CFG.interval_s, T0 + (k + 1) * CFG.interval_s
        while (t := t + rnd.expovariate(20.0)) < until:
            gw = gateways[rnd.randrange(len(gateways))]
            gw.arrivals.record("m", t, 1024)
            # A third of them miss the SLO: the factor has something to learn.
            gw.outcomes.record("m", t, rnd.random() > 0.3)
        for gw in reversed(gateways):  # reports arrive in any order
            for event in gw.report(since, until):
                merge.apply(event)
        assert merge.as_of_s == until
        est = estimators["m"]
        obs = observed_slo(
            "m",
            merge.take_outcomes().get("m", ()),
            gauges={},
            ready=[],
            capacity=CAP,
            prompt_tokens=1024,
            slo_s=CFG.ttft_slo_s,
        )
        state, rec = plan(
            state,
            until,
            est.forecast(until, (0.0, CFG.lead_s)),
            CAP,
            CFG,
            obs,
            est.recent_arrivals(until, CFG.arrivals_window_s),
        )
        out.append((rec.replicas, state.capacity_factor))
    return out


def test_two_gateways_merged_plan_as_one_gateway_with_all_the_traffic() -> None:
    one = _run([_Gateway("solo")], 40)
    two = _run([_Gateway("a"), _Gateway("b")], 40)
    assert two == one
    # Not a trivial equality: the plan moved with the demand.
    assert max(r for r, _ in one) > 1


def test_a_half_of_the_traffic_plans_fewer_replicas_than_the_merge() -> None:
    """What main did: each router planned from its own half. The merge must not."""
    half = _Gateway("a")
    rnd = random.Random(5)
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s)
    alone = LoadEstimator()
    t = T0
    for k in range(8):
        until = T0 + (k + 1) * CFG.interval_s
        other = _Gateway("b")
        while (t := t + rnd.expovariate(20.0)) < until:
            (half if rnd.random() < 0.5 else other).arrivals.record("m", t, 1024)
        for gw in (half, other):
            for event in gw.report(until - CFG.interval_s, until):
                merge.apply(event)
                if gw is half:
                    alone.observe_arrivals(list(event.arrivals))
    now = T0 + 8 * CFG.interval_s
    merged_rate = estimators["m"].forecast(now, (0.0,))[0].arrivals_per_s
    half_rate = alone.forecast(now, (0.0,))[0].arrivals_per_s
    assert merged_rate == pytest.approx(2 * half_rate, rel=0.2)


def test_the_planner_waits_for_a_gateway_one_bin_behind() -> None:
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s)
    a, b = _Gateway("a"), _Gateway("b")
    b.arrivals.record("m", T0 + 1.0, 1024)
    for e in b.report(T0, T0 + 15):
        merge.apply(e)
    a.arrivals.record("m", T0 + 2.0, 1024)
    a.arrivals.record("m", T0 + 16.0, 1024)
    for e in [*a.report(T0, T0 + 15), *a.report(T0 + 15, T0 + 30)]:
        merge.apply(e)
    # b has reported up to T0+15 only: a's arrival at T0+16 waits for it.
    assert merge.as_of_s == T0 + 15
    assert [t for t, _ in estimators["m"].recent_arrivals(T0 + 60, 60)] == [T0 + 1, T0 + 2]
    for e in b.report(T0 + 15, T0 + 30):
        merge.apply(e)
    assert merge.as_of_s == T0 + 30
    assert len(estimators["m"].recent_arrivals(T0 + 60, 60)) == 3
    # A gateway that stops reporting is waited for no longer than two bins.
    for k in range(2, 5):
        for e in a.report(T0 + 15 * k, T0 + 15 * (k + 1)):
            merge.apply(e)
    assert merge.as_of_s == T0 + 75


def test_a_merge_restored_from_its_state_carries_on_identically() -> None:
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s)
    a, b = _Gateway("a"), _Gateway("b")
    a.arrivals.record("m", T0 + 1.0, 1024)
    a.outcomes.record("m", T0 + 1.0, True)
    b.arrivals.record("m", T0 + 20.0, 1024)
    for e in [*a.report(T0, T0 + 15), *b.report(T0 + 15, T0 + 30)]:
        merge.apply(e)
    restored = ObservationMerge(
        {"m": LoadEstimator.restore(estimators["m"].state())}, CFG.interval_s, merge.state()
    )
    assert restored.state() == merge.state()
    assert restored.as_of_s == merge.as_of_s
    assert restored.take_outcomes() == merge.take_outcomes() == {"m": ((T0, 1, 1),)}


def test_report_ids_are_stable_per_bin() -> None:
    """A re-sent bin carries the same id (Nats-Msg-Id): the stream drops the duplicate."""

    def ids() -> list[str]:
        return [
            e.id
            for _, e in observation_events(
                fleet="f",
                gateway="a",
                models=("m", "n"),
                since_s=T0,
                until_s=T0 + 15,
                arrivals={},
                outcomes={},
                at=AT,
            )
        ]

    assert ids() == ids()
    assert len(set(ids())) == 2
    assert bin_end_s(T0 + 0.5, 15.0) == T0 + 15
