"""The replay with a changing fleet, the reactive scalers, the load estimator, the replica set."""

from __future__ import annotations

import itertools

import pytest

from seedance.bench.autoscale import start_count
from seedance.bench.router_sim import ReplicaParams, TraceRequest, simulate
from seedance.bench.router_sim.autoscale import HpaScaler, KpaScaler, OracleScaler, PlannerScaler
from seedance.bench.router_sim.interfaces import FleetObservation, Scaler
from seedance.router.core.planning.load import LoadEstimator, LoadEstimatorConfig
from seedance.router.core.planning.planner import PlannerConfig, ReplicaCapacity
from seedance.router.core.planning.replica_set import ReplicaMember, ReplicaSet
from seedance.router.core.policy import LeastOutstanding, ReplicaState

HAND = ReplicaParams(
    prefill_tokens_per_s=1000.0,
    prefill_overhead_s=0.1,
    decode_base_s=0.01,
    decode_per_seq_s=0.001,
    decode_per_ctx_token_s=0.0,
    kv_capacity_tokens=1000,
    kv_bytes_per_token=1,
    max_num_seqs=8,
    max_prefill_tokens_per_iter=4096,
)


def req(t: float, prompt: int = 100, out: int = 2) -> TraceRequest:
    return TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=out)


class Scripted(Scaler):
    """Wants counts[k] at its k-th tick; records what it saw."""

    def __init__(self, counts: list[int], tick_s: float = 1.0) -> None:
        self.counts = counts
        self._tick_s = tick_s
        self.seen: list[FleetObservation] = []

    @property
    def tick_s(self) -> float:
        return self._tick_s

    def desired(self, obs: FleetObservation) -> int:
        self.seen.append(obs)
        k = len(self.seen) - 1
        return self.counts[min(k, len(self.counts) - 1)]


def test_a_new_replica_is_billed_from_the_request_and_routed_after_start_up() -> None:
    trace = [req(0.5), *(req(t) for t in (3.5, 3.6, 3.7, 10.0))]
    sc = Scripted([2], tick_s=1.0)
    res = simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc, startup_s=2.0)
    # Asked for at t=1, ready at t=3: the t >= 3.5 requests can land on it.
    assert set(res.replica_of[1:]) == {0, 1}
    assert res.replica_of[0] == 0
    assert sc.seen[1].starting == 1
    assert len(sc.seen[1].ready) == 1
    assert len(sc.seen[3].ready) == 2
    end_s = max(r.arrival_s + e for r, e in zip(trace, res.e2e_s, strict=True))
    assert res.replica_seconds == pytest.approx(end_s + (end_s - 1.0))
    assert res.fleet_timeline[0] == (1.0, 2)


def test_start_ups_follow_the_given_sequence_one_per_started_replica() -> None:
    trace = [req(t) for t in (0.5, 2.5, 2.6, 6.5, 6.6, 6.7)]
    sc = Scripted([3], tick_s=1.0)
    # Two replicas asked for at t=1: the first takes 1 s, the second 5 s.
    simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc, startup_s=(1.0, 5.0))
    ready = [len(o.ready) for o in sc.seen]
    assert ready[1] == 2  # t=2: the 1-s one is ready
    assert ready[4] == 2  # t=5: the 5-s one is not yet
    assert ready[5] == 3  # t=6: it is
    with pytest.raises(ValueError, match="startup_s"):
        simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc, startup_s=())
    with pytest.raises(ValueError, match="startup_s"):
        simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc, startup_s=(1.0, -1.0))


def test_removal_cancels_starting_replicas_first_then_drains_ready_ones() -> None:
    trace = [req(0.1, out=50), req(5.0)]
    sc = Scripted([3, 1], tick_s=1.0)
    res = simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc, startup_s=10.0)
    # Two started at t=1 and cancelled at t=2: one second each.
    assert len(sc.seen[1].ready) == 1
    assert sc.seen[1].starting == 2
    assert sc.seen[2].starting == 0
    end_s = 5.0 + res.e2e_s[1]
    assert res.replica_seconds == pytest.approx(end_s + 2 * 1.0)


