"""The KV forecast's tested fallback (`kv_fallback.follow_if_better`): the last value is the
null; the flow model is followed only where its recent paired errors beat the last value's by
more than their noise, with one block per horizon so overlapping targets are not counted as
independent; too little history means the last value."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.router.core.forecast import KvHead, PairedTestConfig, follow_if_better
from seedance.router.core.forecast.kv_fallback import batch_mean_t, t_quantile

H = 10.0
CFG = PairedTestConfig(horizon_s=H, window_s=120.0)


def walk(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row a second: the times, the KV observed H seconds after each row (the target), and
    the last value at each row (the KV H seconds before its target)."""
    rng = np.random.default_rng(seed)
    kv = 1000.0 + np.cumsum(rng.normal(0.0, 5.0, n + int(H)))
    return np.arange(n, dtype=float), kv[int(H) :], kv[:n]


def test_student_t_quantiles_match_the_table() -> None:
    # One-sided 5 % points of Student's t (any statistics table).
    for dof, expected in ((1, 6.3138), (2, 2.9200), (5, 2.0150), (7, 1.8946), (30, 1.6973)):
        assert t_quantile(0.95, dof) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.90, 10) == pytest.approx(1.3722, abs=1e-4)


def test_a_better_model_is_followed_only_once_two_horizons_of_targets_are_due() -> None:
    t, actual, last = walk()
    model = actual + np.random.default_rng(1).normal(0.0, 1.0, len(t))  # far better
    out, used, stat = follow_if_better(t, model, last, actual, CFG)
    # Row i sees the targets of rows j <= i - H; two blocks of H rows need 2H of them.
    first = int(H) + 2 * int(H) - 1
    assert used[:first] == [KvHead.LAST_VALUE] * first
    assert np.all(np.isnan(stat[:first]))
    assert np.array_equal(out[:first], last[:first])
    # With two blocks (1 degree of freedom) the bar is t < -6.31, so early rows may stay with the
    # null; once the window is full (12 blocks) the model makes every forecast.
    full = int(H + CFG.window_s)
    assert set(used[full:]) == {KvHead.FLOW}
    assert sum(u is KvHead.FLOW for u in used[first:]) >= 0.95 * (len(t) - first)


def test_a_model_no_better_than_the_last_value_is_not_followed() -> None:
    # The model adds a change of its own, unrelated to what happens: on average worse, and by
    # chance better over some windows (the Mooncake case, issue 32).
    t, actual, last = walk(600)
    model = last + np.convolve(
        np.random.default_rng(2).normal(0.0, 6.0, len(t)), np.ones(5) / 5.0, mode="same"
    )
    out, used, _ = follow_if_better(t, model, last, actual, CFG)
    assert sum(u is KvHead.FLOW for u in used) <= 0.05 * len(t)
    assert np.abs(out - actual).sum() <= 1.01 * np.abs(last - actual).sum()


def test_overlapping_errors_are_not_counted_as_independent() -> None:
    # Differences constant within each horizon-long block (the overlap of H-step targets),
    # alternating between blocks: a row-by-row t test sees 120 agreeing rows and rejects, the
    # block test sees 12 blocks that disagree and does not.
    h = 10
    blocks = np.tile([-1.2, 0.8], 6)
    d = np.repeat(blocks, h)
    naive = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert naive < -t_quantile(0.95, d.size - 1)
    stat, dof = batch_mean_t(d, h)
    assert dof == 11
    assert stat > -t_quantile(0.95, dof)


def test_identical_forecasts_mean_the_last_value() -> None:
    t, actual, last = walk()
    out, used, stat = follow_if_better(t, last.copy(), last, actual, CFG)  # a change weight of 0
    assert set(used) == {KvHead.LAST_VALUE}
    assert np.all(np.isnan(stat))
    assert np.array_equal(out, last)


def test_a_choice_at_t_ignores_targets_not_yet_observed() -> None:
    t, actual, last = walk()
    model = actual + np.random.default_rng(3).normal(0.0, 3.0, len(t))
    _, base, stat = follow_if_better(t, model, last, actual, CFG)
    later = actual.copy()
    later[250:] += 500.0  # targets of rows >= 250, observed from t = 250 + H on
    _, other, stat2 = follow_if_better(t, model, last, later, CFG)
    cut = 250 + int(H)
    assert other[:cut] == base[:cut]
    assert np.array_equal(stat[:cut], stat2[:cut], equal_nan=True)
    assert other != base


def test_bad_input_is_refused_naming_the_field() -> None:
    t, actual, last = walk(50)
    with pytest.raises(ValueError, match="model has 49 rows, not 50"):
        follow_if_better(t, last[:-1], last, actual, CFG)
    with pytest.raises(ValueError, match="actual has 49 rows"):
        follow_if_better(t, last, last, actual[:-1], CFG)
    with pytest.raises(ValueError, match="times_s must increase"):
        follow_if_better(t[::-1].copy(), last, last, actual, CFG)
    with pytest.raises(ValueError, match=r"PairedTestConfig\.alpha: 0\.5"):
        PairedTestConfig(horizon_s=5.0, alpha=0.5)
    with pytest.raises(ValueError, match=r"horizon_s 0\.0"):
        PairedTestConfig(horizon_s=0.0)
