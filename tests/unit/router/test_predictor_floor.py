"""The forecaster's floor and structure tests (seedance.bench.predictor_floor), synthetic arrivals.

Each diagnostic is checked both ways: it reads "nothing here" on Poisson arrivals and flags the
structure it is meant to find when that structure is planted.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from seedance.bench.predictor_floor import (
    centred_mean,
    clock_phase_chi2,
    decayed_sums,
    dispersion_index,
    fit_hawkes,
    linear_forecast_wape,
    periodogram_peak,
    poisson_median_and_mad,
    residual_autocorr,
    score_tail,
)


def _brute_median_mad(mu: float) -> tuple[int, float]:
    ks = range(int(mu + 15 * math.sqrt(mu) + 40))
    if mu == 0:
        return 0, 0.0
    p = [math.exp(k * math.log(mu) - mu - math.lgamma(k + 1)) for k in ks]
    cdf = np.cumsum(p)
    med = int(np.argmax(cdf >= 0.5))
    return med, sum(pk * abs(k - med) for k, pk in zip(ks, p, strict=True))


@pytest.mark.parametrize("mu", [0.0, 0.3, 1.0, 2.7, 23.9, 143.5])
def test_poisson_median_and_mad_match_a_direct_sum(mu: float) -> None:
    med, mad = poisson_median_and_mad(np.array([mu]))
    want_med, want_mad = _brute_median_mad(mu)
    assert med[0] == want_med
    assert mad[0] == pytest.approx(want_mad, rel=1e-9, abs=1e-12)


def test_poisson_mad_approaches_the_normal_value() -> None:
    # E|N − median| → sqrt(2μ/π) for large μ; the floor's √-scaling rests on it.
    _, mad = poisson_median_and_mad(np.array([400.0]))
    assert mad[0] == pytest.approx(math.sqrt(2 * 400 / math.pi), rel=0.01)


def test_median_minimises_the_expected_absolute_error() -> None:
    mu = 23.9
    med, mad = poisson_median_and_mad(np.array([mu]))
    k = np.arange(200)
    p = np.exp(k * math.log(mu) - mu - np.array([math.lgamma(x + 1) for x in k]))
    for other in (med[0] - 1, med[0] + 1, mu):
        assert float(np.sum(p * np.abs(k - other))) >= mad[0] - 1e-12


def test_centred_mean_keeps_the_level_at_the_edges() -> None:
    assert np.allclose(centred_mean(np.full(50, 3.0), 11), 3.0)


def test_oracle_floor_on_a_constant_rate() -> None:
    rate = np.full(3_000, 4.8)
    s = score_tail(rate, split=2_100, h=5, seeds=4)
    _, mad = poisson_median_and_mad(np.array([24.0]))
    assert s.oracle_expected == pytest.approx(mad[0] / 24.0, rel=1e-9)
    assert s.oracle_sim == pytest.approx(s.oracle_expected, abs=0.01)
    # Every causal baseline is worse than the rate-knowing oracle.
    assert min(s.baseline_sim.values()) > s.oracle_sim


def test_dispersion_reads_one_for_poisson_and_flags_clustering() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(4_000)
    rate = 5.0 + 2.0 * np.sin(2 * math.pi * t / 1_800)  # a slow level, removed by the detrending
    poisson = rng.poisson(rate).astype(float)
    pairs = 2.0 * rng.poisson(rate / 2.0)  # requests come in pairs: variance twice the mean
    assert dispersion_index(poisson, 1) == pytest.approx(1.0, abs=0.08)
    assert dispersion_index(poisson, 5) == pytest.approx(1.0, abs=0.12)
    assert dispersion_index(pairs, 1) == pytest.approx(2.0, abs=0.2)


def test_residual_autocorr_flags_a_periodic_pattern_only() -> None:
    rng = np.random.default_rng(2)
    flat = rng.poisson(5.0, size=4_000).astype(float)
    bursts = rng.poisson(np.where(np.arange(4_000) % 3 == 0, 12.0, 1.5)).astype(float)
    thr = 3.0 / math.sqrt(4_000 - 2 * 121)
    assert int(np.sum(np.abs(residual_autocorr(flat)) > thr)) <= 2
    ac = residual_autocorr(bursts)
    assert ac[2] > 0.5  # lag 3 s
    assert ac[0] < -0.2


def test_decayed_sums_match_a_direct_sum() -> None:
    rng = np.random.default_rng(3)
    src = np.sort(rng.uniform(0, 50, 40))
    tgt = np.sort(rng.uniform(0, 60, 30))
    got = decayed_sums(tgt, src, 0.7)
    want = [sum(math.exp(-0.7 * (t - s)) for s in src if s < t) for t in tgt]
    assert np.allclose(got, want)


def _hawkes(mu: float, alpha: float, beta: float, span_s: float, seed: int) -> np.ndarray:
    """Cluster simulation: Poisson immigrants, each event has Poisson(alpha) children."""
    rng = np.random.default_rng(seed)
    gen = rng.uniform(0, span_s, rng.poisson(mu * span_s))
    out = [gen]
    while len(gen):
        kids = rng.poisson(alpha, len(gen))
        gen = np.repeat(gen, kids) + rng.exponential(1.0 / beta, kids.sum())
        gen = gen[gen < span_s]
        out.append(gen)
    return np.sort(np.concatenate(out))


def test_hawkes_fit_finds_self_excitation_and_not_where_there_is_none() -> None:
    span = 2_000
    nu = np.full(span - 20, 1.0)  # the level: a constant rate, scaled by the fit's `a`
    excited = _hawkes(mu=2.0, alpha=0.5, beta=1.0, span_s=span, seed=4)
    f = fit_hawkes(excited, excited, nu * 4.0, origin_s=10.0, beta=1.0)
    assert f.alpha == pytest.approx(0.5, abs=0.1)
    assert f.loglik_gain > 50.0
    plain = np.sort(np.random.default_rng(5).uniform(0, span, 8_000))
    g = fit_hawkes(plain, plain, nu * 4.0, origin_s=10.0, beta=1.0)
    assert g.alpha < 0.05
    assert 0.0 <= g.loglik_gain < 5.0


def test_linear_predictor_beats_the_mean_only_when_the_past_says_something() -> None:
    rng = np.random.default_rng(6)
    n, split = 3_000, 2_100
    flat = rng.poisson(5.0, size=n).astype(float)
    _, ratio_flat = linear_forecast_wape(flat, [], split, 5)
    assert ratio_flat == pytest.approx(1.0, abs=0.05)
    # On/off every 20 s: the last seconds tell whether the next 5 s are on or off.
    onoff = rng.poisson(np.where((np.arange(n) // 20) % 2 == 0, 9.0, 1.0)).astype(float)
    _, ratio_onoff = linear_forecast_wape(onoff, [], split, 5)
    assert ratio_onoff < 0.8


def test_clock_phase_chi2_flags_cron_bursts_only() -> None:
    rng = np.random.default_rng(7)
    plain = np.sort(rng.uniform(0, 3_600, 20_000))
    bursts = np.arange(0, 3_600, 60.0)[None, :] + rng.uniform(0, 0.5, (40, 60))  # 40 at :00
    cron = np.concatenate([plain, bursts.ravel()])
    assert clock_phase_chi2(plain, 60.0, 12) < 24.7
    assert clock_phase_chi2(cron, 60.0, 12) > 100.0


def test_periodogram_peak_finds_a_clock_and_not_noise() -> None:
    rng = np.random.default_rng(8)
    flat = rng.poisson(5.0, size=3_600).astype(float)
    _, _, p_flat = periodogram_peak(flat, 2.0, 120.0)
    assert p_flat > 0.01
    ticks = rng.poisson(np.where(np.arange(3_600) % 3 == 0, 12.0, 1.5)).astype(float)
    period, _, p_ticks = periodogram_peak(ticks, 2.0, 120.0)
    assert period == pytest.approx(3.0, abs=0.01)
    assert p_ticks < 1e-6
