"""What the ledger emits: cost lines, job costs, and the running totals they add up to.

Owns ``Amounts`` (the additive integer quantities of a line), ``CostLine`` (one line of one
window), ``JobCost`` (a finished job's total), ``LedgerTotals`` and ``$ per TFLOP-hour``. Every
quantity is one exact integer (micro-USD, millionths of an hour, mJ, ppm): floats exist only on
the wire (``mapping.to_wire``), derived from these. Must not compute attribution; the wire
events of the same facts (``seedance.events.cost``) are mapped in ``mapping``.

The structs' tags and field order are the checkpoint format (the snapshot's outbox holds
them): renaming a class is free, renaming a field or a tag is a new snapshot version.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Literal

import msgspec

__all__ = [
    "Amounts",
    "CostLine",
    "JobCost",
    "LedgerOutput",
    "LedgerTotals",
    "LineUse",
    "output_id",
    "usd_per_tflop_hour_micro",
]


class Amounts(msgspec.Struct, kw_only=True, array_like=True):
    """Additive integer quantities of a line, a job or a tenant.

    Money in micro-USD; ``gpu_hours_micro`` and ``tflop_hours_micro`` in millionths.
    ``allocation_cost_usd_micro``: under measured billing of shared GPUs (price book
    ``[sharing] billing = "measured"``), the GPU-time cost the same line has under allocation
    billing; 0 under allocation billing (where it is ``cost_usd_micro`` itself).
    """

    cost_usd_micro: int = 0
    energy_usd_micro: int = 0
    list_cost_usd_micro: int = 0
    gpu_hours_micro: int = 0
    energy_mj: int = 0
    tflop_hours_micro: int = 0
    allocation_cost_usd_micro: int = 0

    @property
    def total_usd_micro(self) -> int:
        return self.cost_usd_micro + self.energy_usd_micro

    def add(self, other: Amounts, sign: int = 1) -> None:
        self.cost_usd_micro += sign * other.cost_usd_micro
        self.energy_usd_micro += sign * other.energy_usd_micro
        self.list_cost_usd_micro += sign * other.list_cost_usd_micro
        self.gpu_hours_micro += sign * other.gpu_hours_micro
        self.energy_mj += sign * other.energy_mj
        self.tflop_hours_micro += sign * other.tflop_hours_micro
        self.allocation_cost_usd_micro += sign * other.allocation_cost_usd_micro

    def minus(self, other: Amounts) -> Amounts:
        out = self.copy()
        out.add(other, -1)
        return out

    def copy(self) -> Amounts:
        return Amounts(
            cost_usd_micro=self.cost_usd_micro,
            energy_usd_micro=self.energy_usd_micro,
            list_cost_usd_micro=self.list_cost_usd_micro,
            gpu_hours_micro=self.gpu_hours_micro,
            energy_mj=self.energy_mj,
            tflop_hours_micro=self.tflop_hours_micro,
            allocation_cost_usd_micro=self.allocation_cost_usd_micro,
        )

    def is_zero(self) -> bool:
        return not any(msgspec.structs.astuple(self))


def usd_per_tflop_hour_micro(amounts: Amounts) -> int | None:
    """$ per delivered TFLOP-hour in micro-USD, None where no compute was measured."""
    if amounts.tflop_hours_micro <= 0:
        return None
    return round(Fraction(amounts.total_usd_micro, amounts.tflop_hours_micro) * 1_000_000)


LineKind = Literal["usage", "idle"]


class LineUse(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """What a usage line's job held on its node in the window and the most it used there.

    ``kind``, ``gpus``, ``milli`` and ``mig_profile`` are the request (the allocation that
    started last, and every GPU the job held on the node). ``peak_activity_ppm`` and
    ``peak_mem_mib`` are sums over those GPUs of each one's highest sample in the window
    (activity in ppm of one GPU; memory in MiB, 0 where no sample read it): an upper bound of
    the job's simultaneous peak, never below it. On a shared GPU they are the whole GPU's.
    ``samples`` counts the samples read (0: nothing measured). Right-sizing reads this.
    """

    kind: str
    gpus: int
    milli: int
    mig_profile: str
    samples: int
    peak_activity_ppm: int
    peak_mem_mib: int


class CostLine(msgspec.Struct, frozen=True, kw_only=True, tag="cost_entry"):
    """One cost line for one window: a job's usage on one node, or a node's idle.

    ``revision`` 0 is the first emission; a later revision carries the *difference* caused by
    late facts, so the sum of all entries of a line is its exact cost. ``entry_id`` is
    deterministic: publish it as ``Nats-Msg-Id`` and a re-publish is dropped. (Its tag is the
    name the class had before #20, kept: snapshots hold it.)
    """

    entry_id: str
    kind: LineKind
    revision: int
    tenant: str
    job_id: str
    node: str
    gpu_model: str
    pricing_tier: str
    window_start_ms: int
    window_end_ms: int
    amounts: Amounts
    activity_ppm: int | None
    source_event_ids: tuple[str, ...]
    assumptions: tuple[str, ...] = ()
    #: Usage lines: the request and the peaks measured (None: idle, or a snapshot from before).
    usage: LineUse | None = None
    #: The price book's ``[sharing] billing`` the line was computed under.
    shared_billing: str = "allocation"
    #: The line's price is an assumption (a configured price, or the fallback below).
    price_assumed: bool = False
    #: The book could not price the GPU model: billed at the book's fallback price.
    price_fallback: bool = False


class JobCost(msgspec.Struct, frozen=True, kw_only=True, tag="job_cost_report"):
    """What a job cost, emitted once its last window closes (re-emitted on late adjustments)."""

    report_id: str
    revision: int
    job_id: str
    tenant: str
    start_ms: int
    end_ms: int
    amounts: Amounts
    usd_per_tflop_hour_micro: int | None
    source_event_ids: tuple[str, ...]
    shared_billing: str = "allocation"


LedgerOutput = CostLine | JobCost


def output_id(o: LedgerOutput) -> str:
    """The deterministic id of an output (what ``Ledger.confirm_published`` takes)."""
    return o.entry_id if isinstance(o, CostLine) else o.report_id


class LedgerTotals(msgspec.Struct, kw_only=True):
    """Running totals; two ledgers that saw the same events compare equal."""

    by_tenant: dict[str, Amounts] = msgspec.field(default_factory=dict)
    by_job: dict[str, Amounts] = msgspec.field(default_factory=dict)
    idle_by_node: dict[str, Amounts] = msgspec.field(default_factory=dict)
    total: Amounts = msgspec.field(default_factory=Amounts)
    idle: Amounts = msgspec.field(default_factory=Amounts)

    def count(self, node: str, kind: str, tenant: str, job: str, amounts: Amounts) -> None:
        """Add one line's amounts under its node (idle) or its tenant and job (usage)."""
        self.total.add(amounts)
        if kind == "idle":
            self.idle.add(amounts)
            self.idle_by_node.setdefault(node, Amounts()).add(amounts)
        else:
            self.by_tenant.setdefault(tenant, Amounts()).add(amounts)
            self.by_job.setdefault(job, Amounts()).add(amounts)
