"""The fleet planner's merge of every gateway's reports (review finding 4; review2 1, 2, 3, 6).

Two gateways that each route half of a fleet's traffic must, merged, give the planner exactly
what one gateway routing all of it gives: the same arrivals in its estimator, the same outcome
groups, and so the same recommendation. On main each router planned from its own half. The
watermark is the planner's (its own clock's): a gateway's clock ahead, a partly published bin,
a report counted twice or a gateway gone must not stall nor skew the merged view.
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
    MergeState,
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


class _Now:
    """The planner's own clock (epoch seconds), set by the test."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


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
    now = _Now()
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
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
        now.t = until + 0.5  # the reports reach the planner just after the bin
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
    now = _Now()
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
    alone = LoadEstimator()
    t = T0
    for k in range(8):
        until = T0 + (k + 1) * CFG.interval_s
        other = _Gateway("b")
        while (t := t + rnd.expovariate(20.0)) < until:
            (half if rnd.random() < 0.5 else other).arrivals.record("m", t, 1024)
        now.t = until + 0.5
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
    now = _Now(T0 + 30.5)
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
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
    # A gateway that stops reporting is waited for no longer than two bins (the planner's).
    for k in range(2, 5):
        now.t = T0 + 15 * (k + 1) + 0.5
        for e in a.report(T0 + 15 * k, T0 + 15 * (k + 1)):
            merge.apply(e)
        assert merge.as_of_s == (T0 + 30 if k == 2 else T0 + 15 * (k + 1))


