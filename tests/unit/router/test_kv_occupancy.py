"""The KV-occupancy forecast's causal view, features and online head (`kv_occupancy`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from seedance.router.core.forecast import (
    KvForecasterConfig,
    OnlineKvChangeForecaster,
    RequestLog,
    choose_kv_forecaster,
    decode_step_s,
    kv_change_features,
    replay_kv_forecaster,
    tokens_in_flight,
)

from .request_log_kit import perturb_the_unobservable

NOW_S = 20.0


def _log(seed: int = 0, n: int = 400, span_s: float = 40.0) -> RequestLog:
    """A FIFO server with 16 slots, 20 ms per token per sequence, 10 ms prefill."""
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, span_s, n))
    ctx = rng.integers(50, 3_000, n).astype(float)
    gen = rng.integers(2, 400, n).astype(float)
    free = [0.0] * 16
    admit, first, finish = np.empty(n), np.empty(n), np.empty(n)
    for i in range(n):
        k = int(np.argmin(free))
        admit[i] = max(free[k], arrival[i])
        first[i] = admit[i] + 0.01
        finish[i] = first[i] + (gen[i] - 1.0) * 0.02
        free[k] = finish[i]
    return RequestLog(
        arrival_s=arrival,
        context_tokens=ctx,
        admit_s=admit,
        first_token_s=first,
        finish_s=finish,
        generated_tokens=gen,
    )


def _in_flight_at(log: RequestLog, t: float) -> np.ndarray:
    return (log.arrival_s <= t) & (log.admit_s <= t) & (log.finish_s > t)


def test_the_view_masks_later_arrivals_and_in_flight_outputs() -> None:
    log = _log()
    obs = log.observable_at(NOW_S)
    assert len(obs.arrival_s) == int((log.arrival_s <= NOW_S).sum())
    n = len(obs.arrival_s)
    running = _in_flight_at(log, NOW_S)[:n]
    assert running.any()  # the fixture has both; else the test is empty
    assert obs.queued.any()
    assert np.isnan(obs.generated_tokens[running]).all()
    assert np.isnan(obs.finish_s[running]).all()
    done = log.finish_s[:n] <= NOW_S
    assert np.array_equal(obs.generated_tokens[done], log.generated_tokens[:n][done])
    assert np.array_equal(obs.running, running)
    assert np.nanmax(obs.admit_s) <= NOW_S


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_features_do_not_read_future_arrivals_or_in_flight_generated_tokens(seed: int) -> None:
    log = _log(seed)
    other = perturb_the_unobservable(log, NOW_S, seed)
    # The perturbation reaches what a leaky feature would read...
    n = int((log.arrival_s <= NOW_S).sum())
    assert not np.array_equal(log.generated_tokens[:n], other.generated_tokens[:n])
    assert len(other.arrival_s) != len(log.arrival_s) or not np.array_equal(
        other.arrival_s, log.arrival_s
    )
    # ...and changes nothing the forecast at NOW_S sees.
    assert np.array_equal(kv_change_features(log, NOW_S), kv_change_features(other, NOW_S))
    a, b = log.observable_at(NOW_S), other.observable_at(NOW_S)
    assert tokens_in_flight(a) == tokens_in_flight(b)
    assert decode_step_s(a) == decode_step_s(b)


def test_the_leak_check_catches_a_feature_that_reads_the_raw_log() -> None:
    """The perturbation test has teeth: a feature that sums the in-flight requests' true
    output lengths (or counts later arrivals) differs between the two logs."""
    log = _log(4)
    other = perturb_the_unobservable(log, NOW_S, 4)

    def leaky(lg: RequestLog) -> tuple[float, int]:
        run = _in_flight_at(lg, NOW_S)
        return float(lg.generated_tokens[run].sum()), int((lg.arrival_s <= NOW_S + 5.0).sum())

    assert leaky(log) != leaky(other)


def test_tokens_in_flight_counts_prompt_plus_decoded_so_far() -> None:
    log = _log(5)
    obs = log.observable_at(NOW_S)
    assert decode_step_s(obs) == pytest.approx(0.02)
    run = _in_flight_at(log, NOW_S)
    decoded = np.floor((NOW_S - log.first_token_s[run]) / 0.02 + 1e-9) + 1.0
    expect = float((log.context_tokens[run] + np.clip(decoded, 0, None)).sum())
    assert tokens_in_flight(obs) == pytest.approx(expect, rel=1e-3)


def test_online_head_never_fits_on_a_target_after_now() -> None:
    rng = np.random.default_rng(6)
    t = np.arange(1.0, 121.0)
    x = rng.normal(size=(len(t), 1))
    kv = 1_000.0 + np.cumsum(rng.normal(size=len(t)))
    cfg = KvForecasterConfig(horizon_s=5.0, half_life_s=30.0, ridge=1.0)
    base = replay_kv_forecaster(cfg, t, x, kv)
    k = 80
    kv2 = kv.copy()
    kv2[k + 1 :] += 500.0 * rng.normal(size=len(t) - k - 1)
    assert np.array_equal(replay_kv_forecaster(cfg, t, x, kv2)[: k + 1], base[: k + 1])


def test_online_head_learns_a_planted_relation_and_falls_back_to_the_last_value() -> None:
    rng = np.random.default_rng(7)
    t = np.arange(1.0, 301.0)
    x = rng.normal(size=(len(t), 1))
    kv = np.full(len(t), 10_000.0)
    for i in range(5, len(t)):  # x(t) is the change of kv over the next 5 s
        kv[i] = kv[i - 5] + 3.0 * x[i - 5, 0] + rng.normal(scale=0.1)
    head = OnlineKvChangeForecaster(KvForecasterConfig(horizon_s=5.0, half_life_s=60.0, ridge=0.01))
    pred = np.array([head.forecast(float(s), x[i], float(kv[i])) for i, s in enumerate(t)])
    err = np.abs(pred[200:295] - kv[205:300]).mean()
    last = np.abs(kv[200:295] - kv[205:300]).mean()
    assert err < 0.2 * last
    # Too few rows with an observed target: the last value.
    assert pred[10] == kv[10]
    none = KvForecasterConfig(horizon_s=5.0, half_life_s=None, ridge=None)
    assert np.array_equal(replay_kv_forecaster(none, t, x, kv), kv)


def test_the_choice_uses_the_training_span_only_and_can_choose_no_correction() -> None:
    rng = np.random.default_rng(8)
    t = np.arange(1.0, 301.0)
    x = rng.normal(size=(len(t), 1))
    kv = 10_000.0 + np.cumsum(rng.normal(size=len(t)))  # x carries nothing
    cfg = choose_kv_forecaster(t, x, kv, horizon_s=5.0, until_s=150.0)
    later = kv.copy()
    later[150:] = 0.0
    assert choose_kv_forecaster(t, x, later, horizon_s=5.0, until_s=150.0) == cfg
    assert cfg.half_life_s is None  # nothing to learn: the last value


def test_bad_input_names_the_field() -> None:
    log = _log(9)
    with pytest.raises(ValueError, match="context_tokens"):
        replace(log, context_tokens=log.context_tokens[:-1])
    with pytest.raises(ValueError, match="arrival_s"):
        replace(log, arrival_s=log.arrival_s[::-1])
    with pytest.raises(ValueError, match="both"):
        KvForecasterConfig(horizon_s=5.0, half_life_s=30.0, ridge=None)
    head = OnlineKvChangeForecaster(KvForecasterConfig(horizon_s=5.0, half_life_s=30.0, ridge=1.0))
    head.forecast(1.0, np.zeros(1), 0.0)
    with pytest.raises(ValueError, match="now_s"):
        head.forecast(1.0, np.zeros(1), 0.0)


def test_the_bench_puts_the_requests_file_on_the_telemetry_clock() -> None:
    """A requests file stamped 1.3 s early: the offset found from the completion counter is
    1.3 s, from the training span alone, and the shifted log's finishes match the counter."""
    from seedance.bench.kv_forecast import clock_offset_s, shifted

    log = _log(10)
    t = np.arange(0.0, 40.0, 0.1)
    fin = np.sort(log.finish_s)
    done_total = np.searchsorted(fin, t, side="right").astype(float)  # telemetry clock
    early = shifted(log, -1.3)  # what the recorder wrote
    later = done_total.copy()
    later[t > 20.0] = 0.0  # the counter past the training span is not read
    assert clock_offset_s(early, t, later, until_s=20.0) == pytest.approx(1.3)
    fixed = shifted(early, 1.3)
    assert np.allclose(fixed.finish_s, log.finish_s)
