"""A gateway's per-bin report too large for one message (review2 finding 5). The planner's
state, which used to be one message too (finding 4), is a store now: `test_plan_state.py`.

At ~25 bytes an arrival, one model at ~2700 req/s fills the server's 1 MiB per 15 s bin. On
main such a report failed as if the bus were away: kept and retried at the head of the queue,
it held every later bin of that gateway back until dropped 8 bins later (the planner then took
the busiest gateway for dead). Now a report is split into parts that fit, the planner merges
them into the same view, and a payload refusal is permanent for its messages: dropped, counted,
the next bins published.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from datetime import UTC, datetime
from typing import Any

import nats.errors

from seedance.events import encode
from seedance.events.routing import PlanObservations
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.plan_leader import FleetPlanner
from seedance.router.plan_observations import (
    ObservationMerge,
    observation_events,
    split_to_fit,
)
from seedance.router.planner_feed import OutcomesByArrival

T0 = 1_767_225_600.0  # a bin edge
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _report(arrivals: list[tuple[float, int]]) -> PlanObservations:
    ((_, event),) = observation_events(
        fleet="f",
        gateway="gw",
        models=("m",),
        since_s=T0,
        until_s=T0 + 15,
        arrivals={"m": arrivals},
        outcomes={"m": ((T0, 3, 4),)},
        at=AT,
    )
    return event


def _arrivals(n: int, seed: int = 1) -> list[tuple[float, int]]:
    rnd = random.Random(seed)
    return sorted((T0 + rnd.random() * 15, rnd.randrange(50, 4000)) for _ in range(n))


def test_a_report_over_the_limit_is_split_into_parts_that_fit_and_lose_nothing() -> None:
    event = _report(_arrivals(5000))
    limit = len(encode(event)) // 5
    parts = split_to_fit("f", event, limit)
    assert len(parts) >= 5
    assert all(len(encode(p)) <= limit for p in parts)
    assert [a for p in parts for a in p.arrivals] == event.arrivals
    # Consecutive parts of the bin, each arrival inside its part; the outcomes in the last.
    assert parts[0].since_s == event.since_s
    assert parts[-1].until_s == event.until_s
    for before, after in itertools.pairwise(parts):
        assert before.until_s == after.since_s
    for p in parts:
        assert all(p.since_s <= t < p.until_s for t, _ in p.arrivals)
    assert [o for p in parts for o in p.outcomes] == event.outcomes == parts[-1].outcomes
    # Distinct ids, the same on a retry (duplicates to the stream), the last the bin's own.
    assert len({p.id for p in parts}) == len(parts)
    assert [p.id for p in split_to_fit("f", event, limit)] == [p.id for p in parts]
    assert parts[-1].id == event.id
    assert split_to_fit("f", event, len(encode(event))) == [event]


def test_the_planner_merges_the_parts_into_the_same_view_as_the_whole_report() -> None:
    arrivals = _arrivals(4000, seed=2)
    whole, split = {"m": LoadEstimator()}, {"m": LoadEstimator()}
    clock = lambda: T0 + 15.5  # noqa: E731 - the leader's clock, just past the bin's end
    one = ObservationMerge(whole, 15.0, now_s=clock)
    one.apply(_report(arrivals))
    merge = ObservationMerge(split, 15.0, now_s=clock)
    parts = split_to_fit("f", _report(arrivals), len(encode(_report(arrivals))) // 3)
    assert len(parts) > 1
    for p in parts:
        merge.apply(p)
    assert merge.as_of_s == one.as_of_s == T0 + 15
    one.release(), merge.release()
    now = T0 + 15
    assert len(whole["m"].recent_arrivals(now, 60)) == len(arrivals)
    assert split["m"].recent_arrivals(now, 60) == whole["m"].recent_arrivals(now, 60)
    assert split["m"].forecast(now, (0.0, 60.0)) == whole["m"].forecast(now, (0.0, 60.0))


def test_arrivals_at_one_instant_past_the_limit_cannot_be_split() -> None:
    event = _report([(T0 + 1, 1024)] * 3000)
    assert split_to_fit("f", event, len(encode(event)) // 2) == []


class _Nc:
    max_payload = 1 << 20


class _Bus:
    """Refuses a batch holding a report over `refuse_over` arrivals as the client does."""

    def __init__(self, refuse_over: int) -> None:
        self.nc = _Nc()
        self.refuse_over = refuse_over
        self.published: list[PlanObservations] = []

    async def publish_many(self, items: list[tuple[str, Any]]) -> list[Any]:
        if any(len(e.arrivals) > self.refuse_over for _, e in items):
            raise nats.errors.MaxPayloadError
        self.published += [e for _, e in items]
        return []


class _Clock:
    def now(self) -> datetime:
        return AT


def test_a_payload_refusal_drops_that_report_counted_and_the_next_bins_go_out() -> None:
    dropped: list[tuple[str, int]] = []
    fleet = FleetPlanner(
        fleet="f",
        gateway="gw",
        models=("m", "n"),
        bin_s=15.0,
        clock=_Clock(),  # type: ignore[arg-type]
        now_s=lambda: T0,
        outcomes=OutcomesByArrival(15.0),
        plans={},
        estimators={},
        on_dropped=lambda reason, n: dropped.append((reason, n)),
    )
    bus = _Bus(refuse_over=100)
    fleet._bus = bus  # type: ignore[assignment]
    for t, _ in _arrivals(200):  # the first bin: a report the (stand-in) server refuses
        fleet.arrivals.record("m", t, 1024)
    asyncio.run(fleet.report(T0 + 15.01))
    assert dropped == [("too_large", 2)]  # the bin's reports, both models'
    fleet.arrivals.record("m", T0 + 16, 1024)
    asyncio.run(fleet.report(T0 + 30.01))
    assert [(e.model, e.until_s, len(e.arrivals)) for e in bus.published] == [
        ("m", T0 + 30, 1),
        ("n", T0 + 30, 0),
    ]
