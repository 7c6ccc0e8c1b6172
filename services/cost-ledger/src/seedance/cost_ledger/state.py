"""The ledger's durable state: what is running, what has ended, and running totals.

Pure and deterministic: events in, cost events out, no clock (times come from the events) and
no I/O. Applying the same event twice changes nothing: a placement is keyed by its job, an end by
its job, so a redelivery after a crash or a re-send after the duplicate window is a no-op. The
state round-trips through bytes for JetStream KV.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from seedance.events import Event, derived_event_id
from seedance.events.cost import CostEntry, CostKind, JobCostReport
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished
from seedance.events.slicing import Placement, Preempted

__all__ = ["LedgerState", "PriceBook", "apply"]

_MICRO = 1_000_000


class PriceBook(msgspec.Struct, frozen=True, kw_only=True):
    """On-demand $/GPU-hour per model, as integer micro-dollars (exact sums)."""

    micro_usd_per_gpu_hour: dict[str, int]
    default_micro_usd_per_gpu_hour: int = 2 * _MICRO

    def rate(self, model: str) -> int:
        return self.micro_usd_per_gpu_hour.get(model, self.default_micro_usd_per_gpu_hour)


class _Running(msgspec.Struct, kw_only=True):
    tenant: str
    node: str
    gpu_model: str
    gpu_milli: int
    start: datetime
    placement_id: str


class LedgerState(msgspec.Struct, kw_only=True):
    running: dict[str, _Running] = msgspec.field(default_factory=dict)
    #: Jobs whose end arrived before their placement (streams are not ordered with each other).
    ended_early: dict[str, tuple[datetime, str]] = msgspec.field(default_factory=dict)
    done: dict[str, int] = msgspec.field(default_factory=dict)
    totals_micro_usd: dict[str, int] = msgspec.field(default_factory=dict)


def apply(state: LedgerState, event: Event, prices: PriceBook) -> list[Event]:
    """Apply one event; return the cost events it causes (empty for a repeat)."""
    if isinstance(event, Placement):
        job = event.job_id
        if job in state.done or job in state.running:
            return []
        state.running[job] = _Running(
            tenant=event.tenant,
            node=event.node,
            gpu_model=event.gpu_model,
            gpu_milli=sum(g.milli for g in event.gpus),
            start=event.at,
            placement_id=event.id,
        )
        early = state.ended_early.pop(job, None)
        return _close(state, job, early[0], early[1], prices) if early else []
    if isinstance(event, JobFinished | JobFailed | JobCancelled | Preempted):
        job = event.job_id
        if job in state.done:
            return []
        if job not in state.running:
            state.ended_early.setdefault(job, (event.at, event.id))
            return []
        return _close(state, job, event.at, event.id, prices)
    return []


def _close(
    state: LedgerState, job: str, end: datetime, end_id: str, prices: PriceBook
) -> list[Event]:
    run = state.running.pop(job)
    seconds = max(0.0, (end - run.start).total_seconds())
    # micro-usd = rate × (milli / 1000) × (ms / 3.6e6): integers throughout, rounded half-up
    # once per job, so that any replica and any recomputation get the same number.
    denominator = 1000 * 3_600_000
    numerator = prices.rate(run.gpu_model) * run.gpu_milli * round(seconds * 1000)
    cost = (2 * numerator + denominator) // (2 * denominator)
    gpu_hours = run.gpu_milli / 1000 * seconds / 3600
    state.done[job] = cost
    state.totals_micro_usd[run.tenant] = state.totals_micro_usd.get(run.tenant, 0) + cost
    sources = [run.placement_id, end_id]
    entry = CostEntry(
        id=derived_event_id(end_id, "cost-entry"),
        at=end,
        tenant=run.tenant,
        job_id=job,
        kind=CostKind.COMPUTE,
        node=run.node,
        gpu_model=run.gpu_model,
        period_start=run.start,
        period_end=end,
        gpu_hours=gpu_hours,
        cost_micro_usd=cost,
        source_ids=sources,
    )
    report = JobCostReport(
        id=derived_event_id(end_id, "job-report"),
        at=end,
        tenant=run.tenant,
        job_id=job,
        started_at=run.start,
        finished_at=end,
        gpu_hours=gpu_hours,
        cost_micro_usd=cost,
    )
    return [entry, report]
