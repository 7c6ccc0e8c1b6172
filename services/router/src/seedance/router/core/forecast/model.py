"""Forecast models: training from history, the versioned model object, bytes round trip.

Owns how a request-count or KV-occupancy forecast is learnt and served: the training rows
(built by the same ``FeatureBuilder`` the router runs online), the target transform, LightGBM's
parameters, and the serialised form kept in the object store. It must not read files, the bus or
a clock; histories come in as arrays and the model goes out as bytes.

Request counts are learnt as a *correction to a trailing mean*: per horizon, training picks the
trailing rate (5 s … 120 s window, or an EWM) with the lowest WAPE on the training span, the label
is count / (that rate × H) − 1, boosting starts from 0 (i.e. from that mean itself, not from the
training median), the objective is L1 weighted by the level — exactly Σ|error| on
counts, the WAPE the benchmark scores — and the number of trees is chosen by early stopping on
the last quarter of the training span. So the model only departs from the moving average by as
much as held-out history says it earns: on a trace with no predictable structure beyond the level
it degrades to the best trailing mean instead of overfitting an hour of autocorrelated rows (plain
LightGBM lost to the moving average in research/router.md §2.2).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum

import lightgbm as lgb
import numpy as np

from seedance.router.core.forecast.fastpath import RowPredictor
from seedance.router.core.forecast.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FeatureBuilder,
    TelemetrySample,
)

__all__ = [
    "ArrivalHistory",
    "ForecastModel",
    "ForecastTarget",
    "ModelForecast",
    "ModelVersion",
    "TrainParams",
    "build_feature_rows",
    "train_forecast_model",
]

_FORMAT = "seedance.router.forecast"
_FORMAT_VERSION = 1
# Candidate levels a request head starts from: trailing means at several scales. Training picks,
# per horizon, the one with the lowest WAPE on the training span (smooth traffic: the 60-s mean;
# on/off traffic: a short window), and the trees then learn corrections to it.
LEVEL_FEATURES: tuple[str, ...] = (
    "rate_5s",
    "rate_10s",
    "rate_30s",
    "rate_60s",
    "rate_120s",
    "ewm_rate_hl10s",
    "ewm_rate_hl30s",
)
_KV_FEATURE = FEATURE_NAMES.index("kv_occupancy_frac")
# Days of history before time-of-day features are switched on (see FeatureBuilder).
TIME_OF_DAY_MIN_HISTORY_S = 2 * 86_400.0


class ForecastTarget(StrEnum):
    REQUESTS = "requests"  # number of requests arriving in (t, t + H]
    KV_OCCUPANCY = "kv_occupancy"  # KV-cache occupancy fraction at t + H


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrivalHistory:
    """Request arrivals of one replica or model, sorted by time (epoch or trace seconds)."""

    arrival_s: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.context_tokens) != n or len(self.generated_tokens) != n:
            raise ValueError(
                f"arrival_s, context_tokens, generated_tokens lengths differ: {n}, "
                f"{len(self.context_tokens)}, {len(self.generated_tokens)}"
            )
        if n > 1 and bool(np.any(np.diff(self.arrival_s) < 0)):
            raise ValueError("arrival_s must be sorted in time order")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainParams:
    """LightGBM settings. Small trees and strong leaf minimums: an hour is only ~2,500 rows."""

    num_boost_round: int = 300  # upper bound; early stopping usually picks fewer
    learning_rate: float = 0.03
    num_leaves: int = 4
    min_data_in_leaf: int = 200
    validation_frac: float = 0.25  # tail of the training span used to pick the number of trees
    early_stopping_rounds: int = 30
    feature_fraction: float = 0.8
    bagging_fraction: float = 0.8
    bagging_freq: int = 1
    lambda_l2: float = 1.0
    seed: int = 0
    # One thread: training shares cores with the router; OpenMP oversubscription is 50–100× slower.
    num_threads: int = 1

    def lgb_params(self, objective: str, *, boost_from_average: bool) -> dict[str, object]:
        return {
            "objective": objective,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_data_in_leaf,
            "feature_fraction": self.feature_fraction,
            "bagging_fraction": self.bagging_fraction,
            "bagging_freq": self.bagging_freq,
            "lambda_l2": self.lambda_l2,
            "seed": self.seed,
            "num_threads": self.num_threads,
            "deterministic": True,
            "force_row_wise": True,
            "verbosity": -1,
            "boost_from_average": boost_from_average,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelVersion:
    """Identity of a trained model, as stored next to its bytes in the object store."""

    model_id: str  # f"{target}-g{generation}-{content hash}"
    generation: int  # incremented by each retrain of the same target
    target: ForecastTarget
    feature_schema_version: int
    trained_from_s: float
    trained_until_s: float  # no training target lies after this time
    n_train_rows: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelForecast:
    """One forecast: ``values[i]`` is for ``horizons_s[i]``.

    Requests expected in ``(t, t + H]``, or the KV occupancy fraction at ``t + H``.
    """

    target: ForecastTarget
    horizons_s: tuple[int, ...]
    values: tuple[float, ...]
    model_id: str


def build_feature_rows(
    arrivals: ArrivalHistory,
    samples: Sequence[TelemetrySample] = (),
    *,
    origin_s: float,
    n_bins: int,
    with_time_of_day: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replay a history through ``FeatureBuilder``: one row at the end of each one-second bin.

    Returns ``(rows, counts, kv)``: ``rows[i]`` is the feature row at ``origin_s + i + 1``,
    ``counts[i]`` the arrivals in bin ``i`` and ``kv[i]`` the latest KV occupancy at that time
    (NaN if none). Arrivals before ``origin_s`` are skipped; the same code runs in the router.
    """
    builder = FeatureBuilder(origin_s=origin_s, with_time_of_day=with_time_of_day)
    rows = np.empty((n_bins, len(FEATURE_NAMES)))
    counts = np.zeros(n_bins)
    ts = arrivals.arrival_s
    first = int(np.searchsorted(ts, origin_s, side="left"))
    end = origin_s + n_bins
    last = int(np.searchsorted(ts, end, side="left"))
    bins = np.floor(ts[first:last] - origin_s).astype(np.int64)
    np.add.at(counts, bins, 1.0)
    ts_l = ts.tolist()
    ctx_l = arrivals.context_tokens.tolist()
    gen_l = arrivals.generated_tokens.tolist()
    sample_list = list(samples)
    si = 0
    ai = first
    for i in range(n_bins):
        t_end = origin_s + i + 1
        while ai < last and ts_l[ai] < t_end:
            builder.observe_request(ts_l[ai], ctx_l[ai], gen_l[ai])
            ai += 1
        while si < len(sample_list) and sample_list[si].sample_s <= t_end:
            builder.observe_sample(sample_list[si])
            si += 1
        builder.row_at(t_end, out=rows[i])
    kv = rows[:, _KV_FEATURE].copy()
    return rows, counts, kv


