"""Each policy's choice on constructed replica states, and the forecast fallback."""

from __future__ import annotations

import random

from seedance.router.core.policy import (
    Forecast,
    LeastOutstanding,
    PowerOfTwoChoices,
    PredictiveConfig,
    PredictiveSloPolicy,
    PrefixIndex,
    Reason,
    ReplicaForecast,
    ReplicaState,
    RoundRobin,
    RouteRequest,
)

CAP = 100_000
CFG = PredictiveConfig(prefill_tokens_per_s=5000.0, prefill_overhead_s=0.02, decode_step_s=0.03)
REQ = RouteRequest(prompt_tokens=1000)


def st(rid: str, *, waiting=0, running=0, tokens_waiting=0, in_progress=0, kv=0) -> ReplicaState:
    return ReplicaState(
        replica_id=rid,
        waiting=waiting,
        running=running,
        prefill_tokens_waiting=tokens_waiting,
        prefill_tokens_in_progress=in_progress,
        kv_used_tokens=kv,
        kv_capacity_tokens=CAP,
    )


def fresh(states, now=10.0, kv5=None) -> Forecast:
    return Forecast(
        made_at_s=now - 1.0,
        replicas={
            s.replica_id: ReplicaForecast(
                qps_5s=1.0,
                qps_30s=1.0,
                kv_used_tokens_5s=float(s.kv_used_tokens if kv5 is None else kv5[s.replica_id]),
                kv_used_tokens_30s=float(s.kv_used_tokens),
            )
            for s in states
        },
    )


def test_round_robin_cycles() -> None:
    rr = RoundRobin()
    states = [st("a"), st("b"), st("c")]
    picks = [rr.choose(REQ, states, None, 0.0).replica_index for _ in range(5)]
    assert picks == [0, 1, 2, 0, 1]


def test_least_outstanding_picks_fewest_in_flight() -> None:
    states = [st("a", waiting=2, running=3), st("b", running=4), st("c", waiting=1, running=5)]
    d = LeastOutstanding().choose(REQ, states, None, 0.0)
    assert (d.replica_index, d.reason) == (1, Reason.LEAST_OUTSTANDING)


def test_power_of_two_picks_less_loaded_of_its_sample() -> None:
    states = [st("a", running=9), st("b", running=1)]
    pol = PowerOfTwoChoices(random.Random(0))
    assert {pol.choose(REQ, states, None, 0.0).replica_index for _ in range(20)} == {1}


def test_power_of_two_never_picks_the_worst_of_three() -> None:
    states = [st("a", running=1), st("b", running=50), st("c", running=2)]
    pol = PowerOfTwoChoices(random.Random(1))
    picks = {pol.choose(REQ, states, None, 0.0).replica_index for _ in range(200)}
    assert picks == {0, 2}


def test_predictive_prefers_less_queued_prefill_work_over_fewer_requests() -> None:
    # "a" has 1 request waiting with a 30k-token prompt; "b" has 6 decoding, nothing queued.
    # Least-outstanding picks "a"; the TTFT prediction sees 6 s of prefill ahead there.
    states = [st("a", waiting=1, tokens_waiting=30_000), st("b", running=6, kv=10_000)]
    assert LeastOutstanding().choose(REQ, states, None, 10.0).replica_index == 0
    d = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states), 10.0)
    assert d.replica_index == 1
    assert d.reason == Reason.PREDICTED_SLO
    assert d.predicted_ttft_s is not None
    assert abs(d.predicted_ttft_s - (1000 / 5000 + 0.02)) < 1e-9


def test_predictive_avoids_replica_without_kv_headroom() -> None:
    # "a" is fastest to prefill but its pool is nearly full; "b" has some queue but room.
    states = [st("a", kv=98_000), st("b", waiting=1, tokens_waiting=2_000, kv=20_000)]
    d = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states), 10.0)
    assert (d.replica_index, d.reason) == (1, Reason.KV_HEADROOM)


