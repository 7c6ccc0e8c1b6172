"""When a new replica's latency has settled: the stopping rule of warm-up.

Owns: `WarmupPolicy` (bounds and tolerance) and `latency_settled`, a pure function of the
latencies measured so far. The gateway (`replicas.py`) sends the warm-up requests and asks this
module when to stop.

Must not: send requests or read a clock; it only judges a series of latencies.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["WarmupPolicy", "latency_settled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmupPolicy:
    """Warm-up bounds. The defaults settle a CPU Triton in ~10–20 requests (see docs)."""

    # Latencies are compared in two consecutive windows of this many requests.
    window: int = 5
    # Settled when the later window's median is within this fraction of the earlier one's:
    # the first requests pay one-off costs, so latency falls, then flattens.
    tolerance: float = 0.25
    min_requests: int = 10
    # A replica that never settles still takes traffic after this many (and is logged): its
    # latency may just be noisy, and refusing it forever would lose capacity.
    max_requests: int = 200
    # Per warm-up request upstream timeout.
    request_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window={self.window} must be >= 1")
        if self.tolerance < 0:
            raise ValueError(f"tolerance={self.tolerance} must be >= 0")
        if not 2 * self.window <= self.max_requests:
            raise ValueError(f"max_requests={self.max_requests} must be >= 2 * window")
        if self.min_requests > self.max_requests:
            raise ValueError(
                f"min_requests={self.min_requests} must be <= max_requests={self.max_requests}"
            )


def latency_settled(latencies_s: Sequence[float], policy: WarmupPolicy) -> bool:
    """True once warm-up may stop: enough requests, and the last window's median latency
    within `tolerance` of the window before it; or the request budget is spent."""
    n = len(latencies_s)
    if n >= policy.max_requests:
        return True
    if n < max(policy.min_requests, 2 * policy.window):
        return False
    w = policy.window
    earlier = statistics.median(latencies_s[n - 2 * w : n - w])
    later = statistics.median(latencies_s[n - w :])
    # Settled when the drop has stopped: the later window is not much faster than the earlier
    # one (still falling means one-off costs are still being paid), and not much slower.
    return abs(later - earlier) <= policy.tolerance * max(earlier, 1e-9)
