"""The planner's load forecast: arrival rate, prompt-size moments and KV tokens at a horizon.

Owns a causal estimator fed with what the router observes (arrivals with their prompt sizes,
the fleet's KV tokens in use) and the margin it adds for its own forecast error. Must not do:
I/O, clocks, or look at anything not yet observed; the caller passes `now_s` and the
observations in time order.

Why a trailing level and not the LightGBM forecaster: on the Azure and Mooncake traces the
LightGBM QPS forecast does not beat a 30-60 s moving average at 5-30 s horizons
(docs/router-forecast.md, `make bench-predictor`), and at the planner's 75 s horizon there is
even less structure to learn from one hour. What the planner needs is an honest upper bound, so
the forecast is the trailing rate plus a margin: the `margin_quantile` of the errors this same
forecast made at the same horizon in the past (measured as they come due, so it is causal and
adapts to how the trace moves). Whether following it keeps the SLO at all is the planner's to
judge, on the demand it then observes (`planning.demand`). The KV forecast scales the KV in use
now by the forecast rate over the recent one (Little's law: KV in use = arrival rate x KV per
request x residence time).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from seedance.router.core.planning.sizing import LoadForecast

__all__ = ["EstimatorState", "LoadEstimator", "LoadEstimatorConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadEstimatorConfig:
    # Window of the rate level: long enough to average Poisson noise (~170 requests at 5.6/s).
    level_window_s: float = 60.0
    # Window of the prompt-size moments (they vary slowly).
    moments_window_s: float = 600.0
    # The margin is this quantile of the past errors (the SLO target's share of them).
    margin_quantile: float = 0.95
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
        if not 0.0 < self.margin_quantile <= 1.0 or self.error_samples < 1:
            raise ValueError(
                f"need 0 < margin_quantile <= 1 and error_samples >= 1, got "
                f"{self.margin_quantile} and {self.error_samples}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class EstimatorState:
    """A `LoadEstimator`'s memory as one serialisable value (`LoadEstimator.state`)."""

    arrivals: tuple[tuple[float, int], ...] = ()
    kv_used_tokens: float = 0.0
    # Forecasts made and not yet due: (due_s, horizon_s, forecast rate).
    open: tuple[tuple[float, float, float], ...] = ()
    # (horizon_s, its errors, oldest first).
    errors: tuple[tuple[float, tuple[float, ...]], ...] = ()
    first_s: float | None = None


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

    def observe_arrivals(self, arrivals: list[tuple[float, int]]) -> None:
        """Several arrivals at once, in any order relative to those already observed (the
        fleet's planner merges gateways' observations); kept in time order."""
        if not arrivals:
            return
        first = min(t for t, _ in arrivals)
        self._first_s = first if self._first_s is None else min(self._first_s, first)
        if self._arrivals and first < self._arrivals[-1][0]:
            self._arrivals = deque(sorted([*self._arrivals, *arrivals]))
        else:
            self._arrivals.extend(sorted(arrivals))

    def state(self) -> EstimatorState:
        return EstimatorState(
            arrivals=tuple(self._arrivals),
            kv_used_tokens=self._kv_used_tokens,
            open=tuple(self._open),
            errors=tuple((h, tuple(e)) for h, e in sorted(self._errors.items())),
            first_s=self._first_s,
        )

    @classmethod
    def restore(
        cls, state: EstimatorState, cfg: LoadEstimatorConfig | None = None
    ) -> LoadEstimator:
        est = cls(cfg)
        est._arrivals = deque(state.arrivals)
        est._kv_used_tokens = state.kv_used_tokens
        est._open = deque(state.open)
        est._errors = {h: deque(e, maxlen=est.cfg.error_samples) for h, e in state.errors}
        est._first_s = state.first_s
        return est

    def observe_kv(self, kv_used_tokens: float) -> None:
        self._kv_used_tokens = kv_used_tokens

    def recent_arrivals(self, now_s: float, window_s: float) -> list[tuple[float, float]]:
        """(arrival_s, prompt tokens) of the arrivals in [now_s - window_s, now_s), in order
        (at most `moments_window_s` back): the observed demand the planner replays."""
        start = now_s - window_s
        out = [(t, float(p)) for t, p in reversed(self._arrivals) if start <= t < now_s]
        out.reverse()
        return out

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
        """The `margin_quantile` of the past errors at this horizon (never below 0); at least
        `level_per_s` until `min_error_samples` of them have come due (an unmeasured forecast
        is not trusted)."""
        errs = sorted(self._errors.get(horizon_s, ()))
        margin = (
            max(0.0, errs[min(len(errs) - 1, math.ceil(self.cfg.margin_quantile * len(errs)) - 1)])
            if errs
            else 0.0
        )
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
            # KV scales with the rate (Little's law); over the larger of the two levels, so a
            # minute that has barely begun does not multiply the KV in use by its margin (at a
            # burst's first requests the ratio to the minute's rate reads 10x and KV "binds").
            base = max(level, long_level)
            kv = self._kv_used_tokens * (rate / base) if base > 0 else self._kv_used_tokens
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
