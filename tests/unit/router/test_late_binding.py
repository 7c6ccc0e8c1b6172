"""Late binding: the simulator's router-side queue and the `LateBinding` policy."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from seedance.router.core.policy import (
    Decision,
    Forecast,
    HoldingPolicy,
    HoldOrder,
    LateBinding,
    LeastOutstanding,
    Reason,
    ReplicaState,
    RoundRobin,
    RouteRequest,
    can_take_now,
)
from seedance.router.sim import ReplicaParams, TraceRequest, simulate
from tests.unit.router.test_sim import HAND, req, synthetic

# HAND with a 100-token prefill iteration, so one 100-token prompt fills a replica's next one.
SMALL_ITER = ReplicaParams(
    **{f: getattr(HAND, f) for f in HAND.__slots__ if f != "max_prefill_tokens_per_iter"},
    max_prefill_tokens_per_iter=100,
)


def late(inner=None, order: HoldOrder = HoldOrder.FCFS) -> LateBinding:
    return LateBinding(
        inner or LeastOutstanding(),
        prefill_tokens_per_iter=SMALL_ITER.max_prefill_tokens_per_iter,
        order=order,
    )


def st(rid: str, *, waiting=0, running=0, tokens_waiting=0, kv=0) -> ReplicaState:
    return ReplicaState(
        replica_id=rid,
        waiting=waiting,
        running=running,
        prefill_tokens_waiting=tokens_waiting,
        prefill_tokens_in_progress=0,
        kv_used_tokens=kv,
        kv_capacity_tokens=1000,
    )


# --- policy --------------------------------------------------------------------------------


def test_can_take_now_counts_the_next_prefill_iteration() -> None:
    r = RouteRequest(prompt_tokens=300)
    assert can_take_now(r, st("a", running=50, kv=1000), 100)  # nothing waiting: bind
    assert can_take_now(r, st("a", waiting=2, tokens_waiting=700), 1000)  # 700 + 300 fits
    assert not can_take_now(r, st("a", waiting=2, tokens_waiting=701), 1000)


def test_late_binding_is_a_holding_policy_and_baselines_are_not() -> None:
    assert isinstance(late(), HoldingPolicy)
    assert not isinstance(LeastOutstanding(), HoldingPolicy)


def test_release_holds_when_no_replica_can_take_and_maps_subset_indices() -> None:
    pol = late()
    r = RouteRequest(prompt_tokens=100)
    full = st("a", waiting=1, tokens_waiting=100)
    assert pol.release(r, [full, full], None, 0.0) is None
    # Only "c" can take it, though "b" has fewer outstanding: the index is into the full list.
    states = [full, st("b", waiting=1, tokens_waiting=100), st("c", running=9)]
    d = pol.release(r, states, None, 0.0)
    assert d is not None
    assert d.replica_index == 2
    # Bind-now callers get the inner policy's choice over all replicas instead of None.
    assert pol.choose(r, [full, st("b", waiting=1, tokens_waiting=100, running=5)], None, 0.0) == (
        Decision(replica_index=0, reason=Reason.LEAST_OUTSTANDING)
    )


def test_hold_key_orders_fcfs_or_by_prompt() -> None:
    short, long_ = RouteRequest(prompt_tokens=10), RouteRequest(prompt_tokens=5000)
    fcfs = late()
    assert fcfs.hold_key(long_, 1.0) < fcfs.hold_key(short, 2.0)
    spf = late(order=HoldOrder.SHORTEST_PROMPT)
    assert spf.hold_key(short, 2.0) < spf.hold_key(long_, 1.0)


def test_rejects_empty_prefill_iteration() -> None:
    with pytest.raises(ValueError, match="prefill_tokens_per_iter"):
        LateBinding(RoundRobin(), prefill_tokens_per_iter=0)


# --- simulator -----------------------------------------------------------------------------


def _kv_blocked_fleet() -> list[TraceRequest]:
    # x0 fills replica 0's pool (100 + 900) until ~10.1 s; x1 fills replica 1's (100 + 850)
    # until ~9.5 s. y and z then wait for KV on replicas 0 and 1; w arrives when both queues hold
    # a full (100-token) prefill iteration.
    return [
        req(0.0, 100, 900),
        req(0.0, 100, 850),
        req(1.0, 100, 5),
        req(1.5, 100, 5),
        req(2.0, 100, 5),
    ]


def test_held_request_goes_to_the_replica_that_frees_first() -> None:
    trace = _kv_blocked_fleet()
    early = simulate(trace, LeastOutstanding(), 2, SMALL_ITER)
    held = simulate(trace, late(), 2, SMALL_ITER)
    # Early binding: ties go to replica 0, which frees last.
    assert early.replica_of[4] == 0
    assert held.replica_of[4] == 1
    assert held.hold_s[4] > 7.0
    assert held.ttft_s[4] < early.ttft_s[4] - 0.3
    # Time held is part of TTFT; requests that found room were not held.
    assert held.ttft_s[4] == pytest.approx(held.hold_s[4] + 0.2)  # + its own 0.2 s prefill
    assert held.hold_s[:4] == (0.0, 0.0, 0.0, 0.0)
    assert early.hold_s == (0.0,) * 5


def test_shortest_prompt_first_overtakes_in_the_router_queue() -> None:
    base = _kv_blocked_fleet()
    trace = [*base[:4], req(2.0, 90, 5), req(2.5, 60, 5)]

    # Both are held; the 60-token prompt arrived last.
    def first_token_at(res) -> list[float]:
        return [t.arrival_s + ttft for t, ttft in zip(trace, res.ttft_s, strict=True)]

    fcfs = first_token_at(simulate(trace, late(), 2, SMALL_ITER))
    spf = first_token_at(simulate(trace, late(order=HoldOrder.SHORTEST_PROMPT), 2, SMALL_ITER))
    assert fcfs[4] < fcfs[5]
    assert spf[5] < spf[4]


class _NeverRelease:
    name = "never"

    def hold_key(self, request: RouteRequest, now_s: float) -> float:
        return now_s

    def release(
        self,
        request: RouteRequest,
        replicas: Sequence[ReplicaState],
        forecast: Forecast | None,
        now_s: float,
    ) -> Decision | None:
        return None

    def choose(self, *args: object) -> Decision:
        raise AssertionError("a holding policy is offered requests through release()")


def test_a_policy_that_never_releases_is_an_error_not_a_silent_drop() -> None:
    with pytest.raises(RuntimeError, match="still holds 1 requests"):
        simulate([req(0.0, 10, 2)], _NeverRelease(), 1, HAND)


@pytest.mark.parametrize("order", list(HoldOrder))
def test_late_binding_serves_everything_within_kv(order: HoldOrder) -> None:
    trace = synthetic(600, seed=4, rate=40.0)
    res = simulate(trace, late(order=order), 3, SMALL_ITER)
    assert res.max_kv_used_frac <= 1.0
    assert sum(res.hold_s) > 0  # the load is high enough that the router held some
    for ttft, e2e, hold in zip(res.ttft_s, res.e2e_s, res.hold_s, strict=True):
        assert not math.isnan(e2e)
        assert hold < ttft <= e2e
