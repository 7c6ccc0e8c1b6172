"""The KV forecast's fallback (`kv_fallback.select_heads`): the head with the lowest recent error
makes each forecast, judged only on targets already observed, and says which it was."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.bench.kv_forecast import fallback_forecasts
from seedance.bench.kv_scores import HORIZONS_S, value_at
from seedance.router.core.forecast import (
    ChangeWeightConfig,
    HeadChoiceConfig,
    KvHead,
    recent_change_weights,
    select_heads,
)

H = 5.0
CFG = HeadChoiceConfig(horizon_s=H, window_s=30.0, min_targets=1.0, switch_margin=0.1)
# Rows due before the recent error decides: one row a second, so H rows per independent target.
NEEDED = round(CFG.min_targets * H)


def series(n: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One row a second; the KV observed H seconds after each row (the target)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=float)
    actual = 1000.0 + np.cumsum(rng.normal(0.0, 5.0, n))
    return t, actual


def test_the_default_head_is_used_until_enough_targets_have_come_due() -> None:
    t, actual = series()
    good = actual.copy()  # a perfect head
    bad = actual + 100.0
    _, used = select_heads(
        t, {KvHead.FLOW: bad, KvHead.LAST_VALUE: good}, actual, CFG, default=KvHead.FLOW
    )
    # Row i sees rows j with j + H <= i: the fifth scored row is there at i = H + 4.
    first = int(H) + NEEDED - 1
    assert used[:first] == [KvHead.FLOW] * first
    assert used[first] is KvHead.LAST_VALUE
    assert set(used[first:]) == {KvHead.LAST_VALUE}


def test_a_model_that_goes_wrong_is_dropped_for_the_last_value_and_taken_back() -> None:
    t, actual = series(300)
    flow = actual.copy()
    flow[100:200] += 80.0  # the physical model breaks for 100 s, then recovers
    last = actual + 20.0
    out, used = select_heads(
        t, {KvHead.FLOW: flow, KvHead.LAST_VALUE: last}, actual, CFG, default=KvHead.FLOW
    )
    assert used[90] is KvHead.FLOW
    assert used[150] is KvHead.LAST_VALUE
    assert used[290] is KvHead.FLOW
    # Never as bad as the broken model alone.
    assert np.abs(out - actual).sum() < np.abs(flow - actual).sum()


def test_a_choice_at_t_ignores_targets_not_yet_observed() -> None:
    t, actual = series()
    rng = np.random.default_rng(1)
    heads = {
        KvHead.FLOW: actual + rng.normal(0, 10, len(t)),
        KvHead.LAST_VALUE: actual + rng.normal(0, 12, len(t)),
        KvHead.MEAN_10S: actual + rng.normal(0, 11, len(t)),
    }
    _, base = select_heads(t, heads, actual, CFG, default=KvHead.FLOW)
    i = 120
    later = actual.copy()
    later[t + H > t[i]] += rng.normal(0, 500, int((t + H > t[i]).sum()))  # the future, changed
    assert not np.array_equal(later, actual)  # the check has teeth
    _, other = select_heads(t, heads, later, CFG, default=KvHead.FLOW)
    assert other[: i + 1] == base[: i + 1]


def test_a_small_edge_does_not_switch_heads() -> None:
    t, actual = series()
    flow = actual + 10.0
    slightly = actual + 9.5  # 5 % better: inside the switch margin
    _, used = select_heads(
        t, {KvHead.FLOW: flow, KvHead.LAST_VALUE: slightly}, actual, CFG, default=KvHead.FLOW
    )
    assert set(used) == {KvHead.FLOW}
    clearly = actual + 5.0
    _, used = select_heads(
        t, {KvHead.FLOW: flow, KvHead.LAST_VALUE: clearly}, actual, CFG, default=KvHead.FLOW
    )
    assert used[-1] is KvHead.LAST_VALUE


def test_bad_inputs_name_what_is_wrong() -> None:
    t, actual = series(20)
    with pytest.raises(ValueError, match=r"default head 'mean_30s'"):
        select_heads(t, {KvHead.FLOW: actual}, actual, CFG, default=KvHead.MEAN_30S)
    with pytest.raises(ValueError, match=r"forecasts\['flow'\] has 19 rows, not 20"):
        select_heads(t, {KvHead.FLOW: actual[:-1]}, actual, CFG, default=KvHead.FLOW)
    with pytest.raises(ValueError, match="actual has 19 rows"):
        select_heads(t, {KvHead.FLOW: actual}, actual[:-1], CFG, default=KvHead.FLOW)
    with pytest.raises(ValueError, match="horizon_s"):
        HeadChoiceConfig(horizon_s=0.0)
    with pytest.raises(ValueError, match=r"min_targets: 0\.0"):
        HeadChoiceConfig(horizon_s=5.0, min_targets=0.0)
    # More targets than the window can hold: the recent error would never decide.
    with pytest.raises(ValueError, match=r"min_targets: 5\.0 .* window's 4 targets of 30 s"):
        HeadChoiceConfig(horizon_s=30.0, window_s=120.0, min_targets=5.0)
    with pytest.raises(ValueError, match=r"switch_margin: 1\.0"):
        HeadChoiceConfig(horizon_s=5.0, switch_margin=1.0)


def test_with_an_anchor_a_head_worse_than_it_gives_way_at_once() -> None:
    # The mean is 5 % worse than the last value over the window: inside the switch margin, so
    # without an anchor it stays; anchored on the last value, it gives way as soon as it is
    # worse, and the anchored forecast is never worse than the last value here.
    t, actual = series(300)
    rng = np.random.default_rng(2)
    noise = rng.normal(0.0, 10.0, len(t))
    last = actual + noise
    mean = actual + 1.05 * noise
    heads = {KvHead.MEAN_10S: mean, KvHead.LAST_VALUE: last}
    _, free = select_heads(t, heads, actual, CFG, default=KvHead.MEAN_10S)
    assert set(free) == {KvHead.MEAN_10S}
    out, anchored = select_heads(
        t, heads, actual, CFG, default=KvHead.MEAN_10S, anchor=KvHead.LAST_VALUE
    )
    first = int(H) + NEEDED - 1
    assert set(anchored[first:]) == {KvHead.LAST_VALUE}
    assert np.abs(out - actual)[first:].sum() <= np.abs(last - actual)[first:].sum()


def test_an_anchor_without_forecasts_is_refused() -> None:
    t, actual = series()
    with pytest.raises(ValueError, match="anchor"):
        select_heads(
            t, {KvHead.FLOW: actual}, actual, CFG, default=KvHead.FLOW, anchor=KvHead.LAST_VALUE
        )


def early_luck(n: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """30-s forecasts made every second: the model's error is half the last value's on the
    first 60 rows (two independent 30-s targets) and 1.5 times it after, as on the real
    Mooncake recording's first minute and the stretch after it (issue 32)."""
    t, actual = series(n)
    last = actual + 100.0
    flow = actual + np.where(t < 60.0, 50.0, 150.0)
    return t, actual, flow, last


