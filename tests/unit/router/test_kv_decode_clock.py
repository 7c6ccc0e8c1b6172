"""The flow model's decode clock (`kv_flow.DecodeClock`): the server's decode-token counter as a
per-sequence clock, read only up to t, and worth more than the finished requests' step on a
server whose speed varies (the H200 recording's slows by half for ~20 s: docs, kv-split)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seedance.router.core.forecast import (
    DecodeClock,
    KvFlowParams,
    RequestLog,
    ServerCounts,
    forecast_kv_mib,
)

SLOTS = 32
PREFILL_S = 0.01
MIB_PER_TOKEN = 0.125
PARAMS = KvFlowParams(max_batch=SLOTS, reserves_output=True, mib_per_token=MIB_PER_TOKEN)
SAMPLES_S = np.arange(0.0, 160.0, 0.1)


def _speed(period_s: float | None) -> tuple[np.ndarray, np.ndarray]:
    """A per-sequence clock (time grid, tokens decoded by then): 25 ms a token, or a step that
    swings between 15 and 35 ms over ``period_s`` (a server whose speed varies)."""
    grid = np.linspace(0.0, 200.0, 4_001)
    step = np.full(len(grid) - 1, 0.025)
    if period_s is not None:
        step += 0.01 * np.sin(2.0 * math.pi * grid[:-1] / period_s)
    return grid, np.concatenate([[0.0], np.cumsum(np.diff(grid) / step)])


def _server(seed: int, period_s: float | None, *, n: int = 3_000) -> RequestLog:
    """A FIFO server of SLOTS sequences whose load swells and ebbs (a queue forms and drains)
    and whose outputs depend on the prompt; each sequence decodes at the clock's pace."""
    grid, tokens = _speed(period_s)
    rng = np.random.default_rng(seed)
    rate = 25.0 + 15.0 * np.sin(np.linspace(0.0, 6.0 * math.pi, n))
    arrival = np.cumsum(rng.exponential(1.0 / rate))
    arrival *= 150.0 / arrival[-1]
    ctx = np.exp(rng.normal(6.5, 1.0, n)).round().clip(10, 8_000)
    gen = np.where(ctx < 500, rng.integers(5, 40, n), rng.integers(40, 120, n)).astype(float)
    free = np.zeros(SLOTS)
    admit, first, finish = np.empty(n), np.empty(n), np.empty(n)
    for i in range(n):
        k = int(np.argmin(free))
        admit[i] = max(free[k], arrival[i])
        first[i] = admit[i] + PREFILL_S
        finish[i] = np.interp(np.interp(first[i], grid, tokens) + gen[i] - 1.0, tokens, grid)
        free[k] = finish[i]
    return RequestLog(
        arrival_s=arrival,
        context_tokens=ctx,
        admit_s=admit,
        first_token_s=first,
        finish_s=finish,
        generated_tokens=gen,
    )


def _clock(period_s: float | None) -> DecodeClock:
    grid, tokens = _speed(period_s)
    return DecodeClock(sample_s=SAMPLES_S, tokens_per_seq=np.interp(SAMPLES_S, grid, tokens))


def _kv_mib(log: RequestLog, at_s: np.ndarray) -> np.ndarray:
    held = log.context_tokens + log.generated_tokens
    return np.array(
        [MIB_PER_TOKEN * float(held[(log.admit_s <= x) & (log.finish_s > x)].sum()) for x in at_s]
    )


def _forecasts(
    log: RequestLog, rows: np.ndarray, horizon_s: float, clock: DecodeClock | None
) -> np.ndarray:
    kv_now = _kv_mib(log, rows)
    out = np.empty(len(rows))
    for i, x in enumerate(rows):
        known = log.arrival_s <= x
        counts = ServerCounts(
            running=int((known & (log.admit_s <= x) & (log.finish_s > x)).sum()),
            queued=int((known & (log.admit_s > x)).sum()),
            decode_clock=None if clock is None else clock.until(float(x)),
        )
        out[i] = forecast_kv_mib(
            log.observable_at(float(x)),
            PARAMS,
            kv_now_mib=float(kv_now[i]),
            horizon_s=horizon_s,
            counts=counts,
        )
    return out


