"""Replica sizing: how many replicas of one engine profile a load needs so its TTFT SLO holds.

Owns the arithmetic the planner (`planner`) sizes with, as pure functions of a load (a forecast,
or the truth for an oracle), one replica's capacity and the planner's settings: one M/G/n queue
of prefill work (Erlang C, the Allen-Cunneen mean wait, an exponential tail) over the load's
prompt-size quantiles, and the KV in use against the pools at `kv_headroom` (the planner's
module docstring gives the model and its reasons). Must not do: I/O, clocks, forecasting, or
any of the planner's modes (follow, hold, floor, panic, hysteresis).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seedance.router.core.planning.planner import PlannerConfig

__all__ = ["Binding", "LoadForecast", "ReplicaCapacity", "replicas_needed"]


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


def _queue_need(
    load: LoadForecast, capacity: ReplicaCapacity, cfg: PlannerConfig, *, start: int = 0
) -> int:
    """Fewest replicas of one shared queue (from `min_replicas`, or `start` when the caller
    knows fewer do not suffice; `max_replicas` + 1 when none suffices) that keep this load
    inside the SLO target, by the M/G/n model."""
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
    for n in range(max(cfg.min_replicas, start), cfg.max_replicas + 1):
        # With no request servable in time, only stability is asked of the fleet.
        ok = (
            _attainment(n, load.arrivals_per_s, s1, s2, budgets_s) >= cfg.slo_target
            if budgets_s
            else load.arrivals_per_s * s1 < n
        )
        if ok:
            return n
    return cfg.max_replicas + 1


def _kv_need(load: LoadForecast, capacity: ReplicaCapacity, cfg: PlannerConfig) -> int:
    return math.ceil(load.kv_used_tokens / (cfg.kv_headroom * capacity.kv_capacity_tokens) - 1e-9)


def _bounded(prefill_n: int, kv_n: int, cfg: PlannerConfig) -> tuple[int, Binding]:
    need = max(prefill_n, kv_n, cfg.min_replicas)
    if need > cfg.max_replicas:
        return cfg.max_replicas, Binding.MAX_REPLICAS
    if prefill_n <= cfg.min_replicas and kv_n <= cfg.min_replicas:
        return need, Binding.MIN_REPLICAS
    return need, (Binding.KV if kv_n > prefill_n else Binding.PREFILL)


def replicas_needed(
    load: LoadForecast,
    capacity: ReplicaCapacity,
    cfg: PlannerConfig,
    capacity_factor: float = 1.0,
) -> tuple[int, Binding]:
    """Fewest replicas (within the configured bounds) that keep this load inside the SLO."""
    prefill_n = math.ceil(_queue_need(load, capacity, cfg) * capacity_factor - 1e-9)
    return _bounded(prefill_n, _kv_need(load, capacity, cfg), cfg)