def _content_hash(model_strings: Sequence[str]) -> str:
    h = hashlib.sha256()
    for s in model_strings:
        h.update(s.encode())
    return h.hexdigest()[:12]


@dataclass(slots=True, kw_only=True)
class _Head:
    horizon_s: int
    level_feature: str  # request heads: the trailing rate the label is relative to
    booster: lgb.Booster
    predictor: RowPredictor = field(init=False)
    level_index: int = field(init=False)

    def __post_init__(self) -> None:
        self.predictor = RowPredictor(self.booster, len(FEATURE_NAMES))
        self.level_index = FEATURE_NAMES.index(self.level_feature)


class ForecastModel:
    """A trained forecaster: one LightGBM booster per horizon, predicting from a feature row.

    Build with ``train_forecast_model`` or ``ForecastModel.from_bytes``; store with ``to_bytes``.
    """

    def __init__(
        self,
        *,
        version: ModelVersion,
        boosters: Sequence[tuple[int, str, lgb.Booster]],
        level_floor_per_s: float,
        with_time_of_day: bool,
    ) -> None:
        self.version = version
        self.target = version.target
        self.horizons_s = tuple(h for h, _, _ in boosters)
        self.level_floor_per_s = level_floor_per_s
        self.with_time_of_day = with_time_of_day
        self._heads = [_Head(horizon_s=h, level_feature=f, booster=b) for h, f, b in boosters]

    @property
    def level_features(self) -> tuple[str, ...]:
        """Per horizon, the feature the head's forecast is a correction to."""
        return tuple(h.level_feature for h in self._heads)

    @property
    def uses_fast_path(self) -> bool:
        return all(h.predictor.uses_fast_path for h in self._heads)

    def new_feature_builder(self, *, origin_s: float) -> FeatureBuilder:
        """A builder configured like the one this model was trained with."""
        return FeatureBuilder(origin_s=origin_s, with_time_of_day=self.with_time_of_day)

    def _finish(self, head: _Head, raw: float, row: np.ndarray) -> float:
        horizon_s = head.horizon_s
        if self.target is ForecastTarget.REQUESTS:
            level = row[head.level_index]
            level = self.level_floor_per_s if not level > self.level_floor_per_s else level
            return max(1.0 + raw, 0.0) * level * horizon_s
        kv_now = row[_KV_FEATURE]
        base = 0.0 if math.isnan(kv_now) else kv_now
        return min(max(base + raw, 0.0), 1.0)

    def predict_horizon(self, index: int, row: np.ndarray) -> float:
        """Forecast for ``horizons_s[index]`` from one feature row (fast single-row path)."""
        head = self._heads[index]
        return self._finish(head, head.predictor.predict(row), row)

    def predict(self, row: np.ndarray) -> ModelForecast:
        """Forecasts for every horizon from one feature row."""
        values = tuple(self.predict_horizon(i, row) for i in range(len(self._heads)))
        return ModelForecast(
            target=self.target,
            horizons_s=self.horizons_s,
            values=values,
            model_id=self.version.model_id,
        )

    def predict_rows(self, rows: np.ndarray) -> np.ndarray:
        """Batch prediction (offline evaluation): shape ``(n_rows, n_horizons)``."""
        out = np.empty((len(rows), len(self._heads)))
        for j, head in enumerate(self._heads):
            raw = np.asarray(head.booster.predict(rows, num_threads=1))
            if self.target is ForecastTarget.REQUESTS:
                level = np.nan_to_num(rows[:, head.level_index], nan=0.0)
                level = np.maximum(level, self.level_floor_per_s)
                out[:, j] = np.maximum(1.0 + raw, 0.0) * level * head.horizon_s
            else:
                base = np.nan_to_num(rows[:, _KV_FEATURE], nan=0.0)
                out[:, j] = np.clip(base + raw, 0.0, 1.0)
        return out

    # -- bytes ---------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        """Self-describing JSON document holding each booster's ``model_to_string``."""
        doc = {
            "format": _FORMAT,
            "format_version": _FORMAT_VERSION,
            "feature_names": list(FEATURE_NAMES),
            "version": {**asdict(self.version), "target": str(self.version.target)},
            "level_floor_per_s": self.level_floor_per_s,
            "with_time_of_day": self.with_time_of_day,
            "heads": [
                {
                    "horizon_s": h.horizon_s,
                    "level_feature": h.level_feature,
                    "model": h.booster.model_to_string(),
                }
                for h in self._heads
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ForecastModel:
        """Inverse of ``to_bytes``; refuses another format or feature schema."""
        doc = json.loads(data)
        if doc.get("format") != _FORMAT or doc.get("format_version") != _FORMAT_VERSION:
            raise ValueError(
                f"not a {_FORMAT} v{_FORMAT_VERSION} document: format={doc.get('format')!r} "
                f"format_version={doc.get('format_version')!r}"
            )
        v = doc["version"]
        if (
            v["feature_schema_version"] != FEATURE_SCHEMA_VERSION
            or tuple(doc["feature_names"]) != FEATURE_NAMES
        ):
            raise ValueError(
                f"feature_schema_version={v['feature_schema_version']!r} does not match this "
                f"code's {FEATURE_SCHEMA_VERSION}: retrain the model"
            )
        version = ModelVersion(**{**v, "target": ForecastTarget(v["target"])})
        boosters = [
            (int(h["horizon_s"]), str(h["level_feature"]), lgb.Booster(model_str=h["model"]))
            for h in doc["heads"]
        ]
        return cls(
            version=version,
            boosters=boosters,
            level_floor_per_s=float(doc["level_floor_per_s"]),
            with_time_of_day=bool(doc["with_time_of_day"]),
        )


def _best_level(x: np.ndarray, y_count: np.ndarray, horizon_s: int, floor: float) -> str:
    """The candidate trailing rate whose forecast (rate × H) has the lowest training WAPE."""
    total = max(float(y_count.sum()), 1e-9)

    def wape(name: str) -> float:
        level = np.maximum(np.nan_to_num(x[:, FEATURE_NAMES.index(name)], nan=0.0), floor)
        return float(np.abs(level * horizon_s - y_count).sum()) / total

    return min(LEVEL_FEATURES, key=wape)


def _fit(
    params: TrainParams,
    objective: str,
    x: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    gap: int,
    from_baseline: bool,
) -> lgb.Booster:
    """Pick the number of trees on the time-ordered tail of the rows, then refit on all rows.

    ``from_baseline``: boosting starts at label 0 (the baseline the label is relative to), so
    early stopping can leave the baseline untouched; otherwise it starts at the label mean.
    """
    lgb_params = params.lgb_params(objective, boost_from_average=not from_baseline)
    n = len(y)
    n_val = int(params.validation_frac * n)
    rounds = params.num_boost_round
    n_fit = n - n_val - gap  # a horizon-long gap: no training target overlaps a validation one
    if n_val >= 50 and n_fit >= 100:
        fit_ds = lgb.Dataset(x[:n_fit], label=y[:n_fit], weight=w[:n_fit])
        val_ds = lgb.Dataset(x[n - n_val :], label=y[n - n_val :], weight=w[n - n_val :])
        probe = lgb.train(
            lgb_params,
            fit_ds,
            num_boost_round=rounds,
            valid_sets=[val_ds],
            callbacks=[lgb.early_stopping(params.early_stopping_rounds, verbose=False)],
        )
        rounds = max(int(probe.best_iteration), 1)
    ds = lgb.Dataset(x, label=y, weight=w, feature_name=list(FEATURE_NAMES))
    return lgb.train(lgb_params, ds, num_boost_round=rounds)


def train_forecast_model(
    arrivals: ArrivalHistory,
    samples: Sequence[TelemetrySample] = (),
    *,
    target: ForecastTarget = ForecastTarget.REQUESTS,
    horizons_s: Sequence[int] = (5, 30),
    origin_s: float,
    until_s: float,
    params: TrainParams = TrainParams(),
    generation: int = 1,
) -> ForecastModel:
    """Train one booster per horizon on the history in ``[origin_s, until_s)``.

    No training target reaches past ``until_s``: the row at ``t`` is used for horizon ``H`` only
    if ``t + H <= until_s``. Returns a versioned model ready to predict and to serialise.
    """
    n_bins = math.floor(until_s - origin_s)
    max_h = max(horizons_s)
    if n_bins < max_h + 60:
        raise ValueError(
            f"history [{origin_s!r}, {until_s!r}) has {n_bins} s, fewer than the longest "
            f"horizon ({max_h} s) plus 60 s"
        )
    with_tod = (until_s - origin_s) >= TIME_OF_DAY_MIN_HISTORY_S
    rows, counts, kv = build_feature_rows(
        arrivals, samples, origin_s=origin_s, n_bins=n_bins, with_time_of_day=with_tod
    )
    level_floor = 0.05 * max(float(counts.mean()), 1e-3)
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    boosters: list[tuple[int, str, lgb.Booster]] = []
    n_rows = 0
    for h in horizons_s:
        if h < 1:
            raise ValueError(f"horizons_s must be whole seconds >= 1, got {h!r}")
        # Skip the first minute: the 60-s level is not yet defined there.
        idx = np.arange(min(60, n_bins - h - 1), n_bins - h)
        x = rows[idx]
        if target is ForecastTarget.REQUESTS:
            y_count = cum[idx + 1 + h] - cum[idx + 1]
            level_feature = _best_level(x, y_count, h, level_floor)
            level = (
                np.maximum(
                    np.nan_to_num(x[:, FEATURE_NAMES.index(level_feature)], nan=0.0), level_floor
                )
                * h
            )
            y, w = y_count / level - 1.0, level
            objective = "l1"
        else:
            level_feature = "kv_occupancy_frac"  # KV heads learn the change from the current value
            kv_future = kv[idx + h]
            keep = ~np.isnan(kv_future)
            x, kv_future = x[keep], kv_future[keep]
            if len(x) == 0:
                raise ValueError("target=kv_occupancy needs samples with kv_occupancy_frac")
            y = kv_future - np.nan_to_num(x[:, _KV_FEATURE], nan=0.0)
            w = np.ones(len(y))
            objective = "l2"
        booster = _fit(
            params, objective, x, y, w, gap=h, from_baseline=target is ForecastTarget.REQUESTS
        )
        boosters.append((int(h), level_feature, booster))
        n_rows = max(n_rows, len(y))
    digest = _content_hash([b.model_to_string() for _, _, b in boosters])
    version = ModelVersion(
        model_id=f"{target}-g{generation}-{digest}",
        generation=generation,
        target=target,
        feature_schema_version=FEATURE_SCHEMA_VERSION,
        trained_from_s=float(origin_s),
        trained_until_s=float(origin_s + n_bins),
        n_train_rows=n_rows,
    )
    return ForecastModel(
        version=version,
        boosters=boosters,
        level_floor_per_s=level_floor,
        with_time_of_day=with_tod,
    )
