"""What a report reads: cost lines rebuilt exactly from the cost events a stream holds.

Owns ``ReportLine`` (one ``cost.entry`` as the reports read it: integers only, so that sums are
exact and every reader of a stream gets the ledger's figures to the micro-dollar),
``LineAmounts`` (the additive quantities a report sums), and ``lines_from_events``, the one
mapping from cost events (``cost.entry.v2``, and ``cost.entry.v1`` where a stored stream still
holds it) to lines. Must not compute a cost: the ledger did, and its entries say so exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Literal

import msgspec

from seedance.events.cost import CostEntry, CostEntryV1, CostKind, MeasuredUse, upgrade
from seedance.events.gpus import canonical_model

__all__ = ["LineAmounts", "ReportLine", "epoch_ms", "lines_from_events", "usd_from_micro"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(t: datetime) -> int:
    """A timezone-aware datetime as integer epoch milliseconds (naive ones are refused)."""
    if t.utcoffset() is None:
        raise ValueError(f"datetime {t.isoformat()!r} is naive: give it a timezone (UTC)")
    return (t - _EPOCH) // timedelta(milliseconds=1)  # integer: exact to the millisecond


def usd_from_micro(micro: int) -> Decimal:
    """Micro-dollars as an exact Decimal in USD (six decimal places)."""
    return Decimal(micro).scaleb(-6)


class LineAmounts(msgspec.Struct, kw_only=True):
    """Additive integer quantities of a line or of a report's group (money in micro-USD;
    ``gpu_hours_micro`` and ``tflop_hours_micro`` in millionths; energy in millijoules)."""

    cost_usd_micro: int = 0  # GPU time (the charge less billed energy)
    energy_usd_micro: int = 0
    list_cost_usd_micro: int = 0
    gpu_hours_micro: int = 0
    energy_mj: int = 0
    tflop_hours_micro: int = 0

    @property
    def total_usd_micro(self) -> int:
        return self.cost_usd_micro + self.energy_usd_micro

    def add(self, other: LineAmounts) -> None:
        """Sum ``other`` into this (a report's running total)."""
        for name in self.__struct_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def is_zero(self) -> bool:
        return not any(getattr(self, name) for name in self.__struct_fields__)


class ReportLine(msgspec.Struct, frozen=True, kw_only=True):
    """One cost line for one window as a report reads it: a job's usage on a node, or idle.

    A line's later revisions carry the *difference* caused by late facts, so summing a line's
    revisions gives its exact cost.
    """

    entry_id: str
    kind: Literal["usage", "idle"]
    revision: int
    tenant: str
    job_id: str
    node: str
    gpu_model: str
    pricing_tier: str
    window_start_ms: int
    window_end_ms: int
    amounts: LineAmounts
    activity_ppm: int | None
    source_event_ids: tuple[str, ...]
    assumptions: tuple[str, ...] = ()
    #: Usage lines: what the job held and the most it used (right-sizing reads it).
    usage: MeasuredUse | None = None
    #: Under measured billing of shared GPUs: the line's GPU-time cost by allocation (None:
    #: billed by allocation, so ``amounts.cost_usd_micro`` is that figure).
    allocation_cost_usd_micro: int | None = None
    #: The line's price is an assumption (a configured price, or the book's fallback).
    price_assumed: bool = False
    #: The GPU was billed at the price book's fallback: the book could not price it.
    price_fallback: bool = False


def lines_from_events(events: Iterable[object]) -> list[ReportLine]:
    """The lines of the cost entries among ``events`` (other events are skipped)."""
    return [
        _line(upgrade(ev) if isinstance(ev, CostEntryV1) else ev)
        for ev in events
        if isinstance(ev, CostEntry | CostEntryV1)
    ]


def _line(ev: CostEntry) -> ReportLine:
    return ReportLine(
        entry_id=ev.line_id or ev.id,
        kind="idle" if ev.kind == CostKind.IDLE else "usage",
        revision=ev.revision,
        tenant=ev.tenant,
        job_id=ev.job_id,
        node=ev.node,
        # Entries published before issue 28 name the GPU by the replayed fleets' short names
        # (``A100``, ``T4``): the canonical model keeps one key per GPU in every report.
        gpu_model=canonical_model(ev.gpu_model) if ev.gpu_model else "",
        pricing_tier=ev.pricing_tier,
        window_start_ms=epoch_ms(ev.period_start),
        window_end_ms=epoch_ms(ev.period_end),
        amounts=LineAmounts(
            cost_usd_micro=ev.cost_micro_usd - ev.energy_micro_usd,
            energy_usd_micro=ev.energy_micro_usd,
            list_cost_usd_micro=ev.list_cost_micro_usd,
            gpu_hours_micro=ev.gpu_hours_micro,
            energy_mj=ev.energy_mj,
            tflop_hours_micro=ev.tflop_hours_micro,
        ),
        activity_ppm=ev.activity_ppm,
        source_event_ids=tuple(ev.source_ids),
        assumptions=tuple(ev.assumptions),
        usage=ev.usage,
        allocation_cost_usd_micro=ev.allocation_cost_micro_usd,
        # Older entries flag an assumed price only among their assumptions.
        price_assumed=ev.price_assumed or any(a.startswith("price:") for a in ev.assumptions),
        price_fallback=ev.price_fallback or any(a.startswith("fallback:") for a in ev.assumptions),
    )
