"""Cost events: entries while jobs run, a report when a job ends, budget alerts and pauses.

Money is integer micro-dollars (``*_micro_usd``) so that sums are exact and a recomputation
from the same events matches to the cent, whatever the order of addition.
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from seedance.events.base import Event, UtcDatetime
from seedance.events.tokens import _TENANT, Name, TenantId

__all__ = [
    "BudgetAlert",
    "CostEntry",
    "CostEvent",
    "CostKind",
    "JobCostReport",
    "PauseRequest",
    "TenantOrIdle",
    "micro_usd_to_usd",
]


def micro_usd_to_usd(micro_usd: int) -> float:
    """For display only: money is summed as integers."""
    return micro_usd / 1_000_000


class CostKind(enum.StrEnum):
    COMPUTE = "compute"
    ENERGY = "energy"
    IDLE = "idle"


#: A tenant, or empty for an idle line (published on the operator's ``seedance.ledger.idle``).
TenantOrIdle = Annotated[str, msgspec.Meta(pattern=f"^(?:|{_TENANT.pattern[1:-1]})$")]


class CostEntry(Event, frozen=True, kw_only=True, tag="cost.entry.v1"):
    """The cost of one job (or one node's idle capacity) over one period.

    ``cost_micro_usd`` is the whole charge (GPU time + billed energy). A line's later revisions
    carry the *difference* caused by late facts, so summing a tenant's entries gives its cost.
    """

    tenant: TenantOrIdle
    job_id: str
    kind: CostKind = CostKind.COMPUTE
    node: Name = "-"
    gpu_model: str = ""
    period_start: UtcDatetime
    period_end: UtcDatetime
    gpu_hours: float = 0.0
    cost_micro_usd: int
    energy_j: float | None = None
    #: The events this entry derives from: the ledger's idempotency key.
    source_ids: list[str] = msgspec.field(default_factory=list)
    #: The ledger's deterministic line key (``usage:<job>:<node>:<window>:r<revision>``).
    line_id: str = ""
    revision: int = 0
    pricing_tier: str = ""
    #: Exact parts, so that reports (CSV, FOCUS, HTML) can be rebuilt from the stream.
    energy_micro_usd: int = 0
    list_cost_micro_usd: int = 0
    gpu_hours_micro: int = 0
    energy_mj: int = 0
    tflop_hours_micro: int = 0
    activity_ppm: int | None = None
    assumptions: list[str] = msgspec.field(default_factory=list)


class JobCostReport(Event, frozen=True, kw_only=True, tag="cost.job_report.v1"):
    """A finished job's total."""

    tenant: TenantId
    job_id: Name
    started_at: UtcDatetime
    finished_at: UtcDatetime
    gpu_hours: float
    cost_micro_usd: int
    energy_j: float | None = None
    usd_per_tflop_hour: float | None = None
    assumptions: list[str] = msgspec.field(default_factory=list)
    revision: int = 0
    source_ids: list[str] = msgspec.field(default_factory=list)


class BudgetAlert(Event, frozen=True, kw_only=True, tag="cost.budget_alert.v1"):
    tenant: TenantId
    period: str
    budget_micro_usd: int
    spent_micro_usd: int
    forecast_micro_usd: int
    deviation_pct: float
    message: str = ""


class PauseRequest(Event, frozen=True, kw_only=True, tag="cost.pause_request.v1"):
    """Ask the slicer to hold a tenant's new work (the budget guard); ``paused=False`` lifts it."""

    tenant: TenantId
    paused: bool = True
    reason: str = ""


CostEvent = CostEntry | JobCostReport | BudgetAlert | PauseRequest
