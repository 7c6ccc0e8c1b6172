"""The router's one wire-to-core mapping: every wire field is either set from the router's facts
or named in `LEFT_UNSET` with its reason, so a field added to an event fails here until
`mapping.py` decides what to do with it."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from seedance.events import Event
from seedance.events.codec import encode
from seedance.events.routing import (
    ReplicaRecommendation,
    ReplicaStats,
    RoutingDecision,
    RoutingWeights,
)
from seedance.router.core.planning.planner import (
    Binding,
    LoadForecast,
    PlannerConfig,
    PlanReason,
    Recommendation,
)
from seedance.router.core.weight_table import WeightTable
from seedance.router.gateway import Candidate, RoutedRequest
from seedance.router.mapping import (
    LEFT_UNSET,
    UNBOUNDED_KV_TOKENS,
    decision_event,
    recommendation_event,
    replica_state,
    stats_event,
    table_forecast,
    weights_event,
)

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
# Every value differs from its field's default, so "set" and "left at the default" differ.
TABLE = WeightTable(
    model="echo",
    made_at_s=1_800_000_000.5,
    model_id="requests-g3-abc",
    weights={"a": 0.25, "b": 0.75},
    qps_5s={"a": 2.0},
    qps_30s={"a": 1.5, "b": 0.5},
)


def _events() -> list[Event]:
    routed = RoutedRequest(
        model="echo",
        replica="a",
        reason="predicted_slo",
        request_id="req-1",
        attempt=2,
        alternatives=("b", "c"),
        at_s=12.5,
    )
    loads = [
        LoadForecast(
            horizon_s=h,
            arrivals_per_s=rate,
            prompt_tokens_mean=100.0,
            prompt_tokens_sq_mean=10_000.0,
            kv_used_tokens=1_000.0,
        )
        for h, rate in ((0.0, 3.0), (75.0, 4.5))
    ]
    rec = Recommendation(
        replicas=4, needed=5, reason=PlanReason.SCALE_UP, binding=Binding.KV, horizon_s=75.0
    )
    return [
        decision_event(routed, at=AT),
        weights_event(TABLE, at=AT),
        stats_event(
            model="echo",
            replica="a",
            window_s=10.0,
            requests=7,
            outstanding=3,
            durations_s=[0.1, 0.3, 0.2],
            at=AT,
        ),
        recommendation_event(
            rec,
            model="echo",
            replica_set="default.echo",
            current=2,
            cfg=PlannerConfig(),
            loads=loads,
            at=AT,
        ),
    ]


def test_every_event_kind_is_mapped() -> None:
    assert (
        {type(e) for e in _events()}
        == set(LEFT_UNSET)
        == {
            RoutingDecision,
            RoutingWeights,
            ReplicaStats,
            ReplicaRecommendation,
        }
    )


@pytest.mark.parametrize("event", _events(), ids=lambda e: type(e).__name__)
def test_every_wire_field_is_carried_or_left_unset_with_a_reason(event: Event) -> None:
    unset = LEFT_UNSET[type(event)]
    assert all(reason.strip() for reason in unset.values())
    for field in msgspec.structs.fields(event):
        value = getattr(event, field.name)
        if field.default_factory is not msgspec.NODEFAULT:
            default = field.default_factory()
        else:
            default = field.default
        if field.name in unset:
            assert value == default, f"{field.name} is listed as unset but carries {value!r}"
        else:
            assert field.required or value != default, f"{field.name} is neither set nor refused"
    # What the builders make is valid on the wire (the event library's constraints hold).
    assert msgspec.json.decode(encode(event), type=type(event)) == event


def test_events_carry_the_router_facts() -> None:
    decision, weights, stats, rec = _events()
    assert isinstance(decision, RoutingDecision)
    assert (decision.at, decision.replica, decision.alternatives) == (AT, "a", ["b", "c"])
    assert isinstance(weights, RoutingWeights)
    assert (weights.reason, weights.forecast_at) == ("forecast:requests-g3-abc", TABLE.made_at_s)
    assert isinstance(stats, ReplicaStats)
    assert stats.p95_latency_ms == pytest.approx(300.0)  # inverted CDF: an observed duration
    assert isinstance(rec, ReplicaRecommendation)
    assert (rec.replicas, rec.needed, rec.current, rec.reason, rec.binding) == (
        4,
        5,
        2,
        "scale_up",
        "kv",
    )
    assert rec.forecast_arrivals_per_s == 4.5  # the largest load the decision covers


def test_stats_without_answers_have_no_latency() -> None:
    stats = stats_event(
        model="echo", replica="a", window_s=10.0, requests=1, outstanding=1, durations_s=[], at=AT
    )
    assert stats.p95_latency_ms is None


def test_policy_views_of_a_candidate_and_a_table() -> None:
    state = replica_state(
        Candidate(name="a", address="a:1", outstanding=4, outstanding_for_model=1)
    )
    assert (state.replica_id, state.running, state.outstanding) == ("a", 4, 4)
    assert state.kv_capacity_tokens == UNBOUNDED_KV_TOKENS
    forecast = table_forecast(TABLE)
    assert forecast.made_at_s == TABLE.made_at_s
    assert set(forecast.replicas) == {"a", "b"}
    assert forecast.replicas["a"].qps_5s == 2.0
    assert forecast.replicas["b"].qps_5s == 0.0  # missing from qps_5s: no forecast arrivals
    assert forecast.replicas["b"].qps_30s == 0.5