def test_a_drained_replica_finishes_its_requests_and_is_billed_until_empty() -> None:
    # Both replicas get a long request; dropping to one drains the less loaded one.
    trace = [req(0.0, out=200), req(0.01, out=400), req(3.0)]
    sc = Scripted([1], tick_s=1.0)
    res = simulate(trace, LeastOutstanding(), 2, HAND, scaler=sc)
    assert not any(t != t for t in res.e2e_s)  # nothing lost (no NaN)
    ends = [r.arrival_s + e for r, e in zip(trace, res.e2e_s, strict=True)]
    # Ties drain the newest replica (r1, holding the 400-token request); r0 takes the rest.
    assert res.replica_of == (0, 1, 0)
    drained_end, total_end = ends[1], max(ends)
    assert res.replica_seconds == pytest.approx(drained_end + total_end, rel=1e-6)


def test_a_draining_replica_is_taken_back_before_a_new_one_starts() -> None:
    trace = [req(0.0, out=300), req(0.01, out=300), req(2.5)]
    sc = Scripted([1, 2], tick_s=1.0)
    res = simulate(trace, LeastOutstanding(), 2, HAND, scaler=sc, startup_s=100.0)
    assert sc.seen[1].draining == 1
    assert len(sc.seen[2].ready) == 2 if len(sc.seen) > 2 else True
    assert max(res.replica_of) == 1  # no third replica was ever started and routed to


def test_holding_policies_and_scalers_do_not_mix() -> None:
    from seedance.router.core.policy import LateBinding

    with pytest.raises(ValueError, match="holding"):
        simulate(
            [req(0.0)],
            LateBinding(LeastOutstanding(), prefill_tokens_per_iter=10),
            1,
            HAND,
            scaler=Scripted([1]),
        )


def _obs(now: float, kv_fracs: list[float], conc: list[int], starting: int = 0) -> FleetObservation:
    return FleetObservation(
        now_s=now,
        ready=tuple(
            ReplicaState(
                replica_id=f"r{i}",
                waiting=0,
                running=c,
                prefill_tokens_waiting=0,
                prefill_tokens_in_progress=0,
                kv_used_tokens=int(f * 1000),
                kv_capacity_tokens=1000,
            )
            for i, (f, c) in enumerate(zip(kv_fracs, conc, strict=True))
        ),
        starting=starting,
        draining=0,
        arrivals=(),
        finished=0,
        finished_output_tokens=0,
        kv_used_tokens=0,
    )


def test_hpa_scales_on_utilisation_with_tolerance_and_a_stabilised_scale_down() -> None:
    hpa = HpaScaler(0.5)
    assert hpa.desired(_obs(0.0, [0.9, 0.9], [1, 1])) == 4  # ceil(2 x 0.9 / 0.5)
    assert hpa.desired(_obs(15.0, [0.52, 0.52, 0.52, 0.52], [1] * 4)) == 4  # within 10 %
    # Low now, but 60 s of stabilisation keeps the highest recommendation of the window.
    assert hpa.desired(_obs(30.0, [0.1] * 4, [1] * 4)) == 4
    assert hpa.desired(_obs(100.0, [0.1] * 4, [1] * 4)) == 1


def test_kpa_panics_on_a_burst_and_holds_then_scales_down_at_most_by_half() -> None:
    kpa = KpaScaler(10.0)
    assert kpa.desired(_obs(0.0, [0.0], [10])) == 1
    # 60 in flight on one replica: 6x the target -> panic, scale to ceil(panic mean / target).
    n = kpa.desired(_obs(2.0, [0.0], [60]))
    assert n >= 4
    # Load gone, but in panic it never scales down.
    assert kpa.desired(_obs(4.0, [0.0] * n, [0] * n)) == n
    later = kpa.desired(_obs(200.0, [0.0] * 8, [0] * 8))
    assert later == 4  # halves at most per tick


