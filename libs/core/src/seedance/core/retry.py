"""Backoff for nak'ed messages: exponential, capped, with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    initial_s: float = 0.2
    coefficient: float = 2.0
    max_s: float = 10.0
    #: Fraction of the delay drawn at random, so that replicas do not retry in lock-step.
    jitter: float = 0.2

    def delay_s(self, num_delivered: int, rng: random.Random | None = None) -> float:
        base = min(self.max_s, self.initial_s * self.coefficient ** max(0, num_delivered - 1))
        r = (rng or random).random()
        return base * (1.0 - self.jitter + 2 * self.jitter * r)
