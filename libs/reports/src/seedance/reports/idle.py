"""Sharing idle cost: OpenCost's ``shareIdle`` rule, exactly.

Owns the optional redistribution of each node's idle line over the jobs that ran on that node
in the same window, in proportion to their allocated (non-idle) cost, as OpenCost does. The
ledger keeps idle as its own line (``__idle__``); a report shares it when a user asks for idle
to be charged to the teams that hold the node (a reporting rule: the ledger never applies it).
Must not change the lines: it returns shares alongside them.

Exactness: shares are apportioned by the largest-remainder method, so the shares of one idle
line add up to that line exactly (no micro-dollar created or lost). A window with idle but no
allocated cost keeps its idle unshared.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction

import msgspec

from seedance.reports.lines import ReportLine

__all__ = ["IdleShare", "apportion", "share_idle"]


class IdleShare(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a node-window's idle cost charged to one job."""

    tenant: str
    job_id: str
    node: str
    window_start_ms: int
    idle_usd_micro: int


def apportion(total: int, weights: list[int]) -> list[int]:
    """Split integer ``total`` by ``weights`` so the parts sum to ``total`` exactly.

    Largest remainder; ties go to the earlier weight, so the result is deterministic.
    """
    weight_sum = sum(weights)
    if weight_sum <= 0:
        raise ValueError(f"weights = {weights!r} must have a positive sum")
    exact = [Fraction(total * w, weight_sum) for w in weights]
    parts = [e.numerator // e.denominator for e in exact]
    left = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def share_idle(entries: Iterable[ReportLine]) -> tuple[list[IdleShare], int]:
    """Idle shares per job per node-window, and the idle left unshared (no job to carry it)."""
    idle: dict[tuple[str, int], int] = defaultdict(int)
    usage: dict[tuple[str, int], dict[tuple[str, str], int]] = defaultdict(lambda: defaultdict(int))
    for e in entries:
        key = (e.node, e.window_start_ms)
        if e.kind == "idle":
            idle[key] += e.amounts.total_usd_micro
        else:
            usage[key][(e.tenant, e.job_id)] += e.amounts.total_usd_micro
    shares: list[IdleShare] = []
    unshared = 0
    for key in sorted(idle):
        jobs = sorted((j, c) for j, c in usage.get(key, {}).items() if c > 0)
        if not jobs:
            unshared += idle[key]
            continue
        parts = apportion(idle[key], [c for _, c in jobs])
        shares.extend(
            IdleShare(
                tenant=tenant, job_id=job, node=key[0], window_start_ms=key[1], idle_usd_micro=p
            )
            for ((tenant, job), _), p in zip(jobs, parts, strict=True)
        )
    return shares, unshared
