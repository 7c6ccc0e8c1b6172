"""Cost events: entries while jobs run, a report when a job ends, budget alerts and pauses.

Money is integer micro-dollars (``*_micro_usd``) so that sums are exact and a recomputation
from the same events matches to the cent, whatever the order of addition.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Sequence
from typing import Annotated, TypeVar

import msgspec

from seedance.events.base import Event, UtcDatetime
from seedance.events.tokens import _TENANT_BODY, Name, TenantId, anchored

__all__ = [
    "MAX_SOURCE_IDS",
    "BudgetAlert",
    "CostEntry",
    "CostEntryV1",
    "CostEvent",
    "CostKind",
    "JobCostReport",
    "MeasuredUse",
    "PauseRequest",
    "TenantOrIdle",
    "bounded_source_ids",
    "current",
    "is_source_summary",
    "micro_usd_to_usd",
    "source_count",
    "source_digest",
    "upgrade",
]

#: The most entries one output's ``source_ids`` holds (a report's id first, then as many):
#: past it, the first ``MAX_SOURCE_IDS - 1`` and one entry naming the rest by count and a
#: digest over the whole sorted set (``bounded_source_ids``). So a line's size does not grow
#: with its window's length nor its node's sampling rate.
MAX_SOURCE_IDS = 128
_MORE = re.compile(r"\+([0-9]+)-more-of-([0-9]+):sha256:([0-9a-f]{64})")


def source_digest(ids: Sequence[str]) -> str:
    """SHA-256 (hex) over the sorted set of ``ids``, encoded as a compact JSON array of strings
    (``msgspec.json.encode(sorted(set(ids)))``; Python's ``json.dumps(..., separators=(",",
    ":"), ensure_ascii=False)`` gives the same bytes for ids without control characters): what
    an auditor recomputes from a window's facts to check a capped list."""
    return hashlib.sha256(msgspec.json.encode(sorted(set(ids)))).hexdigest()


def bounded_source_ids(ids: Sequence[str], limit: int = MAX_SOURCE_IDS) -> list[str]:
    """``ids`` (distinct, in the order to list them) as at most ``limit`` entries: all of them
    where they fit, else the first ``limit - 1`` and ``+<rest>-more-of-<total>:sha256:<hex>``
    (``source_digest`` of all ``ids``; longer than any event id, so no id reads as one). A
    pure function of ``ids``: the same on every replica; a list it returns comes back
    unchanged."""
    if len(ids) <= limit:
        return list(ids)
    keep = limit - 1
    return [*ids[:keep], f"+{len(ids) - keep}-more-of-{len(ids)}:sha256:{source_digest(ids)}"]


def is_source_summary(entry: str) -> bool:
    """Whether ``entry`` is a capped list's last entry (``bounded_source_ids``), not an id."""
    return _MORE.fullmatch(entry) is not None


def source_count(ids: Sequence[str]) -> int:
    """How many sources ``ids`` stands for: its entries, a capped list's last one counted as
    the sources it names (``bounded_source_ids``)."""
    more = _MORE.fullmatch(ids[-1]) if ids else None
    return len(ids) if more is None else len(ids) - 1 + int(more.group(1))


def micro_usd_to_usd(micro_usd: int) -> float:
    """For display only: money is summed as integers."""
    return micro_usd / 1_000_000


class CostKind(enum.StrEnum):
    COMPUTE = "compute"
    ENERGY = "energy"
    IDLE = "idle"


#: A tenant, or empty for an idle line (published on the operator's ``seedance.ledger.idle``).
TenantOrIdle = Annotated[str, msgspec.Meta(pattern=anchored(f"(?:|{_TENANT_BODY})"))]


class MeasuredUse(msgspec.Struct, frozen=True, kw_only=True):
    """What a usage line's job held in its window and the most it was measured using there:
    what right-sizing reads (``seedance.reports.rightsizing``).

    The request: ``kind`` (``whole`` / ``shared`` / ``mig``), ``gpus`` held on the line's node,
    ``milli`` (a share's thousandths of its GPU) and ``mig_profile``. The peaks are sums over
    those GPUs of each GPU's highest single sample in the window (activity in ppm of one GPU, so
    two GPUs both at 100 % read 2,000,000; used memory in MiB): never below the job's
    simultaneous peak. On a shared GPU they are the GPU's (all its sharers'), unless
    ``measured_by`` is ``pod`` (the node agent's per-pod share). ``peak_mem_mib`` 0: no
    memory reading; ``samples`` 0: nothing measured.
    """

    kind: str
    gpus: int
    milli: int = 1000
    mig_profile: str = ""
    samples: int = 0
    peak_activity_ppm: int = 0
    peak_mem_mib: int = 0
    measured_by: str = "gpu"