def test_a_head_better_on_too_few_independent_targets_is_not_taken() -> None:
    t, actual, flow, last = early_luck()
    heads = {KvHead.FLOW: flow, KvHead.LAST_VALUE: last}
    cfg = HeadChoiceConfig(horizon_s=30.0)  # the bench's: four 30-s targets in 120 s
    out, used = select_heads(
        t, heads, actual, cfg, default=KvHead.LAST_VALUE, anchor=KvHead.LAST_VALUE
    )
    assert set(used) == {KvHead.LAST_VALUE}
    assert np.array_equal(out, last)
    # The former minimum, 10 rows (a third of one 30-s target), took the model at 40 s on its
    # first 10 due errors and kept it until the bad rows' targets outweighed the lucky ones at
    # 150 s: worse than the last value over the whole series.
    rows10 = HeadChoiceConfig(horizon_s=30.0, min_targets=10.0 / 30.0)
    out10, used10 = select_heads(
        t, heads, actual, rows10, default=KvHead.LAST_VALUE, anchor=KvHead.LAST_VALUE
    )
    assert used10[40] is KvHead.FLOW
    assert np.abs(out10 - actual).sum() > np.abs(last - actual).sum()


def test_a_head_better_over_enough_targets_is_taken_once_they_are_due() -> None:
    t, actual = series(300)
    flow, last = actual + 50.0, actual + 100.0
    _, used = select_heads(
        t,
        {KvHead.FLOW: flow, KvHead.LAST_VALUE: last},
        actual,
        HeadChoiceConfig(horizon_s=30.0),
        default=KvHead.LAST_VALUE,
        anchor=KvHead.LAST_VALUE,
    )
    # Row i sees the rows made in [i - 150, i - 30]: 120 of them, four targets, from i = 149.
    assert set(used[:149]) == {KvHead.LAST_VALUE}
    assert set(used[149:]) == {KvHead.FLOW}


