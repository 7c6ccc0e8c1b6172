"""Summary figures of one replay: TTFT and end-to-end percentiles and SLO attainment.

Must not do: simulate or choose policies. Percentiles are nearest-rank on the sorted values;
a request rejected as too large for any replica counts as an SLO miss and is left out of the
latency percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from seedance.bench.router_sim.interfaces import SimResult

__all__ = ["PolicySummary", "percentile", "summarise"]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list; NaN when empty."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySummary:
    requests: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p95_ms: float
    slo_attainment_pct: float
    rejected: int
    max_kv_used_frac: float


def summarise(result: SimResult, ttft_slo_s: float) -> PolicySummary:
    ttft = sorted(t for t in result.ttft_s if not math.isnan(t))
    e2e = sorted(t for t in result.e2e_s if not math.isnan(t))
    n = len(result.ttft_s)
    met = sum(1 for t in ttft if t <= ttft_slo_s)
    return PolicySummary(
        requests=n,
        ttft_p50_ms=percentile(ttft, 50) * 1e3,
        ttft_p95_ms=percentile(ttft, 95) * 1e3,
        ttft_p99_ms=percentile(ttft, 99) * 1e3,
        e2e_p50_ms=percentile(e2e, 50) * 1e3,
        e2e_p95_ms=percentile(e2e, 95) * 1e3,
        slo_attainment_pct=100.0 * met / n if n else math.nan,
        rejected=result.rejected,
        max_kv_used_frac=result.max_kv_used_frac,
    )
