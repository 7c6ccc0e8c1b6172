"""Autoscaling policies for the replay: reactive (HPA-, Knative-style), predictive, oracle.

Owns the `Scaler`s the autoscaling benchmark compares; each turns the `FleetObservation` of a
tick into a replica count. Must not do: simulate, read clocks, or (except the oracle, which is
the floor no forecast can beat) look at anything not yet observed.

* `HpaScaler`: Kubernetes HPA's algorithm on the replicas' mean KV-cache utilisation (vLLM's
  `kv_cache_usage_perc`, the saturation metric GKE's LLM autoscaling guide names): every 15 s
  (the HPA sync period) `desired = ceil(ready x utilisation / target)`, nothing within the 10 %
  tolerance, scale-up at once, scale-down to the highest recommendation of the stabilisation
  window.
* `KpaScaler`: Knative's KPA on in-flight requests per replica (waiting + running): sampled
  every 2 s (its tick), `desired = ceil(mean concurrency over the stable window / target)`;
  panic when the panic window's mean reaches 200 % of the ready replicas' target, during which it
  never scales down, for one stable window after the last panicking tick; scale-down at most
  halves the fleet per tick (max-scale-down-rate 2).
* `PlannerScaler`: the predictive planner (`seedance.router.core.planning.planner`) fed by
  `LoadEstimator`.
* `OracleScaler`: the same planner fed with the true future arrivals of the trace.
* `ConstantScaler`: one count asked at every tick from the first; with the count chosen in
  hindsight, the clairvoyant bound (`seedance.bench.planner_replay --bound`).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Sequence

from seedance.bench.router_sim.interfaces import FleetObservation, Scaler
from seedance.router.core.planning.load import LoadEstimator
from seedance.router.core.planning.planner import (
    LoadForecast,
    ObservedSlo,
    PlannerConfig,
    PlannerMode,
    PlanState,
    ReplicaCapacity,
    plan,
)
from seedance.traces.llm_requests import TraceRequest

__all__ = ["ConstantScaler", "HpaScaler", "KpaScaler", "OracleScaler", "PlannerScaler"]


class ConstantScaler(Scaler):
    """Asks `replicas` at every tick, from its first: a policy that knows the answer and needs no
    observation (what a scaler that knew the count at its first decision could do)."""

    def __init__(self, replicas: int, tick_s: float) -> None:
        self.replicas = replicas
        self._tick_s = tick_s

    @property
    def tick_s(self) -> float:
        return self._tick_s

    def desired(self, obs: FleetObservation) -> int:
        return self.replicas


class HpaScaler(Scaler):
    TOLERANCE = 0.1

    def __init__(
        self, target_utilisation: float, *, stabilisation_s: float = 60.0, sync_s: float = 15.0
    ) -> None:
        if not 0.0 < target_utilisation <= 1.0:
            raise ValueError(f"target_utilisation must be in (0, 1], got {target_utilisation}")
        self.target = target_utilisation
        self.stabilisation_s = stabilisation_s
        self._sync_s = sync_s
        self._recs: deque[tuple[float, int]] = deque()

    @property
    def tick_s(self) -> float:
        return self._sync_s

    def desired(self, obs: FleetObservation) -> int:
        ready = obs.ready
        current = len(ready) + obs.starting
        if not ready:
            return current
        util = sum(r.kv_used_tokens / r.kv_capacity_tokens for r in ready) / len(ready)
        ratio = util / self.target
        rec = current if abs(ratio - 1.0) <= self.TOLERANCE else math.ceil(len(ready) * ratio)
        rec = max(rec, 1)
        self._recs.append((obs.now_s, rec))
        while self._recs[0][0] <= obs.now_s - self.stabilisation_s:
            self._recs.popleft()
        if rec > current:
            return rec
        return min(current, max(r for _, r in self._recs))


class KpaScaler(Scaler):
    PANIC_THRESHOLD = 2.0
    MAX_SCALE_DOWN_RATE = 2.0

    def __init__(
        self,
        target_concurrency: float,
        *,
        stable_s: float = 60.0,
        panic_s: float = 6.0,
        tick_s: float = 2.0,
    ) -> None:
        if target_concurrency <= 0:
            raise ValueError(f"target_concurrency must be > 0, got {target_concurrency}")
        self.target = target_concurrency
        self.stable_s = stable_s
        self.panic_s = panic_s
        self._tick_s = tick_s
        self._samples: deque[tuple[float, int]] = deque()
        self._panic_until_s = -math.inf

    @property
    def tick_s(self) -> float:
        return self._tick_s

    def desired(self, obs: FleetObservation) -> int:
        now = obs.now_s
        current = len(obs.ready) + obs.starting
        self._samples.append((now, sum(r.waiting + r.running for r in obs.ready)))
        while self._samples[0][0] <= now - self.stable_s:
            self._samples.popleft()
        stable = sum(c for _, c in self._samples) / len(self._samples)
        recent = [c for t, c in self._samples if t > now - self.panic_s]
        panic = sum(recent) / len(recent)
        want_stable = math.ceil(stable / self.target)
        want_panic = math.ceil(panic / self.target)
        if panic / max(len(obs.ready), 1) >= self.PANIC_THRESHOLD * self.target:
            self._panic_until_s = now + self.stable_s
        if now < self._panic_until_s:
            return max(current, want_panic)
        floor = math.ceil(current / self.MAX_SCALE_DOWN_RATE)
        return max(want_stable, floor, 1)


class PlannerScaler(Scaler):
    """The predictive planner as the router service runs it, on the replay's observations."""

    def __init__(
        self,
        cfg: PlannerConfig,
        capacity: ReplicaCapacity,
        initial_replicas: int,
        estimator: LoadEstimator | None = None,
    ) -> None:
        self.cfg = cfg
        self.capacity = capacity
        self.estimator = estimator or LoadEstimator()
        self.state = PlanState(replicas=initial_replicas)
        self.horizons_s = (0.0, cfg.lead_s)
        # Decisions by the rule that set them (the bench's planner_mode_pct).
        self.modes: Counter[PlannerMode] = Counter()

    @property
    def tick_s(self) -> float:
        return self.cfg.interval_s

    def desired(self, obs: FleetObservation) -> int:
        for t, prompt in obs.arrivals:
            self.estimator.observe_arrival(t, prompt)
        self.estimator.observe_kv(obs.kv_used_tokens)
        loads = self.estimator.forecast(obs.now_s, self.horizons_s)
        self.state, rec = plan(
            self.state,
            obs.now_s,
            loads,
            self.capacity,
            self.cfg,
            observed_slo(obs, self.capacity, self.cfg.ttft_slo_s, self.cfg.interval_s),
            self.estimator.recent_arrivals(obs.now_s, self.cfg.arrivals_window_s),
        )
        self.modes[rec.mode] += 1
        return rec.replicas


