"""What a cost report covers and says: its window, its scope, its groups, and idle.

Owns the pure step from the ledger's lines to the figures every report shows (CLI tables, the
HTML report): which lines fall in a time window, their totals grouped by tenant, job, node or
GPU model, the idle (unallocated) cost by node and GPU model, and, when asked, each tenant's
share of idle. Must not read the bus, a clock or a file, and must not compute costs: it sums
what the ledger emitted, in integer micro-dollars, so every total matches the ledger exactly.

Rules, stated once:
- **Window.** ``[start, end)`` in UTC. A line belongs to a window when its charge period
  *starts* in it. Charge periods are aligned and are never split, so a bound that falls inside
  one moves to the period's edge; the report shows the span its lines really cover beside the
  window that was asked for. An open bound (``None``) takes everything on that side.
- **Empty.** A window with no cost line is an error (:class:`EmptyReport`, "no cost in ..."),
  never a report dated 1970.
- **Scope.** The fleet (every tenant's usage and every node's idle, which needs operator
  credentials) or one tenant. A tenant's own lines never include idle: idle belongs to no
  tenant (``seedance.ledger.idle.<node>``).
- **Share of idle** (OpenCost's ``shareIdle`` with ``idleByNode=true``): each node's idle cost
  in each charge window is split over the jobs that ran on *that node in that window*, in
  proportion to each job's allocated cost (GPU time + billed energy) there, by the largest
  remainder (so the shares of one idle line add up to it exactly; see ``core.idle``). Idle of a
  node-window where no job ran has nobody to carry it and stays as unshared idle. Sharing moves
  cost between rows; it never changes the total. A tenant's share is computed from the fleet's
  lines (the other tenants' allocations on the same nodes set the proportions), so it needs the
  fleet's lines too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Literal

import msgspec

from seedance.reports.idle import IdleShare, share_idle
from seedance.reports.lines import LineAmounts, ReportLine, epoch_ms

__all__ = [
    "GROUPS",
    "CostRow",
    "CostSummary",
    "EmptyReport",
    "IdleRow",
    "ReportWindow",
    "parse_instant",
    "summarize",
]

Group = Literal["tenant", "job", "node", "gpu_model"]
#: What a report can group by (``--by``).
GROUPS: tuple[Group, ...] = ("tenant", "job", "node", "gpu_model")

#: The key of the row that holds idle cost nobody carries, when rows are tenants or jobs.
IDLE_KEY = "__idle__"


class EmptyReport(LookupError):
    """No cost line in the window asked for (a report would have nothing to show)."""


def parse_instant(text: str, field: str) -> int:
    """An ISO 8601 instant as epoch milliseconds. Without an offset it is read as UTC (the
    ledger is UTC throughout); with one it is converted. ``field`` names the option."""
    raw = text.strip()
    try:
        t = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        raise ValueError(
            f"{field} = {text!r} is not an ISO 8601 time (e.g. 2026-01-01 or 2026-01-01T09:30:00Z)"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return epoch_ms(t)


def _iso_minute(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


class ReportWindow(msgspec.Struct, frozen=True, kw_only=True):
    """``[start_ms, end_ms)`` in epoch milliseconds (UTC); ``None`` is an open bound."""

    start_ms: int | None = None
    end_ms: int | None = None

    def __post_init__(self) -> None:
        if self.start_ms is not None and self.end_ms is not None and self.start_ms >= self.end_ms:
            raise ValueError(
                f"window from {_iso_minute(self.start_ms)} to {_iso_minute(self.end_ms)}: "
                "--from must be before --to"
            )

    @classmethod
    def parse(cls, start: str | None, end: str | None) -> ReportWindow:
        """From the ``--from`` / ``--to`` texts (either may be None)."""
        return cls(
            start_ms=None if start is None else parse_instant(start, "--from"),
            end_ms=None if end is None else parse_instant(end, "--to"),
        )

    def holds(self, line: ReportLine) -> bool:
        s = line.window_start_ms
        return (self.start_ms is None or s >= self.start_ms) and (
            self.end_ms is None or s < self.end_ms
        )

    def label(self) -> str:
        if self.start_ms is None and self.end_ms is None:
            return "the whole stream"
        a = "the start" if self.start_ms is None else _iso_minute(self.start_ms)
        b = "now" if self.end_ms is None else _iso_minute(self.end_ms)
        return f"{a} – {b}"


class CostRow(msgspec.Struct, kw_only=True):
    """One group's figures. ``idle_usd_micro`` is the idle this row carries: a node's or a GPU
    model's own idle, or (tenant and job rows, with sharing) its share of idle."""

    key: str
    tenant: str = ""  # the job's tenant (job rows)
    allocated: LineAmounts = msgspec.field(default_factory=LineAmounts)
    idle_usd_micro: int = 0
    idle_gpu_hours_micro: int = 0
    jobs: int = 0

    @property
    def total_usd_micro(self) -> int:
        return self.allocated.total_usd_micro + self.idle_usd_micro