def test_predictive_uses_kv_forecast() -> None:
    # Same state now, but the forecast says "a" will be full in 5 s.
    states = [st("a", kv=50_000), st("b", waiting=1, tokens_waiting=500, kv=50_000)]
    kv5 = {"a": 99_000, "b": 50_000}
    d = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states, kv5=kv5), 10.0)
    assert (d.replica_index, d.reason) == (1, Reason.KV_HEADROOM)
    d_flat = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states), 10.0)
    assert d_flat.replica_index == 0


def test_predictive_breaks_near_ties_by_decode_load() -> None:
    # Predicted TTFTs 0.22 s vs 0.32 s are within the 0.2 s tie band; "b" decodes far less.
    states = [st("a", running=40, kv=40_000), st("b", waiting=1, tokens_waiting=500, kv=1_000)]
    d = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states), 10.0)
    assert d.replica_index == 1
    assert d.reason == Reason.PREDICTED_SLO


def test_fallback_on_stale_forecast_matches_least_outstanding() -> None:
    states = [st("a", waiting=1, tokens_waiting=30_000), st("b", running=6)]
    stale = fresh(states, now=0.0)  # made at -1 s, now is 10 s: 11 s old > 5 s limit
    d = PredictiveSloPolicy(CFG).choose(REQ, states, stale, 10.0)
    assert d.reason == Reason.FALLBACK_STALE_FORECAST
    assert d.replica_index == LeastOutstanding().choose(REQ, states, None, 10.0).replica_index


def test_fallback_on_missing_forecast() -> None:
    states = [st("a", running=3), st("b", running=1)]
    d = PredictiveSloPolicy(CFG).choose(REQ, states, None, 10.0)
    assert (d.replica_index, d.reason) == (1, Reason.FALLBACK_NO_FORECAST)


def test_every_replica_at_risk_still_routes_to_least_bad() -> None:
    states = [st("a", kv=99_500), st("b", kv=99_900)]
    d = PredictiveSloPolicy(CFG).choose(REQ, states, fresh(states), 10.0)
    assert d.replica_index == 0
    assert d.predicted_ttft_s is not None


def test_prefix_index_matches_leading_blocks_per_replica() -> None:
    idx = PrefixIndex()
    idx.record("a", (1, 2, 3), capacity_blocks=10)
    idx.record("b", (1, 9), capacity_blocks=10)
    assert idx.matched_blocks((1, 2, 3, 4), ["a", "b", "c"]) == [3, 1, 0]
    # A gap stops the match: block 3 after a miss on 5 does not count.
    assert idx.matched_blocks((1, 5, 3), ["a", "b"]) == [1, 1]


def test_prefix_index_evicts_least_recently_used() -> None:
    idx = PrefixIndex()
    idx.record("a", (1, 2), capacity_blocks=3)
    idx.record("a", (1, 7), capacity_blocks=3)  # touches 1; 2 is now the oldest
    idx.record("a", (8,), capacity_blocks=3)
    assert idx.matched_blocks((1, 2), ["a"]) == [1]
    assert idx.matched_blocks((1, 7), ["a"]) == [2]


def test_predictive_routes_to_replica_holding_the_prefix() -> None:
    pol = PredictiveSloPolicy(CFG)
    long_prompt = RouteRequest(prompt_tokens=20 * 512, prefix_hashes=tuple(range(20)))
    states = [st("a"), st("b"), st("c")]
    first = pol.choose(long_prompt, states, fresh(states), 10.0).replica_index
    # Now the other two replicas are idle and the first has a little queued work; the cached
    # 10k tokens (2 s of prefill) outweigh 0.4 s of queue.
    loaded = [
        st(s.replica_id, waiting=1, tokens_waiting=2_000) if i == first else s
        for i, s in enumerate(states)
    ]
    d = pol.choose(long_prompt, loaded, fresh(loaded), 11.0)
    assert d.replica_index == first
    assert d.predicted_ttft_s is not None
    assert d.predicted_ttft_s < long_prompt.prompt_tokens / 5000
    # Without prefix IDs the same state sends it elsewhere.
    plain = RouteRequest(prompt_tokens=20 * 512)
    assert (
        PredictiveSloPolicy(CFG).choose(plain, loaded, fresh(loaded), 11.0).replica_index != first
    )