def test_a_merge_restored_from_its_state_carries_on_identically() -> None:
    estimators = {"m": LoadEstimator()}
    now = _Now(T0 + 30.5)
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
    a, b = _Gateway("a"), _Gateway("b")
    a.arrivals.record("m", T0 + 1.0, 1024)
    a.outcomes.record("m", T0 + 1.0, True)
    b.arrivals.record("m", T0 + 20.0, 1024)
    for e in [*a.report(T0, T0 + 15), *b.report(T0 + 15, T0 + 30)]:
        merge.apply(e)
    restored = ObservationMerge(
        {"m": LoadEstimator.restore(estimators["m"].state())},
        CFG.interval_s,
        merge.state(),
        now_s=now,
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


def _two_gateways_at(
    now: _Now, until_s: float, *gateways: _Gateway, estimators: dict | None = None
) -> ObservationMerge:
    """A merge that has applied every gateway's bin ending at `until_s` (one arrival each)."""
    merge = ObservationMerge(estimators or {"m": LoadEstimator()}, CFG.interval_s, now_s=now)
    for gw in gateways:
        gw.arrivals.record("m", until_s - 5.0, 1024)
        for e in gw.report(until_s - CFG.interval_s, until_s):
            assert merge.apply(e)
    return merge


def test_a_gateway_clock_ahead_is_refused_and_never_stalls_the_planner() -> None:
    """Review2 1: one gateway's report two bins in the future marked every honest gateway dead
    and made the planner plan as of the future, then stall; it is refused and counted."""
    now = _Now(T0 + 30.5)
    a, b, ahead = _Gateway("a"), _Gateway("b"), _Gateway("ahead")
    merge = _two_gateways_at(now, T0 + 30, a, b)
    ahead.arrivals.record("m", T0 + 55.0, 1024)
    for e in ahead.report(T0 + 45, T0 + 60):
        assert not merge.apply(e)
    assert merge.refused == 1
    assert merge.as_of_s == T0 + 30
    assert "ahead" not in {g for g, _, _ in merge.state().applied}  # nor in the snapshot
    # The honest gateways' next bin moves the planner on, as if the skewed one never spoke.
    now.t = T0 + 45.5
    for gw in (a, b):
        for e in gw.report(T0 + 30, T0 + 45):
            merge.apply(e)
    assert merge.as_of_s == T0 + 45


def test_the_watermark_is_never_later_than_the_planners_clock() -> None:
    """A gateway less than a bin ahead is heard, but the planner does not plan past its own
    time: the arrivals after it wait."""
    now = _Now(T0 + 20.0)
    estimators = {"m": LoadEstimator()}
    a = _Gateway("a")
    # a's clock 10 s ahead: its bin "ended", an arrival at (its) T0+25 in it.
    merge = _two_gateways_at(now, T0 + 30, a, estimators=estimators)
    assert merge.refused == 0
    assert merge.as_of_s == T0 + 20
    assert estimators["m"].recent_arrivals(T0 + 60, 60) == []
    # The planner's own time passing releases it, with no further report.
    now.t = T0 + 30.0
    assert merge.release() == T0 + 30
    assert [t for t, _ in estimators["m"].recent_arrivals(T0 + 60, 60)] == [T0 + 25]


def test_a_partly_published_bin_holds_the_watermark_for_every_model() -> None:
    """Review2 2: a gateway's bin that reached the bus for one model only advanced the
    watermark for all of them; the other model's arrivals were released short."""
    now = _Now(T0 + 30.5)
    estimators = {"m": LoadEstimator(), "n": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
    a, b = _Gateway("a"), _Gateway("b")

    def events(gw: _Gateway, since: float, until: float) -> dict[str, PlanObservations]:
        return {
            e.model: e
            for _, e in observation_events(
                fleet="f", gateway=gw.name, models=("m", "n"), since_s=since, until_s=until,
                arrivals=gw.arrivals.take(until), outcomes={}, at=AT,
            )
        }  # fmt: skip

    for gw in (a, b):
        for e in events(gw, T0, T0 + 15).values():
            merge.apply(e)
    a.arrivals.record("n", T0 + 20.0, 1024)
    b.arrivals.record("n", T0 + 21.0, 1024)
    for e in events(a, T0 + 15, T0 + 30).values():
        merge.apply(e)
    b_bin = events(b, T0 + 15, T0 + 30)
    merge.apply(b_bin["m"])  # b's "n" event not (yet) published
    assert merge.as_of_s == T0 + 15
    assert estimators["n"].recent_arrivals(T0 + 30, 30) == []
    merge.apply(b_bin["n"])
    assert merge.as_of_s == T0 + 30
    assert [t for t, _ in estimators["n"].recent_arrivals(T0 + 30, 30)] == [T0 + 20, T0 + 21]


def test_a_report_applied_twice_is_counted_once() -> None:
    """Review2 3: a bin re-sent past the stream's duplicate window (or replayed) was merged
    again; the merge skips any bin no later than the last applied for its (gateway, model)."""
    now = _Now(T0 + 30.5)
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
    a = _Gateway("a")
    a.arrivals.record("m", T0 + 1.0, 1024)
    first = a.report(T0, T0 + 15)
    a.arrivals.record("m", T0 + 16.0, 1024)
    second = a.report(T0 + 15, T0 + 30)
    for e in [*first, *second, *first, *second]:
        merge.apply(e)
    assert merge.duplicates == 2
    assert [t for t, _ in estimators["m"].recent_arrivals(T0 + 30, 30)] == [T0 + 1, T0 + 16]
    # Restored from its snapshot, the merge still knows what it applied.
    restored = ObservationMerge(
        {"m": LoadEstimator.restore(estimators["m"].state())},
        CFG.interval_s,
        merge.state(),
        now_s=now,
    )
    assert not restored.apply(second[0])


def test_a_leaving_gateway_is_waited_for_no_more_and_its_last_arrivals_count() -> None:
    """Review2 6: a gateway's clean stop publishes its partial bin marked leaving; the planner
    stops waiting for it at once (it waited two bins), and its last arrivals are planned on."""
    now = _Now(T0 + 15.5)
    estimators = {"m": LoadEstimator()}
    a, b = _Gateway("a"), _Gateway("b")
    merge = _two_gateways_at(now, T0 + 15, a, b, estimators=estimators)
    b.arrivals.record("m", T0 + 17.0, 1024)
    now.t = T0 + 18.0
    for _, e in observation_events(
        fleet="f", gateway="b", models=("m",), since_s=T0 + 15, until_s=T0 + 18,
        arrivals=b.arrivals.take(T0 + 18), outcomes={}, at=AT, leaving=True,
    ):  # fmt: skip
        assert merge.apply(e)
    assert merge.as_of_s == T0 + 15  # a's bin to T0+30 not in yet
    now.t = T0 + 30.5
    a.arrivals.record("m", T0 + 20.0, 1024)
    for e in a.report(T0 + 15, T0 + 30):
        merge.apply(e)
    assert merge.as_of_s == T0 + 30  # b no longer waited for
    assert T0 + 17 in [t for t, _ in estimators["m"].recent_arrivals(T0 + 30, 30)]
    # The same name back (a restarted pod) is waited for again.
    b2 = _Gateway("b")
    now.t = T0 + 45.5
    for e in b2.report(T0 + 30, T0 + 45):
        merge.apply(e)
    assert merge.as_of_s == T0 + 30


def test_a_silent_gateway_is_forgotten_by_the_planners_clock() -> None:
    """Review2 1: no gateway was ever removed, and a lone silent one was waited for until some
    other reported two bins past it; now the planner's clock decides, and the snapshot drops it."""
    now = _Now(T0 + 15.5)
    a, b = _Gateway("a"), _Gateway("b")
    merge = _two_gateways_at(now, T0 + 15, a, b)
    now.t = T0 + 44.0
    for e in a.report(T0 + 15, T0 + 30):
        merge.apply(e)
    assert merge.as_of_s == T0 + 15  # b within two bins: waited for
    now.t = T0 + 45.5
    assert merge.as_of_s == T0 + 30  # b past two bins: no longer
    now.t = T0 + 15 * 60
    for e in a.report(T0 + 15 * 59, T0 + 15 * 60):
        merge.apply(e)
    assert {g for g, _, _ in merge.state().applied} == {"a"}


def test_a_leaving_report_re_sent_is_counted_once() -> None:
    now = _Now(T0 + 20.0)
    estimators = {"m": LoadEstimator()}
    merge = ObservationMerge(estimators, CFG.interval_s, now_s=now)
    (_, last), *_ = observation_events(
        fleet="f", gateway="a", models=("m",), since_s=T0, until_s=T0 + 18,
        arrivals={"m": [(T0 + 3.0, 1024)]}, outcomes={}, at=AT, leaving=True,
    )  # fmt: skip
    assert merge.apply(last)
    assert not merge.apply(last)
    assert merge.duplicates == 1


def test_a_restored_state_of_a_model_no_longer_planned_is_dropped_not_raised() -> None:
    # review2 finding 5: a store written while the router planned "x" restored by one planning
    # "m" only: releasing x's pending arrivals raised KeyError outside `ready`, and the planning
    # loop died.
    state = MergeState(
        pending=(("x", ((T0 + 1, 100),)), ("m", ((T0 + 2, 50),))),
        outcomes=(("x", ((T0, 1, 1),)),),
        applied=(("gw", "m", T0 + 15), ("gw", "x", T0 + 15)),
    )
    m = LoadEstimator()
    merge = ObservationMerge({"m": m}, 15.0, state, now_s=lambda: T0 + 16)
    assert merge.release() == T0 + 15
    assert m.state().arrivals == ((T0 + 2, 50),)
    assert merge.take_outcomes() == {}
    after = merge.state()
    assert after.pending == ()
    assert after.applied == (("gw", "m", T0 + 15),)
