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
from dataclasses import dataclass

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
class ArrivalForecast:
    """Arrivals of GPU demand, weighted by age with time constant `tau_s`: the rate of jobs
    and the first two moments of their GPU demand (in GPUs), from which `headroom_gpus`
    sizes what arrives during a node's start-up. `since_s` is when observing began (the rate
    is per second observed, so a first arrival soon after it is not read as a burst)."""

    tau_s: float = 1800.0
    since_s: float = 0.0
    _t: float | None = None
    _jobs: float = 0.0
    _g1: float = 0.0
    _g2: float = 0.0

    def observe(self, now_s: float, gpus: float) -> None:
        self._decay(now_s)
        self._jobs += 1.0
        self._g1 += gpus
        self._g2 += gpus * gpus

    def _decay(self, now_s: float) -> None:
        if self._t is None:
            self._t = self.since_s
        dt = max(0.0, now_s - self._t)
        k = math.exp(-dt / self.tau_s)
        self._jobs *= k
        self._g1 *= k
        self._g2 *= k
        self._t = now_s

    def rate(self, now_s: float) -> tuple[float, float, float]:
        """(jobs per s, mean GPUs per job, mean squared GPUs per job) as of `now_s`."""
        self._decay(now_s)
        span = self.tau_s * (1.0 - math.exp(-(now_s - self.since_s) / self.tau_s))
        if self._jobs <= 0 or span <= 0:
            return 0.0, 0.0, 0.0
        return self._jobs / span, self._g1 / self._jobs, self._g2 / self._jobs


def headroom_gpus(forecast: ArrivalForecast, now_s: float, startup_s: float, z: float) -> float:
    """Whole GPUs that cover the demand arriving in `startup_s` at `z` standard deviations
    above its mean (compound Poisson: mean λ·E[g]·T, variance λ·E[g²]·T), rounded to the
    nearest whole GPU (a fraction of a GPU expected is no reason to keep a node)."""
    lam, g1, g2 = forecast.rate(now_s)
    mean = lam * g1 * startup_s
    return float(round(mean + z * math.sqrt(lam * g2 * startup_s)))


def free_whole_gpus(state: ClusterState, rows: np.ndarray | None = None) -> int:
    """GPUs with nothing on them (of `rows`, default all)."""
    free = state.gpu_free if rows is None else state.gpu_free[rows]
    return int((free == GPU_MILLI).sum())