def test_the_evidence_needed_is_in_targets_not_rows() -> None:
    # Rows every 0.5 s: twice the rows per target, so the same four targets take the same time.
    t = np.arange(600, dtype=float) / 2.0
    rng = np.random.default_rng(3)
    actual = 1000.0 + np.cumsum(rng.normal(0.0, 5.0, len(t)))
    _, used = select_heads(
        t,
        {KvHead.FLOW: actual + 50.0, KvHead.LAST_VALUE: actual + 100.0},
        actual,
        HeadChoiceConfig(horizon_s=30.0),
        default=KvHead.LAST_VALUE,
        anchor=KvHead.LAST_VALUE,
    )
    first = int(np.flatnonzero([u is KvHead.FLOW for u in used])[0])
    assert t[first] == 149.5  # made in [-0.5, 119.5]: 240 rows of 0.5 s, four 30-s targets


def blend_series(
    scale: float, n: int = 300, seed: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """KV now, a model's change and the target H later: the real change is ``scale`` times the
    model's plus noise (1 = the model is right, < 1 it over-states the change)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=float)
    kv_now = 1000.0 + rng.normal(0.0, 20.0, n)
    change = rng.normal(0.0, 50.0, n)
    actual = kv_now + scale * change + rng.normal(0.0, 10.0, n)
    return t, kv_now, change, actual


WCFG = ChangeWeightConfig(horizon_s=H, window_s=60.0, min_scored=10)


@pytest.mark.parametrize("scale", [0.0, 0.5, 1.0])
def test_the_recent_weight_finds_how_much_of_the_models_change_comes_true(scale: float) -> None:
    t, kv_now, change, actual = blend_series(scale)
    w = recent_change_weights(t, kv_now, change, actual, WCFG, default=1.0)
    late = w[100:]
    assert np.all((late >= 0.0) & (late <= 1.0))
    assert abs(float(late.mean()) - scale) < 0.1
    # Blending by it beats the training span's all-or-nothing where the model over-states.
    if scale == 0.5:
        blended = np.abs(kv_now + w * change - actual)[100:].sum()
        whole = np.abs(kv_now + change - actual)[100:].sum()
        none = np.abs(kv_now - actual)[100:].sum()
        assert blended < 0.8 * min(whole, none)


def test_the_recent_weight_reads_only_targets_already_observed() -> None:
    t, kv_now, change, actual = blend_series(0.5)
    w = recent_change_weights(t, kv_now, change, actual, WCFG, default=1.0)
    i = 150
    later = actual.copy()
    later[t + H > t[i]] = 0.0  # every target not yet observed at row i
    w2 = recent_change_weights(t, kv_now, change, later, WCFG, default=1.0)
    assert np.array_equal(w[: i + 1], w2[: i + 1])
    assert not np.array_equal(w, w2)  # has teeth: later rows do read them


def test_the_training_weight_holds_until_targets_come_due_and_a_zero_stays_zero() -> None:
    t, kv_now, change, actual = blend_series(1.0)
    w = recent_change_weights(t, kv_now, change, actual, WCFG, default=0.25)
    first = int(H) + WCFG.min_scored - 1  # the tenth scored row is due at H + 9
    assert np.all(w[:first] == 0.25)
    assert w[first] > 0.5
    # The training span found the model no better than the last value: not reopened.
    assert np.all(recent_change_weights(t, kv_now, change, actual, WCFG, default=0.0) == 0.0)
    # Rows where the model was silent say nothing: the training weight stays.
    silent = np.zeros_like(change)
    assert np.all(recent_change_weights(t, kv_now, silent, actual, WCFG, default=0.75) == 0.75)


def test_recent_weight_bad_input_names_the_field() -> None:
    t, kv_now, change, actual = blend_series(1.0, n=20)
    with pytest.raises(ValueError, match="change"):
        recent_change_weights(t, kv_now, change[:5], actual, WCFG, default=1.0)
    with pytest.raises(ValueError, match="default"):
        recent_change_weights(t, kv_now, change, actual, WCFG, default=1.5)
    with pytest.raises(ValueError, match="min_scored"):
        ChangeWeightConfig(horizon_s=H, min_scored=0)
    with pytest.raises(ValueError, match="window_s"):
        ChangeWeightConfig(horizon_s=H, window_s=0.0)


def test_a_longer_horizon_follows_the_shorter_ones_verdict_until_its_own_targets_are_due() -> None:
    # 30-s forecasts made every second, the model better throughout; the 5-s horizon of the same
    # model took it at row 40 (its own targets are due from the start). Without a verdict to
    # borrow, the 30-s forecast is the last value until its window holds four targets (149 s);
    # borrowing, it follows the 5-s verdict from row 40, and its own record keeps it after.
    t, actual = series(300)
    heads = {KvHead.FLOW: actual + 50.0, KvHead.LAST_VALUE: actual + 100.0}
    verdict = [KvHead.LAST_VALUE] * 40 + [KvHead.FLOW] * 260
    cfg = HeadChoiceConfig(horizon_s=30.0)
    out, used = select_heads(
        t, heads, actual, cfg, default=KvHead.LAST_VALUE, anchor=KvHead.LAST_VALUE, borrowed=verdict
    )
    assert used == verdict
    _, alone = select_heads(
        t, heads, actual, cfg, default=KvHead.LAST_VALUE, anchor=KvHead.LAST_VALUE
    )
    assert set(alone[:149]) == {KvHead.LAST_VALUE}  # the rule without it, for contrast
    assert np.array_equal(out[40:], heads[KvHead.FLOW][40:])
    # Row i reads the verdict of row i only: a later verdict changed leaves rows up to i as they
    # were.
    other = verdict[:100] + [KvHead.LAST_VALUE] * 200
    _, changed = select_heads(
        t, heads, actual, cfg, default=KvHead.LAST_VALUE, anchor=KvHead.LAST_VALUE, borrowed=other
    )
    assert changed[:100] == used[:100]


def test_once_a_horizon_has_its_own_targets_its_own_record_decides() -> None:
    # The shorter horizon says the model throughout, but at 30 s it is worse than the last value:
    # the borrowed verdict holds only until the 30-s window holds four targets (149 s), then the
    # anchor takes the last value back at once.
    t, actual = series(300)
    heads = {KvHead.FLOW: actual + 150.0, KvHead.LAST_VALUE: actual + 100.0}
    _, used = select_heads(
        t,
        heads,
        actual,
        HeadChoiceConfig(horizon_s=30.0),
        default=KvHead.LAST_VALUE,
        anchor=KvHead.LAST_VALUE,
        borrowed=[KvHead.FLOW] * 300,
    )
    assert set(used[:149]) == {KvHead.FLOW}
    assert set(used[149:]) == {KvHead.LAST_VALUE}


def test_a_borrowed_verdict_must_fit_the_rows_and_heads() -> None:
    t, actual = series(20)
    heads = {KvHead.FLOW: actual, KvHead.LAST_VALUE: actual}
    with pytest.raises(ValueError, match="borrowed has 19 rows, not 20"):
        select_heads(t, heads, actual, CFG, default=KvHead.LAST_VALUE, borrowed=[KvHead.FLOW] * 19)
    with pytest.raises(ValueError, match="borrowed heads without forecasts: 'mean_10s'"):
        select_heads(
            t, heads, actual, CFG, default=KvHead.LAST_VALUE, borrowed=[KvHead.MEAN_10S] * 20
        )


def test_the_bench_borrows_the_5s_verdict_at_30s_unless_its_flow_head_is_the_last_value() -> None:
    # The bench's wiring (`fallback_forecasts`): KV sampled every second, a flow head that is
    # exact at both horizons, so the 5-s rule takes it as soon as its targets are due (four 5-s
    # targets, row 25); the 30-s forecast follows from then, not only from 150 s.
    t, kv = series(300)
    kv = kv + 1000.0
    row_t = t[1:]
    at = {h: value_at(t, kv, row_t + h) for h in HORIZONS_S}
    _, used = fallback_forecasts(t, kv, row_t, at, float(t[-1]))
    first5 = used[5].index(KvHead.FLOW)
    assert first5 < 30
    assert used[30][:first5] == [KvHead.LAST_VALUE] * first5
    assert used[30][first5] is KvHead.FLOW
    # A 30-s flow head with w = 0 is the last value: nothing to borrow, and it says so.
    same = dict(at)
    same[30] = value_at(t, kv, row_t)
    _, used = fallback_forecasts(t, kv, row_t, same, float(t[-1]))
    assert set(used[30]) == {KvHead.LAST_VALUE}
