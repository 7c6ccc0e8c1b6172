"""Capacity release with headroom on purpose: a placement term that leaves nodes empty, and the
headroom the fleet keeps while new nodes start.

Owns `LeaveEmpty` (a policy wrapper: a request goes to the fullest nodes in use that fit, and
only then to an empty one, so emptied nodes stay empty and can be released; the inner policy,
e.g. `SeedancePolicy`, still chooses inside each tier, which keeps its fragmentation win),
`ArrivalForecast` (the arrival rate of GPU demand, an exponentially weighted estimate from the
arrivals seen) and `headroom_gpus` (the free whole GPUs that cover
what arrives while a new node starts, at a high quantile of a compound Poisson demand).

It must not read a clock or do I/O: arrivals come in with their trusted times.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from seedance.slicer.core.model import GPU_MILLI, ClusterState, NodeGpus, PodRequest, Rejection
from seedance.slicer.core.policies import Policy

__all__ = ["ArrivalForecast", "LeaveEmpty", "free_whole_gpus", "headroom_gpus"]


class LeaveEmpty:
    """`inner`'s choice among the fullest nodes in use that fit, so the least used nodes get
    nothing new and empty as their work ends (then they can be released).

    Nodes in use are taken in tiers of their GPU share in use (`tiers`: at least 75 %, then
    50 %, then 25 %, then anything in use); inside a tier `inner` chooses (for `SeedancePolicy`
    its fragmentation descent, so the packing keeps that win). Then an empty node; last, a node
    the capacity plan is emptying (`set_draining`: it is paid for while it drains, and a job
    placed there waits for no new node). `enabled=False`: `inner` alone (the knob)."""

    def __init__(
        self,
        inner: Policy,
        *,
        enabled: bool = True,
        tiers: tuple[float, ...] = (0.75, 0.5, 0.25),
    ) -> None:
        self.inner = inner
        self.enabled = enabled
        self.tiers = tiers
        self.name = f"{inner.name}+leave-empty" if enabled else inner.name
        self._draining: tuple[int, ...] = ()

    def inherit(self, other: Policy) -> None:
        """Start from `other`'s state (a refresh of the target workload): the inner policy
        inherits from `other`'s inner policy (or from `other` itself), the draining rows stay."""
        inherit = getattr(self.inner, "inherit", None)
        if inherit is not None:
            inherit(other.inner if isinstance(other, LeaveEmpty) else other)
        if isinstance(other, LeaveEmpty):
            self._draining = other._draining

    def set_draining(self, rows: Iterable[int]) -> None:
        self._draining = tuple(sorted(set(rows)))

    @property
    def draining(self) -> tuple[int, ...]:
        return self._draining

    def place(
        self, state: ClusterState, pod: PodRequest, allowed: np.ndarray | None = None
    ) -> NodeGpus | Rejection:
        if not self.enabled:
            return self.inner.place(state, pod, allowed)
        n = len(state)
        base = np.ones(n, dtype=bool) if allowed is None else allowed
        keep = base.copy()
        keep[[r for r in self._draining if r < n]] = False
        cap = state.gpu_cap.sum(axis=1)
        used = cap - state.gpu_free.sum(axis=1)
        in_use = (used > 0) | (state.cpu_free < state.cpu_cap)
        share = used / np.maximum(cap, 1)
        fits = state.feasible(pod)
        for mask in (
            *(keep & in_use & (share >= t) for t in self.tiers),
            keep & in_use,
            keep,
        ):
            # The first tier where the request fits (the policies' own feasibility test, so
            # the inner policy is asked once).
            if (mask & fits).any():
                res = self.inner.place(state, pod, mask)
                if not isinstance(res, Rejection):
                    return res
        return self.inner.place(state, pod, allowed)


@dataclass(slots=True)
class _Flow:
    """One stream of GPU demand (arrivals or departures), weighted by age."""

    jobs: float = 0.0
    g1: float = 0.0
    g2: float = 0.0

    def decay(self, k: float) -> None:
        self.jobs *= k
        self.g1 *= k
        self.g2 *= k

    def add(self, gpus: float) -> None:
        self.jobs += 1.0
        self.g1 += gpus
        self.g2 += gpus * gpus


@dataclass(slots=True)
class ArrivalForecast:
    """GPU demand arriving and leaving, weighted by age with time constant `tau_s`: per
    stream the rate of jobs and the first two moments of their GPUs, from which
    `headroom_gpus` sizes the net demand that comes while a node starts. `since_s` is when
    observing began (rates are per second observed, so a first arrival soon after it is not
    read as a burst)."""

    tau_s: float = 1800.0
    since_s: float = 0.0
    _t: float | None = None
    _in: _Flow = field(default_factory=_Flow)
    _out: _Flow = field(default_factory=_Flow)

    def observe(self, now_s: float, gpus: float) -> None:
        """A job arrived asking for `gpus`."""
        self._decay(now_s)
        self._in.add(gpus)

    def observe_end(self, now_s: float, gpus: float) -> None:
        """A job ended, giving back `gpus` (a move is no end: its job arrives again)."""
        self._decay(now_s)
        self._out.add(gpus)

    def _decay(self, now_s: float) -> None:
        if self._t is None:
            self._t = self.since_s
        k = math.exp(-max(0.0, now_s - self._t) / self.tau_s)
        self._in.decay(k)
        self._out.decay(k)
        self._t = now_s

    def _span(self, now_s: float) -> float:
        return self.tau_s * (1.0 - math.exp(-(now_s - self.since_s) / self.tau_s))

    def rate(self, now_s: float) -> tuple[float, float, float]:
        """Arrivals: (jobs per s, mean GPUs per job, mean squared GPUs per job)."""
        return self._rates(self._in, now_s)

    def end_rate(self, now_s: float) -> tuple[float, float, float]:
        """Ends, as `rate`."""
        return self._rates(self._out, now_s)

    def _rates(self, flow: _Flow, now_s: float) -> tuple[float, float, float]:
        self._decay(now_s)
        span = self._span(now_s)
        if flow.jobs <= 0 or span <= 0:
            return 0.0, 0.0, 0.0
        return flow.jobs / span, flow.g1 / flow.jobs, flow.g2 / flow.jobs


def headroom_gpus(forecast: ArrivalForecast, now_s: float, startup_s: float, z: float) -> float:
    """Whole GPUs that cover the net demand of `startup_s` (what arrives less what ends) at
    `z` standard deviations over its mean: arrivals and ends are compound Poisson streams, so
    the net change has mean (λ_in·E[g_in] − λ_out·E[g_out])·T (a growth only: a shrinking
    demand needs no room) and variance (λ_in·E[g_in²] + λ_out·E[g_out²])·T. Rounded to the
    nearest whole GPU (a fraction of a GPU expected is no reason to keep a node). In a steady
    state the ends free about what arrives, so the headroom is the noise, not the flow."""
    lam_in, g_in, g2_in = forecast.rate(now_s)
    lam_out, g_out, g2_out = forecast.end_rate(now_s)
    growth = max(0.0, lam_in * g_in - lam_out * g_out) * startup_s
    spread = math.sqrt((lam_in * g2_in + lam_out * g2_out) * startup_s)
    return float(round(growth + z * spread))


def free_whole_gpus(state: ClusterState, rows: np.ndarray | None = None) -> int:
    """GPUs with nothing on them (of `rows`, default all)."""
    free = state.gpu_free if rows is None else state.gpu_free[rows]
    return int((free == GPU_MILLI).sum())
