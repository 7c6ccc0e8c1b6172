"""Predictive replica planning: how many replicas a model needs so its TTFT SLO holds.

Owns the sizing rule, the start-up lead time and the scale-down hysteresis, as pure code from
typed inputs (load forecasts, one replica's capacity, the planner's settings) to a typed
`Recommendation`. Must not do: I/O, clocks or forecasting itself. The router service feeds it
forecasts and publishes what it returns; the replay simulator feeds it the same forecasts (or,
for the oracle, the true future) and applies it to a simulated fleet.

Sizing. The fleet is modelled as one M/G/n queue of prefill work (the engine runs prefill before
decode, so a request's TTFT is the prefill work queued ahead of it plus its own; least-outstanding
routing keeps the replicas' queues close to one shared queue) and a KV pool per replica:

* prefill: arrival rate λ, prefill time S = overhead + prompt / throughput, offered load
  a = λ·E[S] replicas. The probability of waiting is Erlang C(n, a); the mean wait is the
  Allen-Cunneen approximation E[W] = C·E[S]/(n − a)·(1 + cv²)/2; a wait, when there is one, is
  taken as exponential. A request of prefill time S_i meets the SLO when its wait is at most
  SLO − S_i − one decode step (an arrival waits for the running step). The planner averages
  that probability over the forecast's prompt-size quantiles, over the requests that an idle
  replica could serve in time (the others miss whatever the fleet), and takes the fewest n
  whose average reaches `slo_target`.
* KV: the forecast KV tokens in use must fit n pools at `kv_headroom`; admission waits when a
  pool is full, which is TTFT the prefill model does not see.

Feedback. The queue model is an approximation (least-outstanding routing does not see prompt
sizes, so a long prefill blocks the replica it lands on more than one shared queue would let
it: on Mooncake the model alone asks for half the replicas the SLO needs). So the need is the
model's count times `capacity_factor`, which the planner learns from the SLO attainment it
observes (first tokens are observable once out), as NVIDIA Dynamo's SLA planner corrects its
performance model by what it observes. The factor aims at a band above `slo_target` (the
allowed misses split in thirds: attainment between target + 1/3 and target + 2/3 of them), so
that the transients of a 60 s start-up land above the target rather than on it: over the last
`feedback_window_s`, attainment below the band raises the factor by `feedback_up`, above it
lowers it by `feedback_down`, never below 1: one shared queue is the best any router can do, so
the model's count is a floor. Up is faster than down because a miss costs an SLO and a surplus
only money. Raising judges only what was served after the last scale-up's replicas became
ready: misses from before are already answered by them, and counting them again winds the
factor up (the first version did: 32.3 GPU-hours on Mooncake where this one spends 30.5).

Lead time. A replica asked for now takes traffic `startup_s` later, and one removed now cannot
come back sooner, so a recommendation must cover every load between now and then: the caller
passes forecasts for the horizons up to start-up plus one planning interval, and the planner
sizes for the largest.

Hysteresis. Scaling up is immediate. Scaling down waits until the need has stayed below the
current count for `scale_down_window_s` and then goes to the largest need seen in that window
(Kubernetes HPA's scale-down stabilisation), so a dip shorter than a start-up does not remove a
replica that would have to be started again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

__all__ = [
    "Binding",
    "LoadForecast",
    "ObservedSlo",
    "PlanReason",
    "PlanState",
    "PlannerConfig",
    "Recommendation",
    "ReplicaCapacity",
    "plan",
    "replicas_needed",
]


class PlanReason(StrEnum):
    """Why the recommendation is what it is: a closed set, exported as a metric label."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"
    # The need is lower than the current count, but not for long enough yet.
    STABILISING = "stabilising"


