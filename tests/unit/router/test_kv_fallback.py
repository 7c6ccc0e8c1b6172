"""The KV forecast's fallback (`kv_fallback.select_heads`): the head with the lowest recent error
makes each forecast, judged only on targets already observed, and says which it was."""

from __future__ import annotations

import numpy as np
import pytest

from seedance.router.core.forecast import (
    ChangeWeightConfig,
    HeadChoiceConfig,
    KvHead,
    recent_change_weights,
    select_heads,
)

H = 5.0
CFG = HeadChoiceConfig(horizon_s=H, window_s=30.0, min_scored=5, switch_margin=0.1)


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
    first = int(H) + CFG.min_scored - 1
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
    with pytest.raises(ValueError, match="min_scored"):
        HeadChoiceConfig(horizon_s=5.0, min_scored=0)
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
    first = int(H) + CFG.min_scored - 1
    assert set(anchored[first:]) == {KvHead.LAST_VALUE}
    assert np.abs(out - actual)[first:].sum() <= np.abs(last - actual)[first:].sum()


def test_an_anchor_without_forecasts_is_refused() -> None:
    t, actual = series()
    with pytest.raises(ValueError, match="anchor"):
        select_heads(
            t, {KvHead.FLOW: actual}, actual, CFG, default=KvHead.FLOW, anchor=KvHead.LAST_VALUE
        )


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
    first = int(H) + WCFG.min_scored - 1  # as select_heads: the tenth target is due at H + 9
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