class IdleRow(msgspec.Struct, frozen=True, kw_only=True):
    """Idle (unallocated) capacity of one node or one GPU model."""

    key: str
    gpu_model: str
    idle_usd_micro: int
    idle_gpu_hours_micro: int
    gpu_hours_micro: int  # allocated + idle: the capacity the idle is a part of

    @property
    def idle_pct(self) -> float:
        total = self.gpu_hours_micro
        return 100 * self.idle_gpu_hours_micro / total if total else 0.0


class CostSummary(msgspec.Struct, frozen=True, kw_only=True):
    """The figures of one report. ``total_usd_micro`` = allocated + the idle in scope."""

    scope: str  # "fleet" or the tenant's name
    window: ReportWindow
    covered_start_ms: int
    covered_end_ms: int
    by: Group
    rows: list[CostRow]
    allocated: LineAmounts
    idle: LineAmounts  # the idle in scope: the fleet's, a tenant's share, or none
    idle_included: bool
    idle_shared: bool
    idle_unshared_usd_micro: int
    idle_by_node: list[IdleRow]
    idle_by_gpu_model: list[IdleRow]
    lines: int

    @property
    def total_usd_micro(self) -> int:
        return self.allocated.total_usd_micro + self.idle.total_usd_micro


class _Tally:
    """The sums of one summary as its lines are read: rows, totals, each node's idle."""

    def __init__(self, by: Group) -> None:
        self.by = by
        self.rows: dict[str, CostRow] = {}
        self.seen_jobs: dict[str, set[tuple[str, str]]] = defaultdict(set)
        self.allocated, self.idle = LineAmounts(), LineAmounts()
        self.node_model: dict[str, str] = {}
        self.node_hours: dict[str, int] = defaultdict(int)
        self.node_idle: dict[str, LineAmounts] = defaultdict(LineAmounts)

    def row(self, key: str, job_tenant: str = "") -> CostRow:
        if key not in self.rows:
            self.rows[key] = CostRow(key=key, tenant=job_tenant)
        return self.rows[key]

    def add(self, e: ReportLine) -> None:
        a, by = e.amounts, self.by
        self.node_model.setdefault(e.node, e.gpu_model)
        self.node_hours[e.node] += a.gpu_hours_micro
        if e.kind == "idle":
            self.idle.add(a)
            self.node_idle[e.node].add(a)
            if by in ("node", "gpu_model"):
                r = self.row(e.node if by == "node" else e.gpu_model)
                r.idle_usd_micro += a.total_usd_micro
                r.idle_gpu_hours_micro += a.gpu_hours_micro
            return
        self.allocated.add(a)
        key = {
            "tenant": e.tenant,
            "job": f"{e.tenant}/{e.job_id}",
            "node": e.node,
            "gpu_model": e.gpu_model,
        }[by]
        self.row(key, e.tenant if by == "job" else "").allocated.add(a)
        self.seen_jobs[key].add((e.tenant, e.job_id))

    def add_shares(self, shares: Iterable[IdleShare]) -> int:
        """Each job's share of idle into its row; the total shared."""
        total = 0
        for s in shares:
            model = self.node_model.get(s.node, "")
            key = {"tenant": s.tenant, "job": f"{s.tenant}/{s.job_id}", "node": s.node}.get(
                self.by, model
            )
            self.row(key, s.tenant if self.by == "job" else "").idle_usd_micro += s.idle_usd_micro
            total += s.idle_usd_micro
        return total

    def add_uncarried(self, left_usd_micro: int, shared: bool) -> None:
        if left_usd_micro:
            r = self.row(IDLE_KEY)
            r.idle_usd_micro += left_usd_micro
            r.idle_gpu_hours_micro += 0 if shared else self.idle.gpu_hours_micro

    def idle_rows(self, key_of: dict[str, str]) -> list[IdleRow]:
        """Idle by node (``key_of`` maps a node to itself) or by GPU model."""
        acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        models: dict[str, str] = {}
        for node, hours in self.node_hours.items():
            k = key_of[node]
            models[k] = self.node_model[node]
            idle = self.node_idle.get(node)
            acc[k][0] += idle.total_usd_micro if idle else 0
            acc[k][1] += idle.gpu_hours_micro if idle else 0
            acc[k][2] += hours
        out = [
            IdleRow(
                key=k,
                gpu_model=models[k],
                idle_usd_micro=v[0],
                idle_gpu_hours_micro=v[1],
                gpu_hours_micro=v[2],
            )
            for k, v in acc.items()
            if v[0] or v[1]
        ]
        return sorted(out, key=lambda r: (-r.idle_usd_micro, r.key))


