"""Request logs for the KV-forecast tests: what a forecast at t must not see, changed."""

from __future__ import annotations

import math

import numpy as np

from seedance.router.core.forecast import RequestLog


def perturb_the_unobservable(log: RequestLog, now_s: float, seed: int) -> RequestLog:
    """Everything a forecast at now_s must not see, changed: later arrivals (times, prompts,
    how many) and the output lengths and finish times of requests in flight or queued."""
    rng = np.random.default_rng(seed)
    known = log.arrival_s <= now_s
    unfinished = known & ~(log.finish_s <= now_s)
    gen = log.generated_tokens.copy()
    gen[unfinished] = rng.integers(2, 5_000, int(unfinished.sum()))
    finish = log.finish_s.copy()
    finish[unfinished] = now_s + rng.uniform(0.01, 60.0, int(unfinished.sum()))
    n_late = int(rng.integers(10, 300))
    late = np.sort(rng.uniform(now_s + 1e-6, now_s + 40.0, n_late))
    nan = np.full(n_late, math.nan)
    return RequestLog(
        arrival_s=np.concatenate([log.arrival_s[known], late]),
        context_tokens=np.concatenate([log.context_tokens[known], rng.integers(1, 9_000, n_late)]),
        admit_s=np.concatenate([log.admit_s[known], nan]),
        first_token_s=np.concatenate([log.first_token_s[known], nan]),
        finish_s=np.concatenate([finish[known], nan]),
        generated_tokens=np.concatenate([gen[known], nan]),
    )
