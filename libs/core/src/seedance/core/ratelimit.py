"""A client-side request rate: a token bucket of ``qps`` tokens a second holding at most
``burst``, each request taking one (client-go's ``flowcontrol.NewTokenBucketRateLimiter``, the
limiter behind a Kubernetes client's ``QPS``/``Burst``).

Callers reserve in arrival order: a request that finds the bucket empty takes a token ahead
(the count goes below zero) and sleeps until that token has accrued, so concurrent callers are
spaced at ``1 / qps`` and none starves. Time comes from an injected `Clock`. It must not know
what the requests are; the caller picks which of its calls share one bucket.
"""

from __future__ import annotations

from collections.abc import Callable

from seedance.core.clock import WALL_CLOCK, Clock

__all__ = ["TokenBucket"]


class TokenBucket:
    """``qps`` requests a second on average, ``burst`` at once; ``qps <= 0``: no limit (as a
    negative ``QPS`` in client-go)."""

    def __init__(self, qps: float, burst: int, clock: Clock = WALL_CLOCK) -> None:
        if qps > 0 and burst < 1:
            raise ValueError(f"a token bucket of {qps} a second needs a burst of at least 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock.monotonic()
        #: Requests that had to wait, and the seconds they waited in all.
        self.waited = 0
        self.waited_s = 0.0
        #: Called with each wait's seconds, before it (a metric's ``observe``).
        self.on_wait: Callable[[float], None] | None = None

    async def take(self) -> None:
        """Return once this request may go."""
        if self.qps <= 0:
            return
        now = self._clock.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.qps)
        self._at = now
        self._tokens -= 1.0
        if self._tokens < 0:
            delay_s = -self._tokens / self.qps
            self.waited += 1
            self.waited_s += delay_s
            if self.on_wait is not None:
                self.on_wait(delay_s)
            await self._clock.sleep(delay_s)