def test_the_estimator_is_causal_and_its_margin_comes_from_its_own_errors() -> None:
    est = LoadEstimator(LoadEstimatorConfig(level_window_s=10.0, moments_window_s=60.0))
    for k in range(100):
        est.observe_arrival(k * 0.1, 100 + (k % 2) * 100)
    (f,) = est.forecast(10.0, (0.0,))
    assert f.arrivals_per_s == pytest.approx(10.0, rel=0.02)
    assert f.prompt_tokens_mean == pytest.approx(150.0)
    assert est.margin_per_s(5.0) == 0.0
    est.forecast(10.0, (5.0,))
    # The rate doubles; the forecast made at t=10 for t=15 comes due and was wrong.
    for k in range(100):
        est.observe_arrival(10.0 + k * 0.05, 100)
    est.forecast(15.0, (5.0,))
    assert est.margin_per_s(5.0) > 0.0


def test_planner_and_oracle_scalers_replay_and_scale_up_under_load() -> None:
    trace = [req(t * 0.05, prompt=50, out=5) for t in range(4000)]  # 20/s for 200 s
    cap = ReplicaCapacity(
        prefill_tokens_per_s=1000.0,
        prefill_overhead_s=0.1,
        decode_step_s=0.01,
        kv_capacity_tokens=1000,
    )
    cfg = PlannerConfig(interval_s=5.0, startup_s=10.0, max_replicas=20)
    for scaler in (PlannerScaler(cfg, cap, 1), OracleScaler(trace, cfg, cap, 1)):
        res = simulate(trace, LeastOutstanding(), 1, HAND, scaler=scaler, startup_s=10.0)
        assert max(n for _, n in res.fleet_timeline) >= 3  # 20/s x 0.15 s = 3 replicas of load


def test_replica_set_routes_to_its_first_members_and_keeps_join_order() -> None:
    rs = ReplicaSet.of({"a": "h:1", "b": "h:2", "c": "h:3"})
    assert [m.name for m in rs.routable()] == ["a", "b", "c"]
    two = rs.with_target(2)
    change = two.changes(["a", "b", "c"])
    assert change.remove == ("c",)
    assert change.add == ()
    back = rs.with_target(3).changes(["a", "b"])
    assert back.add == (ReplicaMember(name="c", address="h:3"),)
    assert rs.with_target(3).changes(["a", "b", "c"]).empty
    found = two.with_members(
        [ReplicaMember(name="d", address="h:4"), ReplicaMember(name="b", address="h:2")]
    )
    assert [m.name for m in found.members] == ["b", "d"]
    assert found.target == 2
    with pytest.raises(ValueError, match="repeat"):
        ReplicaSet(members=(ReplicaMember(name="a", address="x:1"),) * 2)
    with pytest.raises(ValueError, match=">= 1"):
        rs.with_target(0)


def test_the_margin_is_the_quantile_of_the_forecasts_own_errors() -> None:
    est = LoadEstimator(
        LoadEstimatorConfig(level_window_s=10.0, moments_window_s=60.0, margin_quantile=0.9)
    )
    # Twenty forecasts at 10 s ahead, each then wrong by k requests per second (k = 1..20):
    # the level at 10 s is 1 req/s, at the due time 1 + k.
    t = 0.0
    for k in range(1, 21):
        for j in range(10):
            est.observe_arrival(t + j, 100)
        est.forecast(t + 10.0, (10.0,))
        for j in range(10 * (1 + k)):
            est.observe_arrival(t + 10.0 + j / (1 + k), 100)
        est.forecast(t + 20.0, ())
        t += 20.0
    # The 90th percentile of errors 1..20 is the 18th.
    assert est.margin_per_s(10.0) == pytest.approx(18.0, abs=1.0)
    with pytest.raises(ValueError, match="margin_quantile"):
        LoadEstimatorConfig(margin_quantile=0.0)


