"""A simple forecast source for the replay, standing in for the LightGBM forecaster.

Every `tick_s` of virtual time it publishes, per replica: QPS 5 s and 30 s ahead = the mean
arrival rate over the trailing `window_s` (the moving average the research note found hardest
to beat on the Azure conversation trace), and KV occupancy 5 s / 30 s ahead = the current
occupancy extrapolated along its trend over the last `trend_s`, clipped to [0, capacity].
The forecast is stamped with the tick time, so a policy sees its age exactly as it would on the
bus. Must not do: look at the future of the trace (it sees only what a replica exposes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from seedance.bench.router_sim.interfaces import ForecastSource, ReplicaSnapshot
from seedance.router.core.policy.state import Forecast, ReplicaForecast

__all__ = ["MovingAverageForecastSource", "NoForecastSource"]


class MovingAverageForecastSource(ForecastSource):
    """Moving-average QPS and linear-trend KV occupancy, republished every `tick_s`."""

    def __init__(
        self,
        kv_capacity_tokens: int,
        tick_s: float = 1.0,
        window_s: float = 30.0,
        trend_s: float = 5.0,
    ) -> None:
        self._cap = kv_capacity_tokens
        self._tick_s = tick_s
        self._window = max(1, round(window_s / tick_s))
        self._trend = max(1, round(trend_s / tick_s))
        self._arrivals: dict[str, deque[int]] = {}
        self._kv: dict[str, deque[int]] = {}

    @property
    def tick_s(self) -> float:
        return self._tick_s

    def observe(self, now_s: float, replicas: Sequence[ReplicaSnapshot]) -> Forecast:
        out: dict[str, ReplicaForecast] = {}
        for snap in replicas:
            arr = self._arrivals.setdefault(snap.replica_id, deque(maxlen=self._window))
            kv = self._kv.setdefault(snap.replica_id, deque(maxlen=self._trend + 1))
            arr.append(snap.arrivals_since_last_tick)
            kv.append(snap.kv_used_tokens)
            qps = sum(arr) / (len(arr) * self._tick_s)
            slope = (kv[-1] - kv[0]) / ((len(kv) - 1) * self._tick_s) if len(kv) > 1 else 0.0
            out[snap.replica_id] = ReplicaForecast(
                qps_5s=qps,
                qps_30s=qps,
                kv_used_tokens_5s=min(max(kv[-1] + 5.0 * slope, 0.0), self._cap),
                kv_used_tokens_30s=min(max(kv[-1] + 30.0 * slope, 0.0), self._cap),
            )
        return Forecast(made_at_s=now_s, replicas=out)


class NoForecastSource(ForecastSource):
    """Publishes nothing: exercises the policies' missing-forecast fallback."""

    def __init__(self, tick_s: float = 1.0) -> None:
        self._tick_s = tick_s

    @property
    def tick_s(self) -> float:
        return self._tick_s

    def observe(self, now_s: float, replicas: Sequence[ReplicaSnapshot]) -> None:
        return None