def test_the_clock_is_the_counters_tokens_per_running_sequence() -> None:
    t = np.arange(0.0, 10.0, 0.5)
    running = np.where(t < 5.0, 4.0, 8.0)
    running[0] = 0.0
    per_seq = np.where(t < 5.0, 10.0, 5.0)  # each running sequence decodes 20, then 10 a second
    per_seq[0] = 0.0
    total = np.cumsum(per_seq * running)
    clock = DecodeClock.of_counters(t, total, running)
    assert clock is not None
    np.testing.assert_allclose(clock.tokens_per_seq, np.cumsum(per_seq))
    # Past the last sample the clock runs on at the step it is given.
    assert clock.tokens(np.array([9.5, 10.5]), step_s=0.1)[1] == pytest.approx(
        clock.tokens_per_seq[-1] + 10.0
    )
    # A counter that never moves is one the server does not report.
    assert DecodeClock.of_counters(t, np.zeros_like(t), running) is None


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match="tokens_per_seq"):
        DecodeClock(sample_s=np.arange(3.0), tokens_per_seq=np.arange(2.0))
    with pytest.raises(ValueError, match="sample_s"):
        DecodeClock(sample_s=np.array([0.0, 2.0, 1.0]), tokens_per_seq=np.arange(3.0))


def test_a_forecast_at_t_reads_no_sample_of_the_clock_after_t() -> None:
    log = _server(1, 20.0)
    clock = _clock(20.0)
    now_s = 63.0
    later = DecodeClock(
        sample_s=clock.sample_s,
        tokens_per_seq=np.where(clock.sample_s > now_s, 3.0, 1.0) * clock.tokens_per_seq,
    )
    rows = np.array([now_s])
    for h in (5.0, 30.0):
        assert _forecasts(log, rows, h, clock) == _forecasts(log, rows, h, later)
    # It does read the clock up to t: a server that sped up over the last 10 s before t (a
    # change of shape, which no calibration to the log's tokens undoes), another forecast.
    sped_up = clock.tokens_per_seq + 20.0 * np.clip(clock.sample_s - (now_s - 10.0), 0.0, None)
    faster = DecodeClock(sample_s=clock.sample_s, tokens_per_seq=sped_up)
    assert _forecasts(log, rows, 5.0, clock) != _forecasts(log, rows, 5.0, faster)


@pytest.mark.parametrize("period_s", [20.0, 40.0, 80.0])
def test_on_a_server_whose_speed_varies_the_clock_beats_the_finished_requests_step(
    period_s: float,
) -> None:
    """The decode step of recently finished requests is each one's mean over its life: it lags
    the server's speed, and with it how far the running requests have decoded. The clock does
    not: at 5 s the forecast is better on every seed; at 30 s, where the step ahead (the same
    on both paths) dominates, it costs at most 1 % (a bound set after seeing 0.1 %)."""
    rows = np.arange(30.0, 140.0)
    clock = _clock(period_s)
    for seed in (1, 2, 3):
        log = _server(seed, period_s)
        for h in (5.0, 30.0):
            actual = _kv_mib(log, rows + h)
            with_clock = float(np.abs(_forecasts(log, rows, h, clock) - actual).sum())
            without = float(np.abs(_forecasts(log, rows, h, None) - actual).sum())
            bound = without if h == 5.0 else 1.01 * without
            assert with_clock < bound, (seed, h, with_clock / without)


def test_at_a_constant_speed_the_clock_and_the_step_agree() -> None:
    """Where the server's speed does not change, the finished requests' step is right and the
    clock is a refinement of it, not another model: the forecasts are the same (to rounding)."""
    log = _server(4, None)
    rows = np.arange(30.0, 140.0)
    clock = _clock(None)
    for h in (5.0, 30.0):
        a, b = _forecasts(log, rows, h, clock), _forecasts(log, rows, h, None)
        kv_change = np.abs(_kv_mib(log, rows + h) - _kv_mib(log, rows)).sum()
        assert np.abs(a - b).sum() < 1e-6 * kv_change, np.abs(a - b).sum() / kv_change


def test_a_counter_in_another_unit_is_not_used() -> None:
    """A server whose counter counts every token twice would make its running requests look
    twice as far decoded: the clock disagrees with the log's tokens and the forecast is the one
    from the finished requests' step."""
    log = _server(2, 20.0)
    clock = _clock(20.0)
    doubled = DecodeClock(sample_s=clock.sample_s, tokens_per_seq=2.0 * clock.tokens_per_seq)
    obs = log.observable_at(70.0)
    assert clock.until(70.0).agrees_with(obs)
    assert not doubled.until(70.0).agrees_with(obs)
    rows = np.arange(60.0, 80.0)
    without = _forecasts(log, rows, 5.0, None)
    assert np.array_equal(_forecasts(log, rows, 5.0, doubled), without)
    assert not np.array_equal(_forecasts(log, rows, 5.0, clock), without)