class Binding(StrEnum):
    """Which constraint set the need."""

    PREFILL = "prefill"
    KV = "kv"
    MIN_REPLICAS = "min_replicas"
    MAX_REPLICAS = "max_replicas"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaCapacity:
    """What one replica of the model can do (an engine profile, the same for every policy)."""

    prefill_tokens_per_s: float
    prefill_overhead_s: float
    decode_step_s: float
    kv_capacity_tokens: int

    def __post_init__(self) -> None:
        if self.prefill_tokens_per_s <= 0 or self.kv_capacity_tokens <= 0:
            raise ValueError(
                "prefill_tokens_per_s and kv_capacity_tokens must be > 0, got "
                f"{self.prefill_tokens_per_s} and {self.kv_capacity_tokens}"
            )
        if self.prefill_overhead_s < 0 or self.decode_step_s < 0:
            raise ValueError("prefill_overhead_s and decode_step_s must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    ttft_slo_s: float = 2.0
    # Share of requests that must meet the SLO; the sizing's tail target is 1 - this.
    slo_target: float = 0.95
    # Time from asking for a replica to its first routed request (see docs/router.md).
    startup_s: float = 60.0
    # How often the planner runs; a decision must hold until the next one takes effect.
    interval_s: float = 15.0
    # Highest planned KV pool occupancy: admission blocks at 100 %, and the forecast errs.
    kv_headroom: float = 0.85
    # How long the need must stay below the current count before scaling down.
    scale_down_window_s: float = 120.0
    # SLO feedback (see the module docstring): window, step sizes and bounds of the factor.
    feedback_window_s: float = 120.0
    feedback_up: float = 0.05
    feedback_down: float = 0.01
    factor_max: float = 4.0
    # Fewest first tokens in the window for its attainment to move the factor.
    feedback_min_requests: int = 20
    min_replicas: int = 1
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if not 0.0 < self.slo_target < 1.0:
            raise ValueError(f"slo_target must be in (0, 1), got {self.slo_target}")
        if not 0.0 < self.kv_headroom <= 1.0:
            raise ValueError(f"kv_headroom must be in (0, 1], got {self.kv_headroom}")
        if self.ttft_slo_s <= 0 or self.interval_s <= 0:
            raise ValueError("ttft_slo_s and interval_s must be > 0")
        if self.startup_s < 0 or self.scale_down_window_s < 0:
            raise ValueError("startup_s and scale_down_window_s must be >= 0")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas} and "
                f"{self.max_replicas}"
            )

    @property
    def lead_s(self) -> float:
        """The furthest horizon a decision must cover: start-up plus one interval."""
        return self.startup_s + self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadForecast:
    """The model's load at one horizon, fleet-wide (a forecast, or the truth for an oracle)."""

    horizon_s: float
    arrivals_per_s: float
    # First and second moments of prompt tokens per request (what prefill work depends on).
    prompt_tokens_mean: float
    prompt_tokens_sq_mean: float
    # KV tokens in use over the whole fleet.
    kv_used_tokens: float
    # Prompt sizes at equally spaced quantiles (each stands for the same share of requests);
    # empty means every request is of the mean size.
    prompt_tokens_quantiles: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.arrivals_per_s < 0 or self.kv_used_tokens < 0 or self.prompt_tokens_mean < 0:
            raise ValueError(
                f"load forecast at {self.horizon_s} s has a negative rate, KV or prompt mean"
            )
        if self.prompt_tokens_sq_mean < self.prompt_tokens_mean**2 * (1 - 1e-9):
            raise ValueError(
                f"prompt_tokens_sq_mean {self.prompt_tokens_sq_mean} is below the square of "
                f"prompt_tokens_mean {self.prompt_tokens_mean}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanState:
    """What the planner remembers between decisions: its last count and recent needs."""

    replicas: int
    # (time_s, need) of the decisions inside the scale-down window, oldest first.
    needs: tuple[tuple[float, int], ...] = ()
    # Multiplies the queue model's count (see the module docstring).
    capacity_factor: float = 1.0
    # (time_s, met, requests) of the SLO observations inside the feedback window.
    observed: tuple[tuple[float, int, int], ...] = ()
    # When the recommendation last rose.
    last_scale_up_s: float = -math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedSlo:
    """First tokens seen since the last decision, of requests an idle replica serves in time."""

    met: int
    requests: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    replicas: int
    # The count the load alone asks for, before hysteresis.
    needed: int
    reason: PlanReason
    binding: Binding
    # The horizon whose forecast set the need.
    horizon_s: float


def _erlang_c(n: int, a: float) -> float:
    """Probability of waiting in M/M/n with offered load a < n (via the Erlang B recursion)."""
    b = 1.0
    for k in range(1, n + 1):
        b = a * b / (k + a * b)
    rho = a / n
    return b / (1.0 - rho * (1.0 - b))


def _erlang_c_wait(n: int, rate_per_s: float, s1: float, s2: float) -> tuple[float, float]:
    """(P(wait), mean wait given a wait) on n replicas; (1, inf) when the load is unstable."""
    a = rate_per_s * s1
    if a >= n:
        return 1.0, math.inf
    if a <= 0.0:
        return 0.0, 0.0
    cv2 = max(s2 / (s1 * s1) - 1.0, 0.0)
    return _erlang_c(n, a), s1 / (n - a) * (1.0 + cv2) / 2.0


def _attainment(
    n: int, rate_per_s: float, s1: float, s2: float, budgets_s: Sequence[float]
) -> float:
    """Share of requests (one per budget) whose prefill wait fits their budget, on n replicas."""
    c, wait_if_any_s = _erlang_c_wait(n, rate_per_s, s1, s2)
    if c >= 1.0:
        return 0.0
    if c <= 0.0:
        return 1.0
    return sum(1.0 - c * math.exp(-b / wait_if_any_s) for b in budgets_s) / len(budgets_s)


def _service_moments(load: LoadForecast, capacity: ReplicaCapacity) -> tuple[float, float]:
    c = capacity
    tps = c.prefill_tokens_per_s
    s1 = c.prefill_overhead_s + load.prompt_tokens_mean / tps
    # E[(a + X/b)^2] = a^2 + 2a E[X]/b + E[X^2]/b^2.
    s2 = (
        c.prefill_overhead_s**2
        + 2.0 * c.prefill_overhead_s * load.prompt_tokens_mean / tps
        + load.prompt_tokens_sq_mean / tps**2
    )
    return s1, s2


def feedback(
    state: PlanState, now_s: float, observed: ObservedSlo | None, cfg: PlannerConfig
) -> tuple[float, tuple[tuple[float, int, int], ...]]:
    """The capacity factor and feedback window after this decision's SLO observation."""
    cutoff_s = now_s - cfg.feedback_window_s
    window = tuple(x for x in state.observed if x[0] > cutoff_s)
    if observed is not None and observed.requests > 0:
        window = (*window, (now_s, observed.met, observed.requests))
    allowed = 1.0 - cfg.slo_target
    lower, upper = cfg.slo_target + allowed / 3.0, cfg.slo_target + 2.0 * allowed / 3.0
    factor = state.capacity_factor
    # Raising judges only the fleet as it is now: what was served after the last scale-up's
    # replicas became ready (earlier misses are already answered by them).
    ready_since_s = state.last_scale_up_s + cfg.startup_s
    fresh = [x for x in window if x[0] > ready_since_s]
    if _attained(fresh, cfg) < lower:
        factor *= 1.0 + cfg.feedback_up
    elif _attained(window, cfg) > upper:
        factor *= 1.0 - cfg.feedback_down
    return min(max(factor, 1.0), cfg.factor_max), window


def _attained(window: Sequence[tuple[float, int, int]], cfg: PlannerConfig) -> float:
    """Attainment over the window; NaN (compares false) with too few requests to tell."""
    requests = sum(x[2] for x in window)
    if requests < cfg.feedback_min_requests:
        return math.nan
    return sum(x[1] for x in window) / requests


def replicas_needed(
    load: LoadForecast,
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
    capacity_factor: float = 1.0,
) -> tuple[int, Binding]:
    """Fewest replicas (within the configured bounds) that keep this load inside the SLO."""
    c = capacity
    tps = c.prefill_tokens_per_s
    s1, s2 = _service_moments(load, capacity)
    sizes = load.prompt_tokens_quantiles or (load.prompt_tokens_mean,)
    budgets_s = [
        b
        for b in (
            cfg.ttft_slo_s - c.decode_step_s - c.prefill_overhead_s - size / tps for size in sizes
        )
        if b >= 0.0
    ]
    kv_n = math.ceil(load.kv_used_tokens / (cfg.kv_headroom * c.kv_capacity_tokens) - 1e-9)
    prefill_n = cfg.max_replicas + 1
    for n in range(cfg.min_replicas, cfg.max_replicas + 1):
        # With no request servable in time, only stability is asked of the fleet.
        ok = (
            _attainment(n, load.arrivals_per_s, s1, s2, budgets_s) >= cfg.slo_target
            if budgets_s
            else load.arrivals_per_s * s1 < n
        )
        if ok:
            prefill_n = n
            break
    prefill_n = math.ceil(prefill_n * capacity_factor - 1e-9)
    need = max(prefill_n, kv_n, cfg.min_replicas)
    if need > cfg.max_replicas:
        return cfg.max_replicas, Binding.MAX_REPLICAS
    if prefill_n <= cfg.min_replicas and kv_n <= cfg.min_replicas:
        return need, Binding.MIN_REPLICAS
    return need, (Binding.KV if kv_n > prefill_n else Binding.PREFILL)


def plan(
    state: PlanState,
    now_s: float,
    loads: Sequence[LoadForecast],
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
    observed: ObservedSlo | None = None,
) -> tuple[PlanState, Recommendation]:
    """One planning decision: the need over `loads` (now to `cfg.lead_s`), then hysteresis.

    `observed` is the SLO attainment seen since the previous decision; it moves the capacity
    factor before sizing.
    """
    if not loads:
        raise ValueError("plan needs at least one load forecast")
    k, window = feedback(state, now_s, observed, cfg)
    sized = [(replicas_needed(load, capacity, cfg, k), load.horizon_s) for load in loads]
    (need, binding), horizon_s = max(sized, key=lambda x: (x[0][0], -x[1]))
    cutoff_s = now_s - cfg.scale_down_window_s
    needs = (*(x for x in state.needs if x[0] > cutoff_s), (now_s, need))
    current = state.replicas
    if need > current:
        target, reason = need, PlanReason.SCALE_UP
    elif need == current:
        target, reason = current, PlanReason.HOLD
    else:
        # Down only once every need of a whole window is below the current count.
        highest = max(n for _, n in needs)
        if highest < current and _covers_window(state, cutoff_s, cfg):
            target, reason = highest, PlanReason.SCALE_DOWN
        else:
            target, reason = current, PlanReason.STABILISING
    target = max(cfg.min_replicas, min(cfg.max_replicas, target))
    return (
        replace(
            state,
            replicas=target,
            needs=needs,
            capacity_factor=k,
            observed=window,
            last_scale_up_s=now_s if target > current else state.last_scale_up_s,
        ),
        Recommendation(
            replicas=target, needed=need, reason=reason, binding=binding, horizon_s=horizon_s
        ),
    )


def _covers_window(state: PlanState, cutoff_s: float, cfg: PlannerConfig) -> bool:
    # The history must reach back to the window's start: right after a start there are too
    # few decisions to know that the need has stayed low.
    return bool(state.needs) and state.needs[0][0] <= cutoff_s + cfg.interval_s
