"""The planner's load forecast: arrival rate, prompt-size moments and KV tokens at a horizon.

Owns a causal estimator fed with what the router observes (arrivals with their prompt sizes,
the fleet's KV tokens in use) and the margin it adds for its own forecast error. Must not do:
I/O, clocks, or look at anything not yet observed; the caller passes `now_s` and the
observations in time order.

Why a trailing level and not the LightGBM forecaster: on the Azure and Mooncake traces the
LightGBM QPS forecast does not beat a 30-60 s moving average at 5-30 s horizons
(docs/router-forecast.md, `make bench-predictor`), and at the planner's 75 s horizon there is
even less structure to learn from one hour. What the planner needs is an honest upper bound, so
the forecast is the trailing rate plus `z` times the RMS of the errors this same forecast made
at the same horizon in the past (measured as they come due, so it is causal and adapts to how
bursty the trace is). The KV forecast scales the KV in use now by the forecast rate over the
recent one (Little's law: KV in use = arrival rate x KV per request x residence time).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from seedance.router.core.planning.planner import LoadForecast

__all__ = ["LoadEstimator", "LoadEstimatorConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadEstimatorConfig:
    # Window of the rate level: long enough to average Poisson noise (~170 requests at 5.6/s).
    level_window_s: float = 60.0
    # Window of the prompt-size moments (they vary slowly).
    moments_window_s: float = 600.0
    # One-sided normal quantile of the margin: 1.64 ~ the 95th percentile of the error.
    z: float = 1.64
    # Errors kept for the margin's RMS: about the last half hour of 15 s decisions.
    error_samples: int = 120
    # Errors that must have come due before the margin is trusted: before, the margin is at
    # least the rate over the moments window (the planner must not scale down on a forecast
    # whose error it has not seen; on/off traffic scaled down in its first minutes and missed).
    min_error_samples: int = 8
    # Prompt-size quantiles handed to the planner (midpoints of this many equal shares).
    quantiles: int = 20

    def __post_init__(self) -> None:
        if self.level_window_s <= 0 or self.moments_window_s < self.level_window_s:
            raise ValueError("need 0 < level_window_s <= moments_window_s")
        if self.z < 0 or self.error_samples < 1:
            raise ValueError("z must be >= 0 and error_samples >= 1")


class LoadEstimator:
    """Causal load forecasts for one model; `observe_*` in time order, then `forecast`."""

    def __init__(self, cfg: LoadEstimatorConfig | None = None) -> None:
        self.cfg = cfg or LoadEstimatorConfig()
        self._arrivals: deque[tuple[float, int]] = deque()
        self._kv_used_tokens = 0.0
        # Forecasts made and not yet due: (due_s, horizon_s, forecast rate).
        self._open: deque[tuple[float, float, float]] = deque()
        self._errors: dict[float, deque[float]] = {}
        self._first_s: float | None = None

    def observe_arrival(self, arrival_s: float, prompt_tokens: int) -> None:
        if self._first_s is None:
            self._first_s = arrival_s
        self._arrivals.append((arrival_s, prompt_tokens))

    def observe_kv(self, kv_used_tokens: float) -> None:
        self._kv_used_tokens = kv_used_tokens

    def _rate(self, now_s: float, window_s: float) -> float:
        start = now_s - window_s
        if self._first_s is not None:
            # Before a full window has been seen, divide by the time actually observed.
            window_s = min(window_s, max(now_s - self._first_s, 1.0))
        n = sum(1 for t, _ in reversed(self._arrivals) if t > start)
        return n / window_s

    def _score(self, now_s: float) -> None:
        # A forecast made at t for horizon h is compared with the level seen at t + h.
        while self._open and self._open[0][0] <= now_s:
            _, horizon_s, predicted = self._open.popleft()
            errs = self._errors.setdefault(horizon_s, deque(maxlen=self.cfg.error_samples))
            errs.append(self._rate(now_s, self.cfg.level_window_s) - predicted)

    def margin_per_s(self, horizon_s: float, level_per_s: float = 0.0) -> float:
        """z x RMS of the past errors at this horizon; at least `level_per_s` until
        `min_error_samples` of them have come due (an unmeasured forecast is not trusted)."""
        errs = self._errors.get(horizon_s, ())
        margin = self.cfg.z * math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0
        if len(errs) < self.cfg.min_error_samples:
            margin = max(margin, level_per_s)
        return margin

    def forecast(self, now_s: float, horizons_s: tuple[float, ...]) -> list[LoadForecast]:
        cfg = self.cfg
        while self._arrivals and self._arrivals[0][0] <= now_s - cfg.moments_window_s:
            self._arrivals.popleft()
        self._score(now_s)
        level = self._rate(now_s, cfg.level_window_s)
        # The rate over the moments window: what an unmeasured forecast is padded with (a
        # trailing minute can be empty between bursts).
        long_level = self._rate(now_s, cfg.moments_window_s)
        prompts = [p for _, p in self._arrivals]
        mean = sum(prompts) / len(prompts) if prompts else 0.0
        sq = sum(p * p for p in prompts) / len(prompts) if prompts else 0.0
        ordered = sorted(prompts)
        q = cfg.quantiles
        quantiles = (
            tuple(float(ordered[int((k + 0.5) / q * len(ordered))]) for k in range(q))
            if ordered
            else ()
        )
        out = []
        for h in horizons_s:
            if h > 0:
                self._open.append((now_s + h, h, level))
            rate = level + self.margin_per_s(h, long_level if h > 0 else 0.0)
            kv = self._kv_used_tokens * (rate / level) if level > 0 else self._kv_used_tokens
            out.append(
                LoadForecast(
                    horizon_s=h,
                    arrivals_per_s=rate,
                    prompt_tokens_mean=mean,
                    prompt_tokens_sq_mean=max(sq, mean * mean),
                    kv_used_tokens=kv,
                    prompt_tokens_quantiles=quantiles,
                )
            )
        # Due times are increasing only per horizon; keep the queue ordered for _score.
        self._open = deque(sorted(self._open))
        return out
