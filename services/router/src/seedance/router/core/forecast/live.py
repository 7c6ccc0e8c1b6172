"""The forecast loop's state: arrivals in, per-model weight tables and retraining decisions out.

Owns: one `FeatureBuilder` per (model, replica) fed with the gateway's requests routed there and
a telemetry sample per tick (requests in flight as queue depth), one more for all arrivals
together (the series the model is trained and scored on), the arrival history kept for
retraining, the live scoring of the model against the 60-s moving average, and the installed
`ForecastModel`. Must not read a clock, publish, store or train: the service passes times (UTC
epoch seconds), acts on `retrain_decision`, trains `training_history()` off the event loop and
calls `install`.

Why one model for every replica: a model learns a correction to a trailing rate (see
docs/router-forecast.md), which transfers across series of different levels, and the pooled
arrivals of the whole gateway give it far more history than any one replica's.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from seedance.router.core.forecast import (
    ArrivalHistory,
    FeatureBuilder,
    ForecastModel,
    RetrainDecision,
    RetrainInputs,
    RetrainPolicy,
    TelemetrySample,
    decide_retrain,
)
from seedance.router.core.weight_table import WeightTable, weights_from_load

__all__ = ["ForecastLoop"]

_DEFAULT_RETRAIN = RetrainPolicy()
_SHORT_S, _LONG_S = 5, 30
# The scoring baseline, as in the retraining policy: the 60-s moving average.
_BASELINE_WINDOW_S = 60.0


class ForecastLoop:
    def __init__(
        self,
        *,
        models: Iterable[str],
        replicas: Iterable[str],
        origin_s: float,
        history_max_s: float,
        retrain_policy: RetrainPolicy = _DEFAULT_RETRAIN,
    ) -> None:
        self._models = tuple(models)
        self._replicas = tuple(replicas)
        self._origin_s = float(origin_s)
        self._history_from_s = float(origin_s)
        self._history_max_s = history_max_s
        self._policy = retrain_policy
        self._builders = {
            (m, r): FeatureBuilder(origin_s=origin_s) for m in self._models for r in self._replicas
        }
        self._total = FeatureBuilder(origin_s=origin_s)
        self._arrivals: list[float] = []
        self._last_s = float(origin_s)
        self.model: ForecastModel | None = None
        self.last_retrain_s: float | None = None
        self._pending: deque[tuple[float, float, float]] = deque()  # (made_at, model, baseline)
        self.scored_model_abs_error = 0.0
        self.scored_baseline_abs_error = 0.0
        self.scored_actual = 0.0

    def add_replica(self, replica: str) -> None:
        """Forecast `replica` too from now on (a replica that joined at run time)."""
        if replica in self._replicas:
            return
        self._replicas = (*self._replicas, replica)
        for m in self._models:
            self._builders[(m, replica)] = FeatureBuilder(origin_s=self._origin_s)

    # -- input -------------------------------------------------------------------------------

    def observe_arrival(self, model: str, replica: str, at_s: float) -> None:
        """A request routed to `replica`. Times must not go back (the service's clock is
        monotonic); a slightly earlier one is clamped to the latest seen."""
        at_s = max(at_s, self._last_s)
        self._last_s = at_s
        builder = self._builders.get((model, replica))
        if builder is not None:
            builder.observe_request(at_s)
        self._total.observe_request(at_s)
        self._arrivals.append(at_s)

    def install(self, model: ForecastModel, *, trained_at_s: float | None = None) -> None:
        """Serve `model` from now on; live scores restart with it."""
        self.model = model
        if trained_at_s is not None:
            self.last_retrain_s = trained_at_s
        self._pending.clear()
        self.scored_model_abs_error = self.scored_baseline_abs_error = self.scored_actual = 0.0

    # -- every tick --------------------------------------------------------------------------

    def tick(self, now_s: float, outstanding: Mapping[str, Mapping[str, int]]) -> list[WeightTable]:
        """Forecast every (model, replica) at `now_s`; one table per model, none without a model.

        `outstanding[model][replica]` is the gateway's count of requests in flight.
        """
        now_s = max(now_s, self._last_s)
        self._last_s = now_s
        self._trim(now_s)
        model = self.model
        if model is None:
            return []
        self._score(now_s, model)
        tables = []
        for m in self._models:
            in_flight = outstanding.get(m, {})
            qps_5s: dict[str, float] = {}
            qps_30s: dict[str, float] = {}
            load: dict[str, float] = {}
            for r in self._replicas:
                builder = self._builders[(m, r)]
                depth = in_flight.get(r, 0)
                builder.observe_sample(TelemetrySample(sample_s=now_s, queue_depth=float(depth)))
                # Python floats: the table is msgspec-encoded, which refuses numpy scalars
                values = [float(v) for v in model.predict(builder.row_at(now_s)).values]
                qps_5s[r] = values[0] / _SHORT_S
                qps_30s[r] = values[1] / _LONG_S
                load[r] = depth + values[0]
            tables.append(
                WeightTable(
                    model=m,
                    made_at_s=now_s,
                    model_id=model.version.model_id,
                    weights=weights_from_load(load),
                    qps_5s=qps_5s,
                    qps_30s=qps_30s,
                )
            )
        return tables

    def _count(self, from_s: float, until_s: float) -> int:
        """Arrivals in (from_s, until_s]."""
        a = self._arrivals
        return bisect.bisect_right(a, until_s) - bisect.bisect_right(a, from_s)

    def _score(self, now_s: float, model: ForecastModel) -> None:
        """Score forecasts whose 5-s window has closed; make this tick's aggregate forecast."""
        while self._pending and self._pending[0][0] + _SHORT_S <= now_s:
            made_at, predicted, baseline = self._pending.popleft()
            actual = self._count(made_at, made_at + _SHORT_S)
            self.scored_model_abs_error += abs(predicted - actual)
            self.scored_baseline_abs_error += abs(baseline - actual)
            self.scored_actual += actual
        if now_s - self._history_from_s < _BASELINE_WINDOW_S:
            return  # the baseline is not defined yet
        predicted = model.predict(self._total.row_at(now_s)).values[0]
        baseline = self._count(now_s - _BASELINE_WINDOW_S, now_s) * _SHORT_S / _BASELINE_WINDOW_S
        self._pending.append((now_s, predicted, baseline))

    def _trim(self, now_s: float) -> None:
        cut_s = now_s - self._history_max_s
        if cut_s <= self._history_from_s:
            return
        drop = bisect.bisect_right(self._arrivals, cut_s)
        # Trimming a list from the front is O(n): do it in chunks, not every tick.
        if drop >= 1024 or drop == len(self._arrivals):
            del self._arrivals[:drop]
            self._history_from_s = cut_s

    # -- retraining --------------------------------------------------------------------------

    def retrain_decision(self, now_s: float) -> RetrainDecision:
        model = self.model
        return decide_retrain(
            RetrainInputs(
                now_s=now_s,
                history_from_s=self._history_from_s,
                model_trained_until_s=None if model is None else model.version.trained_until_s,
                last_retrain_s=self.last_retrain_s,
                scored_model_abs_error=self.scored_model_abs_error,
                scored_baseline_abs_error=self.scored_baseline_abs_error,
                scored_actual=self.scored_actual,
            ),
            self._policy,
        )

    def training_history(self, from_s: float, until_s: float) -> ArrivalHistory:
        """Arrivals in [from_s, until_s); token counts are unknown to an OIP gateway (zeros)."""
        lo = bisect.bisect_left(self._arrivals, from_s)
        hi = bisect.bisect_left(self._arrivals, until_s)
        arrival_s = np.asarray(self._arrivals[lo:hi], dtype=np.float64)
        zeros = np.zeros(len(arrival_s))
        return ArrivalHistory(arrival_s=arrival_s, context_tokens=zeros, generated_tokens=zeros)

    @property
    def next_generation(self) -> int:
        return 1 if self.model is None else self.model.version.generation + 1