def test_recent_arrivals_are_the_window_in_order() -> None:
    est = LoadEstimator()
    for t in (1.0, 2.0, 3.0, 4.0):
        est.observe_arrival(t, int(t * 10))
    assert est.recent_arrivals(4.0, 2.5) == [(2.0, 20.0), (3.0, 30.0)]


def test_an_unmeasured_forecast_is_padded_with_the_long_rate() -> None:
    est = LoadEstimator(LoadEstimatorConfig(level_window_s=10.0, moments_window_s=100.0))
    for k in range(50):
        est.observe_arrival(k * 0.2, 100)  # 5/s for 10 s, then silence
    (now, ahead) = est.forecast(60.0, (0.0, 30.0))
    assert now.arrivals_per_s == 0.0  # the trailing 10 s are empty
    # No error at 30 s has come due yet: the margin is the rate over the last 100 s (50 / 60 s).
    assert ahead.arrivals_per_s == pytest.approx(50 / 60.0)


def test_the_bench_starts_scaling_policies_from_the_first_windows_demand() -> None:
    # The starting fleet is what the first minute's arrivals needed on one shared queue, not
    # the static count (hindsight over the whole trace): a trace that is quiet for its first
    # minute and busy after starts from 1, and the same minute busy starts from more.
    cap = ReplicaCapacity(
        prefill_tokens_per_s=10_000.0,
        prefill_overhead_s=0.0,
        decode_step_s=0.0,
        kv_capacity_tokens=100_000,
    )
    cfg = PlannerConfig(startup_s=60.0, max_replicas=64)

    def req(t: float) -> TraceRequest:
        return TraceRequest(arrival_s=t, prompt_tokens=5_000, output_tokens=10)

    quiet_then_busy = [req(float(t)) for t in range(0, 60, 10)] + [
        req(60.0 + k * 0.05) for k in range(2000)
    ]
    assert start_count(quiet_then_busy, cap, cfg) == 1
    busy = [req(k * 0.05) for k in range(2000)]
    assert start_count(busy, cap, cfg) >= 10  # 20 req/s x 0.5 s = 10 replicas offered


def test_the_decode_counter_counts_one_token_per_running_sequence_per_step() -> None:
    """`FleetObservation.decoded_tokens_total` is a server's decode-token counter (the KV
    proxies write it): it moves at every tick while sequences decode, within a run of decode
    steps and not only at its end, and ends at every output less its first token (the
    prefill's)."""
    # Six decoding together, and one late request of a single token (ticks run to arrivals).
    trace = [req(0.0, prompt=50, out=20 + 5 * i) for i in range(6)] + [req(3.0, out=1)]
    sc = Scripted([1], tick_s=0.05)
    res = simulate(trace, LeastOutstanding(), 1, HAND, scaler=sc)
    seen = [(o.now_s, o.decoded_tokens_total) for o in sc.seen]
    all_decoding_s = max(res.ttft_s[:6])  # the six arrived at 0: their last first token
    last_finish_s = max(res.e2e_s[:6])  # of the six (arrived at 0)
    decoding = [
        (a, b)
        for a, b in itertools.pairwise(seen)
        if all_decoding_s + 0.05 < a[0] and b[0] < last_finish_s - 0.05
    ]
    assert len(decoding) >= 5
    assert all(b[1] > a[1] for a, b in decoding)
    assert all(b[1] >= a[1] for a, b in itertools.pairwise(seen))
    assert max(total for _, total in seen) <= sum(r.output_tokens - 1 for r in trace)
    done = [total for now, total in seen if now >= last_finish_s]
    assert done
    assert done[-1] == sum(r.output_tokens - 1 for r in trace)