def observed_slo(
    obs: FleetObservation, capacity: ReplicaCapacity, slo_s: float, group_s: float = 15.0
) -> ObservedSlo:
    """The tick's first tokens of requests an idle replica serves within the SLO, and met,
    also grouped by when they arrived (`group_s` bins, filed at each bin's start)."""
    servable = [
        (ttft, arrival_s)
        for ttft, prompt, arrival_s in obs.first_tokens
        if capacity.prefill_overhead_s + prompt / capacity.prefill_tokens_per_s <= slo_s
    ]
    bins: dict[float, list[int]] = {}
    for ttft, arrival_s in servable:
        b = bins.setdefault(math.floor(arrival_s / group_s) * group_s, [0, 0])
        b[0] += ttft <= slo_s
        b[1] += 1
    return ObservedSlo(
        met=sum(1 for t, _ in servable if t <= slo_s),
        requests=len(servable),
        by_arrival=tuple((t, m, n) for t, (m, n) in sorted(bins.items())),
        backlog_s=sum(
            r.waiting * capacity.prefill_overhead_s
            + r.prefill_tokens_waiting / capacity.prefill_tokens_per_s
            for r in obs.ready
        ),
        ready=len(obs.ready),
        behind=sum(
            r.waiting * capacity.prefill_overhead_s
            + r.prefill_tokens_waiting / capacity.prefill_tokens_per_s
            > slo_s
            for r in obs.ready
        ),
        served_s=sum(
            capacity.prefill_overhead_s + prompt / capacity.prefill_tokens_per_s
            for _, prompt, _ in obs.first_tokens
        ),
    )


class OracleScaler(Scaler):
    """The planner given the true load of every window up to its lead time (the floor)."""

    def __init__(
        self,
        trace: Sequence[TraceRequest],
        cfg: PlannerConfig,
        capacity: ReplicaCapacity,
        initial_replicas: int,
    ) -> None:
        self.cfg = cfg
        self.capacity = capacity
        self.state = PlanState(replicas=initial_replicas)
        self._seen: deque[tuple[float, float]] = deque()
        self._arrival_s = [r.arrival_s for r in trace]
        self._prompt = [r.prompt_tokens for r in trace]
        # KV a request holds and for how long, if it were served without queueing.
        self._kv = [r.prompt_tokens + r.output_tokens for r in trace]
        self._resident_s = [
            capacity.prefill_overhead_s
            + r.prompt_tokens / capacity.prefill_tokens_per_s
            + r.output_tokens * capacity.decode_step_s
            for r in trace
        ]

    @property
    def tick_s(self) -> float:
        return self.cfg.interval_s

    def _window(self, start_s: float, end_s: float, horizon_s: float) -> LoadForecast:
        lo = bisect.bisect_left(self._arrival_s, start_s)
        hi = bisect.bisect_left(self._arrival_s, end_s)
        n = hi - lo
        prompts = self._prompt[lo:hi]
        mean = sum(prompts) / n if n else 0.0
        sq = sum(p * p for p in prompts) / n if n else 0.0
        # KV at the window's start: requests that arrived before it and are still resident.
        first = bisect.bisect_left(self._arrival_s, start_s - 600.0)
        kv = sum(
            self._kv[i]
            for i in range(first, lo)
            if self._arrival_s[i] + self._resident_s[i] > start_s
        )
        ordered = sorted(prompts)
        quantiles = tuple(float(ordered[int((k + 0.5) / 20 * n)]) for k in range(20)) if n else ()
        return LoadForecast(
            horizon_s=horizon_s,
            arrivals_per_s=n / (end_s - start_s),
            prompt_tokens_mean=mean,
            prompt_tokens_sq_mean=max(sq, mean * mean),
            kv_used_tokens=float(kv),
            prompt_tokens_quantiles=quantiles,
        )

    def desired(self, obs: FleetObservation) -> int:
        step = self.cfg.interval_s
        now = obs.now_s
        loads = [
            self._window(now + k * step, now + (k + 1) * step, k * step)
            for k in range(math.ceil(self.cfg.lead_s / step))
        ]
        self._seen.extend((t, float(p)) for t, p in obs.arrivals)
        while self._seen and self._seen[0][0] < now - self.cfg.arrivals_window_s:
            self._seen.popleft()
        self.state, rec = plan(
            self.state,
            now,
            loads,
            self.capacity,
            self.cfg,
            observed_slo(obs, self.capacity, self.cfg.ttft_slo_s, self.cfg.interval_s),
            tuple(self._seen),
        )
        return rec.replicas