class CostEntry(Event, frozen=True, kw_only=True, tag="cost.entry.v2"):
    """The cost of one job (or one node's idle capacity) over one period, exactly.

    ``cost_micro_usd`` is the whole charge (GPU time + billed energy). A line's later revisions
    carry the *difference* caused by late facts, so summing a tenant's entries gives its cost.
    Every quantity is an integer in the unit its name says: sums are exact in any order. v2
    retires v1's float twins (``gpu_hours``: ``gpu_hours_micro / 1e6``; ``energy_j``:
    ``energy_mj / 1000``).
    """

    tenant: TenantOrIdle
    job_id: str
    kind: CostKind = CostKind.COMPUTE
    node: Name = "-"
    gpu_model: str = ""
    period_start: UtcDatetime
    period_end: UtcDatetime
    cost_micro_usd: int
    #: GPU-hours in millionths.
    gpu_hours_micro: int
    #: The events this entry derives from: its window's facts (placements, ends, inventories),
    #: then the sample batches read (each once, by the batch's id); at most ``MAX_SOURCE_IDS``
    #: entries, the last naming the rest by count and digest where they do not fit
    #: (``bounded_source_ids``; entries published before that list every reading,
    #: ``<batch id>:<gpu index>``).
    source_ids: list[str] = msgspec.field(default_factory=list)
    #: The ledger's deterministic line key (``usage:<job>:<node>:<window>:r<revision>``).
    line_id: str = ""
    revision: int = 0
    pricing_tier: str = ""
    #: Exact parts, so that reports (CSV, FOCUS, HTML) can be rebuilt from the stream.
    energy_micro_usd: int = 0
    list_cost_micro_usd: int = 0
    energy_mj: int = 0
    tflop_hours_micro: int = 0
    activity_ppm: int | None = None
    assumptions: list[str] = msgspec.field(default_factory=list)
    #: What the job held and the most it used (usage lines; None: not known, e.g. idle).
    usage: MeasuredUse | None = None
    #: Where the ledger bills shared GPUs by measured share (price book ``[sharing] billing =
    #: "measured"``): the line's GPU-time cost under allocation billing, beside the measured
    #: ``cost_micro_usd - energy_micro_usd``. None under allocation billing.
    allocation_cost_micro_usd: int | None = None
    #: The price is an assumption (configured, not quoted), or the fallback below.
    price_assumed: bool = False
    #: The price book could not price ``gpu_model``: billed at the book's fallback price.
    price_fallback: bool = False


def upgrade(entry: CostEntryV1) -> CostEntry:
    """The v2 entry a v1 entry stands for (same id: it is the same entry).

    The exact fields where v1 has them; else (the earliest v1 entries) the floats, rounded once
    to the unit v2 counts in.
    """
    energy_mj = entry.energy_mj or (round(entry.energy_j * 1000) if entry.energy_j else 0)
    return CostEntry(
        id=entry.id,
        at=entry.at,
        tenant=entry.tenant,
        job_id=entry.job_id,
        kind=entry.kind,
        node=entry.node,
        gpu_model=entry.gpu_model,
        period_start=entry.period_start,
        period_end=entry.period_end,
        cost_micro_usd=entry.cost_micro_usd,
        gpu_hours_micro=entry.gpu_hours_micro or round(entry.gpu_hours * 1_000_000),
        source_ids=list(entry.source_ids),
        line_id=entry.line_id,
        revision=entry.revision,
        pricing_tier=entry.pricing_tier,
        energy_micro_usd=entry.energy_micro_usd,
        list_cost_micro_usd=entry.list_cost_micro_usd,
        energy_mj=energy_mj,
        tflop_hours_micro=entry.tflop_hours_micro,
        activity_ppm=entry.activity_ppm,
        assumptions=list(entry.assumptions),
    )


_T = TypeVar("_T")


def current(event: _T) -> _T | CostEntry:
    """``event`` as a reader of today's cost stream sees it: a v1 entry as v2, else itself."""
    return upgrade(event) if isinstance(event, CostEntryV1) else event


class CostEntryV1(Event, frozen=True, kw_only=True, tag="cost.entry.v1"):
    """Retired: what the ledger published before ``cost.entry.v2`` (``CostEntry``).

    Decoded still, since a stored cost stream may hold it; readers see it as v2 through
    ``current``. It carried float twins of exact quantities (``gpu_hours`` beside
    ``gpu_hours_micro``, ``energy_j`` beside ``energy_mj``); entries of the earliest ledgers
    have only the floats (their exact fields are 0).
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
    #: The ledger's report id, then the job's allocations and ends, bounded as a cost entry's
    #: (``bounded_source_ids``: at most ``MAX_SOURCE_IDS`` after the report id).
    source_ids: list[str] = msgspec.field(default_factory=list)
    #: Under measured billing of shared GPUs, the job's GPU-time cost under allocation billing
    #: (``cost_micro_usd`` less energy is the measured bill); None under allocation billing.
    allocation_cost_micro_usd: int | None = None


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


#: The family's union: both entry versions (v1 stays until no stored stream holds it).
CostEvent = CostEntry | CostEntryV1 | JobCostReport | BudgetAlert | PauseRequest
