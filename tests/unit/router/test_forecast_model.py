"""Training, the fast prediction path, the bytes round trip and the retraining policy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from seedance.router.core.forecast import (
    FEATURE_NAMES,
    ArrivalHistory,
    ForecastModel,
    ForecastTarget,
    RetrainInputs,
    RetrainPolicy,
    RetrainReason,
    TelemetrySample,
    TrainParams,
    build_feature_rows,
    decide_retrain,
    train_forecast_model,
)

PARAMS = TrainParams(num_boost_round=60)


def _periodic_arrivals(span_s: int, seed: int) -> ArrivalHistory:
    """Requests in bursts every 3 s (like a quantised clock): predictable beyond any average."""
    rng = np.random.default_rng(seed)
    ticks = np.arange(0, span_s, 3)
    n = rng.poisson(9.0, size=len(ticks))
    t = np.repeat(ticks.astype(float), n) + rng.uniform(0.0, 0.05, size=n.sum())
    t.sort()
    return ArrivalHistory(
        arrival_s=t,
        context_tokens=np.full(len(t), 1_000.0),
        generated_tokens=np.full(len(t), 100.0),
    )


@pytest.fixture(scope="module")
def periodic() -> tuple[ArrivalHistory, ForecastModel]:
    hist = _periodic_arrivals(1_500, seed=1)
    model = train_forecast_model(hist, origin_s=0.0, until_s=1_000.0, params=PARAMS)
    return hist, model


def _wape(pred: np.ndarray, actual: np.ndarray) -> float:
    return float(np.abs(pred - actual).sum() / actual.sum())


def test_model_beats_the_moving_average_where_there_is_structure(periodic) -> None:
    hist, model = periodic
    rows, counts, _ = build_feature_rows(hist, origin_s=0.0, n_bins=1_490)
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    idx = np.arange(1_000, 1_480)
    actual = cum[idx + 1 + 5] - cum[idx + 1]
    ma60 = (cum[idx + 1] - cum[idx + 1 - 60]) / 60.0 * 5
    pred = model.predict_rows(rows[idx])[:, 0]
    assert _wape(pred, actual) < 0.8 * _wape(ma60, actual)


def test_training_ignores_history_after_until(periodic) -> None:
    hist, model = periodic
    keep = hist.arrival_s < 1_000.0
    cut = ArrivalHistory(
        arrival_s=hist.arrival_s[keep],
        context_tokens=hist.context_tokens[keep],
        generated_tokens=hist.generated_tokens[keep],
    )
    again = train_forecast_model(cut, origin_s=0.0, until_s=1_000.0, params=PARAMS)
    assert again.to_bytes() == model.to_bytes()
    assert model.version.trained_until_s == 1_000.0


def test_fast_path_matches_booster_predict(periodic) -> None:
    hist, model = periodic
    assert model.uses_fast_path
    rows, _, _ = build_feature_rows(hist, origin_s=0.0, n_bins=1_200)
    batch = model.predict_rows(rows[900:1_000])
    for i, row in enumerate(rows[900:1_000]):
        forecast = model.predict(row)
        assert forecast.horizons_s == (5, 30)
        assert forecast.values == pytest.approx(tuple(batch[i]), rel=1e-9, abs=1e-9)


def test_bytes_round_trip_preserves_predictions_and_version(periodic) -> None:
    hist, model = periodic
    data = model.to_bytes()
    loaded = ForecastModel.from_bytes(data)
    assert loaded.version == model.version
    assert loaded.version.model_id.startswith("requests-g1-")
    rows, _, _ = build_feature_rows(hist, origin_s=0.0, n_bins=1_100)
    np.testing.assert_allclose(loaded.predict_rows(rows[800:]), model.predict_rows(rows[800:]))
    assert loaded.to_bytes() == data


def test_from_bytes_refuses_another_feature_schema(periodic) -> None:
    _, model = periodic
    doc = json.loads(model.to_bytes())
    doc["version"]["feature_schema_version"] += 1
    with pytest.raises(ValueError, match="feature_schema_version"):
        ForecastModel.from_bytes(json.dumps(doc).encode())
    with pytest.raises(ValueError, match="format"):
        ForecastModel.from_bytes(b'{"format": "something-else"}')


def test_online_builder_and_model_give_the_offline_forecast(periodic) -> None:
    hist, model = periodic
    rows, _, _ = build_feature_rows(hist, origin_s=0.0, n_bins=1_100)
    builder = model.new_feature_builder(origin_s=0.0)
    for t, c, g in zip(hist.arrival_s, hist.context_tokens, hist.generated_tokens, strict=True):
        if t >= 1_050.0:
            break
        builder.observe_request(float(t), float(c), float(g))
    row = builder.row_at(1_050.0)
    # Equal up to rounding: offline closes empty bins one at a time, online in closed form.
    np.testing.assert_allclose(row, rows[1_049], rtol=1e-12)
    assert model.predict(row).values == pytest.approx(
        tuple(model.predict_rows(rows[1_049:1_050])[0])
    )


def test_kv_occupancy_model_learns_a_cycle() -> None:
    hist = _periodic_arrivals(1_500, seed=2)
    samples = [
        TelemetrySample(sample_s=float(t), kv_occupancy_frac=0.5 + 0.4 * math.sin(t / 100.0))
        for t in range(0, 1_500, 2)
    ]
    model = train_forecast_model(
        hist,
        samples,
        target=ForecastTarget.KV_OCCUPANCY,
        horizons_s=(30,),
        origin_s=0.0,
        until_s=1_200.0,
        params=TrainParams(num_boost_round=300, learning_rate=0.1),
    )
    rows, _, kv = build_feature_rows(hist, samples, origin_s=0.0, n_bins=1_460)
    idx = np.arange(1_210, 1_420)
    pred = model.predict_rows(rows[idx])[:, 0]
    future = kv[idx + 30]
    assert np.abs(pred - future).mean() < 0.5 * np.abs(kv[idx] - future).mean()
    assert np.all((pred >= 0.0) & (pred <= 1.0))


def test_on_off_traffic_starts_from_a_short_window_smooth_from_a_long_one() -> None:
    rng = np.random.default_rng(5)
    on = np.concatenate([s + rng.uniform(0, 100, 800) for s in range(0, 1_400, 200)])
    on_off = ArrivalHistory(
        arrival_s=np.sort(on), context_tokens=np.ones(len(on)), generated_tokens=np.ones(len(on))
    )
    smooth = np.sort(rng.uniform(0, 1_400, 5_600))
    steady = ArrivalHistory(
        arrival_s=smooth, context_tokens=np.ones(len(smooth)), generated_tokens=np.ones(len(smooth))
    )
    short = {"rate_5s", "rate_10s", "ewm_rate_hl10s"}
    fit = {"origin_s": 0.0, "until_s": 1_400.0, "params": PARAMS, "horizons_s": (5,)}
    assert set(train_forecast_model(on_off, **fit).level_features) <= short
    assert set(train_forecast_model(steady, **fit).level_features).isdisjoint(short)


def test_too_short_history_is_refused_with_the_window_named() -> None:
    hist = _periodic_arrivals(100, seed=3)
    with pytest.raises(ValueError, match="history"):
        train_forecast_model(hist, origin_s=0.0, until_s=60.0)


def test_feature_names_are_unique() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)


# -- retraining policy ---------------------------------------------------------------------------

POLICY = RetrainPolicy(min_history_s=1_800.0, max_model_age_s=3_600.0, max_history_s=86_400.0)


def _inputs(**kw: float | None) -> RetrainInputs:
    base: dict[str, float | None] = {
        "now_s": 100_000.0,
        "history_from_s": 0.0,
        "model_trained_until_s": 99_000.0,
        "last_retrain_s": 99_000.0,
    }
    base.update(kw)
    return RetrainInputs(**base)  # type: ignore[arg-type]


def test_retrain_when_there_is_no_model_on_a_sliding_window() -> None:
    d = decide_retrain(_inputs(model_trained_until_s=None, last_retrain_s=None), POLICY)
    assert d.retrain
    assert d.reason is RetrainReason.NO_MODEL
    assert (d.train_from_s, d.train_until_s) == (100_000.0 - 86_400.0, 100_000.0)


def test_no_retrain_on_too_little_history() -> None:
    d = decide_retrain(
        _inputs(history_from_s=99_000.0, model_trained_until_s=None, last_retrain_s=None), POLICY
    )
    assert not d.retrain
    assert d.reason is RetrainReason.TOO_LITTLE_HISTORY


def test_scheduled_retrain_when_the_model_is_old() -> None:
    d = decide_retrain(_inputs(model_trained_until_s=90_000.0, last_retrain_s=90_000.0), POLICY)
    assert d.retrain
    assert d.reason is RetrainReason.SCHEDULED


def test_retrain_when_losing_to_the_baseline_only_with_enough_evidence() -> None:
    losing = {"scored_model_abs_error": 300.0, "scored_baseline_abs_error": 200.0}
    assert decide_retrain(_inputs(**losing, scored_actual=1_000.0), POLICY).reason is (
        RetrainReason.LOSING_TO_BASELINE
    )
    assert not decide_retrain(_inputs(**losing, scored_actual=100.0), POLICY).retrain


def test_no_retrain_thrash_and_healthy_model_kept() -> None:
    recent = _inputs(
        model_trained_until_s=90_000.0,
        last_retrain_s=99_900.0,
        scored_model_abs_error=500.0,
        scored_baseline_abs_error=100.0,
        scored_actual=1_000.0,
    )
    assert decide_retrain(recent, POLICY).reason is RetrainReason.MODEL_OK
    healthy = _inputs(
        scored_model_abs_error=80.0, scored_baseline_abs_error=100.0, scored_actual=1_000.0
    )
    d = decide_retrain(healthy, POLICY)
    assert not d.retrain
    assert d.reason is RetrainReason.MODEL_OK
    assert math.isfinite(POLICY.losing_margin)
