"""The flow-model KV head (`kv_flow`): causal, fitted on the past only, and skilled on a server
whose mechanics it models (a FIFO queue in front of a capped batch)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from seedance.router.core.forecast import (
    KvFlowParams,
    RequestLog,
    ServerCounts,
    choose_change_weight,
    expected_kv_change_tokens,
    fit_kv_flow_params,
    forecast_kv_mib,
    kv_pool_bound,
    output_survival,
)

from .request_log_kit import perturb_the_unobservable

SLOTS = 32
STEP_S = 0.02
PREFILL_S = 0.01
MIB_PER_TOKEN = 0.125


def _server(seed: int, *, n: int = 3_000, span_s: float = 150.0) -> RequestLog:
    """A FIFO server: SLOTS sequences at once, STEP_S per token, PREFILL_S to the first token.

    The load swells and ebbs (a queue forms, drains, forms) and the output length depends on
    the prompt (short prompts get short answers), as in the conversation trace.
    """
    rng = np.random.default_rng(seed)
    rate = 25.0 + 15.0 * np.sin(np.linspace(0.0, 6.0 * math.pi, n))
    arrival = np.cumsum(rng.exponential(1.0 / rate))
    arrival *= span_s / arrival[-1]
    ctx = np.exp(rng.normal(6.5, 1.0, n)).round().clip(10, 8_000)
    gen = np.where(ctx < 500, rng.integers(5, 40, n), rng.integers(40, 120, n)).astype(float)
    free = np.zeros(SLOTS)
    admit, first, finish = np.empty(n), np.empty(n), np.empty(n)
    for i in range(n):
        k = int(np.argmin(free))
        admit[i] = max(free[k], arrival[i])
        first[i] = admit[i] + PREFILL_S
        finish[i] = first[i] + (gen[i] - 1.0) * STEP_S
        free[k] = finish[i]
    return RequestLog(
        arrival_s=arrival,
        context_tokens=ctx,
        admit_s=admit,
        first_token_s=first,
        finish_s=finish,
        generated_tokens=gen,
    )


def _kv_mib(log: RequestLog, at_s: np.ndarray, *, reserves: bool) -> np.ndarray:
    out = np.empty(len(at_s))
    for i, x in enumerate(at_s):
        run = (log.admit_s <= x) & (log.finish_s > x)
        if reserves:
            held = log.context_tokens[run] + log.generated_tokens[run]
        else:
            dec = np.where(
                x >= log.first_token_s[run], 1.0 + (x - log.first_token_s[run]) / STEP_S, 0.0
            )
            held = log.context_tokens[run] + np.minimum(dec, log.generated_tokens[run])
        out[i] = MIB_PER_TOKEN * float(held.sum())
    return out


def _counts(log: RequestLog, at_s: float) -> ServerCounts:
    known = log.arrival_s <= at_s
    running = known & (log.admit_s <= at_s) & (log.finish_s > at_s)
    return ServerCounts(
        running=int(running.sum()), queued=int((known & (log.admit_s > at_s)).sum())
    )


PARAMS = KvFlowParams(max_batch=SLOTS, reserves_output=True, mib_per_token=MIB_PER_TOKEN)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("reserves", [True, False])
def test_a_forecast_at_t_ignores_later_arrivals_and_in_flight_outputs_and_finishes(
    seed: int, reserves: bool
) -> None:
    log = _server(seed)
    now_s = 62.0 + seed  # inside a swell: a queue has formed
    other = perturb_the_unobservable(log, now_s, seed)
    n = int((log.arrival_s <= now_s).sum())
    assert not np.array_equal(log.generated_tokens[:n], other.generated_tokens[:n])  # has teeth
    assert not np.array_equal(log.finish_s[:n], other.finish_s[:n])
    params = replace(PARAMS, reserves_output=reserves)
    counts = _counts(log, now_s)
    for h in (5.0, 30.0):
        a = forecast_kv_mib(
            log.observable_at(now_s), params, kv_now_mib=1e4, horizon_s=h, counts=counts
        )
        b = forecast_kv_mib(
            other.observable_at(now_s), params, kv_now_mib=1e4, horizon_s=h, counts=counts
        )
        assert a == b
    # It does move with what is observable: larger prompts at the queue head, more KV later.
    obs = log.observable_at(now_s)
    assert obs.queued.any()
    bigger = replace(obs, context_tokens=np.where(obs.queued, 2.0, 1.0) * obs.context_tokens)
    lo = expected_kv_change_tokens(obs, params, horizon_s=5.0, counts=counts)
    hi = expected_kv_change_tokens(bigger, params, horizon_s=5.0, counts=counts)
    assert hi > lo


def test_kaplan_meier_sees_the_long_outputs_that_are_still_running() -> None:
    """Finished requests alone under-state output lengths early on (the long ones are still
    running); censoring the running ones at what they have decoded recovers the mean."""
    log = _server(4)
    obs = log.observable_at(20.0)
    s = output_survival(obs, step_s=STEP_S)
    km_mean = float(s[:-1].sum())  # E[X] = sum over g >= 0 of P(X > g)
    admitted = log.admit_s <= 20.0
    true_mean = float(log.generated_tokens[admitted].mean())
    naive = float(np.nanmean(obs.generated_tokens))
    assert abs(km_mean - true_mean) < 0.5 * abs(naive - true_mean)
    assert s[0] == 1.0
    assert s[-1] == 0.0
    assert bool(np.all(np.diff(s) <= 0))


@pytest.mark.parametrize("reserves", [True, False])
def test_the_fit_finds_the_servers_cap_its_kv_mode_and_its_bytes_per_token(reserves: bool) -> None:
    log = _server(5)
    t = np.arange(0.0, 150.0, 0.1)
    kv = _kv_mib(log, t, reserves=reserves)
    p = fit_kv_flow_params(log, t, kv, until_s=90.0)
    assert p.max_batch == SLOTS
    assert p.reserves_output is reserves
    assert p.mib_per_token == pytest.approx(MIB_PER_TOKEN, rel=0.02)
    # Only the span up to until_s is read: the later record can change freely.
    later = kv.copy()
    later[t > 90.0] *= 3.0
    assert fit_kv_flow_params(log, t, later, until_s=90.0) == p


@pytest.mark.parametrize("reserves", [True, False])
def test_the_flow_forecast_beats_the_last_value_on_a_fifo_server(reserves: bool) -> None:
    log = _server(6)
    rows = np.arange(40.0, 140.0)
    params = replace(PARAMS, reserves_output=reserves)
    for h in (5.0, 30.0):
        kv_now = _kv_mib(log, rows, reserves=reserves)
        actual = _kv_mib(log, rows + h, reserves=reserves)
        pred = np.array(
            [
                forecast_kv_mib(
                    log.observable_at(x),
                    params,
                    kv_now_mib=float(kv_now[i]),
                    horizon_s=h,
                    counts=_counts(log, x),
                )
                for i, x in enumerate(rows)
            ]
        )
        model = np.abs(pred - actual).sum()
        last = np.abs(kv_now - actual).sum()
        assert model < 0.9 * last, (h, model / last)


def test_before_a_batch_has_finished_the_forecast_is_the_last_value() -> None:
    log = _server(7)
    obs = log.observable_at(1.0)
    assert int(obs.finished.sum()) < int(obs.running.sum())
    assert forecast_kv_mib(obs, PARAMS, kv_now_mib=123.0, horizon_s=30.0) == 123.0


def test_the_weight_is_chosen_on_the_training_span_and_can_be_the_last_value() -> None:
    log = _server(8)
    rows = np.arange(1.0, 150.0)
    kv_now = _kv_mib(log, rows, reserves=True)
    change = MIB_PER_TOKEN * np.array(
        [
            expected_kv_change_tokens(
                log.observable_at(x), PARAMS, horizon_s=5.0, counts=_counts(log, x)
            )
            for x in rows
        ]
    )
    w = choose_change_weight(rows, kv_now, change, horizon_s=5.0, until_s=80.0)
    assert w > 0.0  # the model is right about this server: its change is taken
    later_kv, later_change = kv_now.copy(), change.copy()
    later_kv[rows > 80.0] = 0.0  # targets past the span
    later_change[rows > 75.0] *= -1.0  # rows whose target lies past the span
    assert choose_change_weight(rows, later_kv, later_change, horizon_s=5.0, until_s=80.0) == w
    # A model wrong about the direction is not taken: the last value.
    assert choose_change_weight(rows, kv_now, -change, horizon_s=5.0, until_s=80.0) == 0.0


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        KvFlowParams(max_batch=0, reserves_output=True, mib_per_token=1.0)
    with pytest.raises(ValueError, match="mib_per_token"):
        KvFlowParams(max_batch=1, reserves_output=True, mib_per_token=0.0)
    with pytest.raises(ValueError, match="change_weight"):
        replace(PARAMS, change_weight=1.5)
    with pytest.raises(ValueError, match="horizon_s"):
        expected_kv_change_tokens(_server(9).observable_at(50.0), PARAMS, horizon_s=0.0)


def test_a_server_bound_by_its_kv_pool_is_told_from_one_bound_by_its_batch() -> None:
    """KV pinned at the pool whenever requests wait is a pool-bound server (the flow model's
    capped batch does not describe it); a FIFO server capped by sequences is not, and only the
    span up to until_s is read."""
    log = _server(13)
    t = np.arange(0.0, 150.0, 0.1)
    kv = _kv_mib(log, t, reserves=True)
    queued = np.array([_counts(log, x).queued or 0 for x in t], dtype=float)
    assert bool((queued > 0).any())
    bound, share = kv_pool_bound(t, kv, queued, until_s=90.0)
    assert not bound
    assert 0.0 < share < 0.95
    # The same server with a pool it fills whenever requests wait: KV at the pool, give or take
    # a block, while the queue is non-empty.
    pool = float(kv.max())
    rng = np.random.default_rng(13)
    pinned = np.where(queued > 0, pool - rng.uniform(0.0, 0.005 * pool, len(t)), kv)
    bound, share = kv_pool_bound(t, pinned, queued, until_s=90.0)
    assert bound
    assert share > 0.98
    # Past until_s nothing is read.
    later = pinned.copy()
    later[t > 90.0] = 0.3 * pool
    assert kv_pool_bound(t, later, queued, until_s=90.0) == (bound, share)
    # No queue seen: nothing to tell, not pool-bound.
    assert kv_pool_bound(t, pinned, np.zeros_like(queued), until_s=90.0) == (False, 0.0)
