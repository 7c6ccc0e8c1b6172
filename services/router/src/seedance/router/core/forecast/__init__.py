"""Forecasts of a replica's (or a model's) near-future load: requests and KV occupancy.

Pure core: arrays and samples in, models and forecasts out. The router shell feeds a
``FeatureBuilder`` with arrivals and telemetry, asks ``ForecastModel.predict`` per decision,
trains with ``train_forecast_model`` when ``decide_retrain`` says so, and stores
``ForecastModel.to_bytes()`` in the object store. Nothing here touches NATS, files or clocks.
"""

from seedance.router.core.forecast.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FeatureBuilder,
    TelemetrySample,
)
from seedance.router.core.forecast.kv_clock import DecodeClock
from seedance.router.core.forecast.kv_fallback import (
    ChangeWeightConfig,
    HeadChoiceConfig,
    KvHead,
    PairedTestConfig,
    follow_if_better,
    recent_change_weights,
    select_heads,
)
from seedance.router.core.forecast.kv_flow import (
    KvFlowParams,
    KvModeFit,
    ServerCounts,
    arrival_rate_window_s,
    choose_change_weight,
    expected_kv_change_tokens,
    fit_kv_flow_params,
    fit_kv_modes,
    forecast_kv_mib,
    kv_pool_bound,
    output_survival,
)
from seedance.router.core.forecast.kv_occupancy import (
    KV_CHANGE_FEATURE_NAMES,
    KvForecasterConfig,
    ObservedRequests,
    OnlineKvChangeForecaster,
    RequestLog,
    choose_kv_forecaster,
    decode_step_s,
    kv_change_features,
    replay_kv_forecaster,
    tokens_in_flight,
)
from seedance.router.core.forecast.model import (
    ArrivalHistory,
    ForecastModel,
    ForecastTarget,
    ModelForecast,
    ModelVersion,
    TrainParams,
    build_feature_rows,
    train_forecast_model,
)
from seedance.router.core.forecast.retrain import (
    RetrainDecision,
    RetrainInputs,
    RetrainPolicy,
    RetrainReason,
    decide_retrain,
)

__all__ = [
    "FEATURE_NAMES",
    "FEATURE_SCHEMA_VERSION",
    "KV_CHANGE_FEATURE_NAMES",
    "ArrivalHistory",
    "ChangeWeightConfig",
    "DecodeClock",
    "FeatureBuilder",
    "ForecastModel",
    "ForecastTarget",
    "HeadChoiceConfig",
    "KvFlowParams",
    "KvForecasterConfig",
    "KvHead",
    "KvModeFit",
    "ModelForecast",
    "ModelVersion",
    "ObservedRequests",
    "OnlineKvChangeForecaster",
    "PairedTestConfig",
    "RequestLog",
    "RetrainDecision",
    "RetrainInputs",
    "RetrainPolicy",
    "RetrainReason",
    "ServerCounts",
    "TelemetrySample",
    "TrainParams",
    "arrival_rate_window_s",
    "build_feature_rows",
    "choose_change_weight",
    "choose_kv_forecaster",
    "decide_retrain",
    "decode_step_s",
    "expected_kv_change_tokens",
    "fit_kv_flow_params",
    "fit_kv_modes",
    "follow_if_better",
    "forecast_kv_mib",
    "kv_change_features",
    "kv_pool_bound",
    "output_survival",
    "recent_change_weights",
    "replay_kv_forecaster",
    "select_heads",
    "tokens_in_flight",
    "train_forecast_model",
]