def summarize(
    lines: Iterable[ReportLine],
    *,
    by: Group = "tenant",
    window: ReportWindow | None = None,
    tenant: str | None = None,
    share: bool = False,
) -> CostSummary:
    """The report of ``lines`` in ``window``, for the fleet (``tenant=None``) or one tenant.

    ``lines`` are what the reader could see: the fleet's lines (usage and idle) with operator
    credentials, or one tenant's usage lines. ``share`` charges idle to tenants and jobs (see the
    module's rules); it needs the fleet's idle lines among ``lines``, which the caller ensures.

    Raises:
        EmptyReport: no line of the scope in the window.
        ValueError: ``by`` is not one of :data:`GROUPS`.
    """
    if by not in GROUPS:
        raise ValueError(f"--by {by!r}: choose one of {', '.join(GROUPS)}")
    window = window or ReportWindow()
    in_window = [e for e in lines if window.holds(e)]
    shares = share_idle(in_window)[0] if share else []
    if tenant is not None:
        in_window = [e for e in in_window if e.kind == "usage" and e.tenant == tenant]
        shares = [s for s in shares if s.tenant == tenant]
    if not in_window:
        whose = "" if tenant is None else f" for tenant {tenant!r}"
        raise EmptyReport(f"no cost{whose} in {window.label()}")

    t = _Tally(by)
    for e in in_window:
        t.add(e)
    shared_total = 0
    if tenant is not None or by in ("tenant", "job"):
        # A fleet report by node or GPU model already shows each idle line where it arose.
        shared_total = t.add_shares(shares)
    if tenant is None and by in ("tenant", "job"):
        # Idle nobody carries (all of it without sharing) is a row of its own.
        t.add_uncarried(t.idle.total_usd_micro - shared_total, share)
    for key, jobs in t.seen_jobs.items():
        t.rows[key].jobs = len(jobs)
    idle_in_scope = t.idle
    if tenant is not None:
        # A tenant carries idle only as its share: money, no GPU-hours of its own.
        idle_in_scope = LineAmounts(cost_usd_micro=sum(s.idle_usd_micro for s in shares))
    fleet = tenant is None
    return CostSummary(
        scope="fleet" if tenant is None else tenant,
        window=window,
        covered_start_ms=min(e.window_start_ms for e in in_window),
        covered_end_ms=max(e.window_end_ms for e in in_window),
        by=by,
        rows=sorted(t.rows.values(), key=lambda r: (r.key == IDLE_KEY, -r.total_usd_micro, r.key)),
        allocated=t.allocated,
        idle=idle_in_scope,
        idle_included=fleet or share,
        idle_shared=share,
        idle_unshared_usd_micro=t.idle.total_usd_micro - shared_total if fleet else 0,
        idle_by_node=t.idle_rows({n: n for n in t.node_hours}) if fleet else [],
        idle_by_gpu_model=t.idle_rows(t.node_model) if fleet else [],
        lines=len(in_window),
    )
