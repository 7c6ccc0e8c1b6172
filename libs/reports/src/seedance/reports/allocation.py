"""The allocation API's answer, computed from the cost lines a stream prefix holds.

Owns the pure step from an ``AllocationQuery`` (OpenCost ``/allocation`` parameters), the scope
the subject gave (the fleet or one tenant) and the lines of ``SEEDANCE_COSTS`` messages
1..``as_of_seq`` to an ``AllocationAnswer`` or an ``AllocationRefusal`` naming the bad
parameter. The figures are ``reports.summary.summarize``'s, so the API, ``seedance costs
report`` and the HTML report agree to the micro-dollar. Must not read the bus or a clock: a
relative window (``7d``) ends at the newest charge period among the lines, the ledger's own
event time, so every replica answering as of one sequence gives one answer, and a replayed
fleet (virtual time) is answered as a live one is.

Scope rules, stated once:
- **Fleet** (operators): every tenant's usage; ``include_idle`` adds the idle lines (the
  ``__idle__`` row by tenant or job, each node's or model's own idle by node or GPU model, and
  idle by node); ``share_idle`` splits idle over the jobs beside it (what no job ran beside
  stays in ``__idle__``), so the totals are the fleet's cost, allocated + idle, either way.
- **A tenant**: its own usage lines only. ``include_idle`` alone is refused (the fleet's idle is
  no tenant's). ``share_idle`` adds its jobs' shares of idle, computed here from the fleet's
  lines; the answer shows only the tenant's rows and their share (see docs/cost-ledger.md,
  "What a tenant's shareIdle reveals").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from seedance.events.allocation import (
    AllocationAnswer,
    AllocationQuery,
    AllocationRefusal,
    AllocationReply,
    AllocationRow,
    IdleAllocation,
)
from seedance.events.subjects import api
from seedance.reports.lines import LineAmounts, ReportLine
from seedance.reports.rightsizing import Rightsizer, job_uses
from seedance.reports.summary import (
    GROUPS,
    IDLE_KEY,
    CostRow,
    EmptyReport,
    IdleRow,
    ReportWindow,
    parse_instant,
    summarize,
)

__all__ = [
    "FLEET",
    "MAX_SPAN_DAYS",
    "MAX_WINDOW_CHARS",
    "RELATIVE_UNITS_S",
    "allocation",
    "query_refusal",
    "resolve_window",
]

#: The scope of an operator's fleet-wide answer.
FLEET = "fleet"
#: Units of a relative window (``7d``, ``24h``, ``90m``).
RELATIVE_UNITS_S = {"m": 60, "h": 3600, "d": 86_400}
_RELATIVE = re.compile(r"([1-9][0-9]{0,5})([mhd])")
#: The longest window a query may span (relative or absolute): a century. The cost stream
#: keeps 400 days, so nothing is lost; the bound keeps every resolved bound a date
#: (``999999d`` once resolved to the year -711 and crashed the answer: no reply at all).
MAX_SPAN_DAYS = 36_525
_MAX_SPAN_MS = MAX_SPAN_DAYS * 86_400_000
#: Every resolved bound lies in [the Unix epoch, year 9999]: no cost line is dated before the
#: epoch (events carry UTC epoch times), and Python's dates end with 9999.
_EARLIEST_MS = 0
_LATEST_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


class _Refused(ValueError):
    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter


#: The longest window parameter read: two RFC 3339 instants with fractions and offsets and a
#: comma take about 70 characters.
MAX_WINDOW_CHARS = 100


def _shown(text: str) -> str:
    """``text`` as a refusal repeats it: quoted, whole up to `MAX_WINDOW_CHARS`, else its
    first 40 characters."""
    if len(text) <= MAX_WINDOW_CHARS:
        return repr(text)
    return repr(text[:40]) + "..."


def resolve_window(text: str, newest_end_ms: int | None) -> ReportWindow:
    """``[start, end)`` of a window parameter; ``newest_end_ms`` ends a relative one (None:
    no line yet, so a relative window is the whole, empty, stream). A window spans at most
    ``MAX_SPAN_DAYS``; a relative one starts at the epoch at the earliest, an absolute one
    must lie between the epoch and the end of year 9999.

    Raises ``ValueError`` naming ``window`` and the forms it takes.
    """
    forms = "give 7d, 24h, 90m or start,end in RFC 3339 (2026-03-01T00:00:00Z,2026-03-02T00:00:00Z)"
    if len(text) > MAX_WINDOW_CHARS:
        # A refusal repeats what it refuses: of a 400 KB window it would be an 800 KB reply,
        # and past the server's payload limit none at all (the asker timed out).
        raise _Refused(
            "window",
            f"window {_shown(text)} is {len(text)} characters, over {MAX_WINDOW_CHARS}: {forms}",
        )
    raw = text.strip()
    m = _RELATIVE.fullmatch(raw)
    if m:
        span_ms = int(m.group(1)) * RELATIVE_UNITS_S[m.group(2)] * 1000
        if span_ms > _MAX_SPAN_MS:
            raise _Refused(
                "window", f"window {_shown(text)} spans more than {MAX_SPAN_DAYS} days (a century)"
            )
        if newest_end_ms is None:
            return ReportWindow()
        # No cost line is older than the epoch, so a longer look back covers the same lines.
        return _bounded(text, max(newest_end_ms - span_ms, _EARLIEST_MS), newest_end_ms)
    parts = raw.split(",")
    if len(parts) != 2:
        raise _Refused("window", f"window {_shown(text)} is not a window: {forms}")
    try:
        start, end = (parse_instant(p, "window") for p in parts)
    except ValueError as exc:
        raise _Refused("window", f"window {_shown(text)}: {exc}; {forms}") from None
    if start >= end:
        raise _Refused("window", f"window {_shown(text)}: its start must be before its end")
    if end - start > _MAX_SPAN_MS:
        raise _Refused(
            "window", f"window {_shown(text)} spans more than {MAX_SPAN_DAYS} days (a century)"
        )
    return _bounded(text, start, end)


def _bounded(text: str, start_ms: int, end_ms: int) -> ReportWindow:
    if not _EARLIEST_MS <= start_ms < end_ms <= _LATEST_MS:
        raise _Refused(
            "window",
            f"window {_shown(text)} reaches outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59.999Z "
            "(no cost line lies there)",
        )
    return ReportWindow(start_ms=start_ms, end_ms=end_ms)


def _row(r: CostRow) -> AllocationRow:
    a = r.allocated
    return AllocationRow(
        name=r.key,
        tenant=r.tenant,
        jobs=r.jobs,
        gpu_hours_micro=a.gpu_hours_micro,
        idle_gpu_hours_micro=r.idle_gpu_hours_micro,
        cost_usd_micro=a.cost_usd_micro,
        energy_usd_micro=a.energy_usd_micro,
        idle_usd_micro=r.idle_usd_micro,
        list_cost_usd_micro=a.list_cost_usd_micro,
        tflop_hours_micro=a.tflop_hours_micro,
        energy_mj=a.energy_mj,
        total_usd_micro=r.total_usd_micro,
    )


def _totals(allocated: LineAmounts, idle: LineAmounts) -> AllocationRow:
    return AllocationRow(
        name="total",
        gpu_hours_micro=allocated.gpu_hours_micro,
        idle_gpu_hours_micro=idle.gpu_hours_micro,
        cost_usd_micro=allocated.cost_usd_micro,
        energy_usd_micro=allocated.energy_usd_micro,
        idle_usd_micro=idle.total_usd_micro,
        list_cost_usd_micro=allocated.list_cost_usd_micro,
        tflop_hours_micro=allocated.tflop_hours_micro,
        energy_mj=allocated.energy_mj,
        total_usd_micro=allocated.total_usd_micro + idle.total_usd_micro,
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _check(q: AllocationQuery, tenant: str | None) -> None:
    if q.aggregate not in GROUPS:
        raise _Refused("aggregate", f"aggregate {q.aggregate!r} is not one of {', '.join(GROUPS)}")
    if tenant is not None and q.include_idle and not q.share_idle:
        raise _Refused(
            "include_idle",
            "include_idle: the fleet's idle belongs to no tenant, so a tenant's allocation "
            "carries idle only as its share (share_idle=true); the fleet's idle is on "
            f"{api.allocation(None)}, for operators",
        )


def query_refusal(
    query: AllocationQuery, *, tenant: str | None, rightsizer: Rightsizer | None = None
) -> AllocationRefusal | None:
    """The refusal of ``query`` for the fleet (``tenant=None``) or ``tenant`` when it is bad
    whatever the stream holds (a parameter out of its bounds, a window that is no window),
    else None: an answerer refuses a bad query at once, before it reads anything."""
    try:
        _check(query, tenant)
        if query.rightsize and rightsizer is None:
            raise _Refused("rightsize", "rightsize: this answerer has no price book to size by")
        resolve_window(query.window, None)  # its form and bounds; its end comes from the lines
    except _Refused as exc:
        return AllocationRefusal(parameter=exc.parameter, message=str(exc))
    return None


def allocation(
    lines: Sequence[ReportLine],
    query: AllocationQuery,
    *,
    tenant: str | None,
    as_of_seq: int,
    stream: str = "SEEDANCE_COSTS",
    replica: str = "",
    rightsizer: Rightsizer | None = None,
) -> AllocationReply:
    """The answer to ``query`` for the fleet (``tenant=None``) or ``tenant``, from ``lines``
    (every line of the stream's messages 1..``as_of_seq``: usage and idle); a refusal naming
    the parameter for a bad query. An empty window is an answer with no rows. With
    ``query.rightsize`` the answer carries ``rightsizer``'s recommendations for the scope's
    jobs in the window (the ledger's, which holds the price book)."""
    refused = query_refusal(query, tenant=tenant, rightsizer=rightsizer)
    if refused is not None:
        return refused
    newest = max((e.window_end_ms for e in lines), default=None)
    try:
        window = resolve_window(query.window, newest)
    except _Refused as exc:
        return AllocationRefusal(parameter=exc.parameter, message=str(exc))
    idle = query.include_idle or query.share_idle
    seen = lines if idle else [e for e in lines if e.kind == "usage"]
    empty = AllocationAnswer(
        scope=tenant or FLEET,
        stream=stream,
        as_of_seq=as_of_seq,
        aggregate=query.aggregate,
        include_idle=query.include_idle and tenant is None,
        share_idle=query.share_idle,
        window_start_ms=window.start_ms,
        window_end_ms=window.end_ms,
        window=_label(window),
        totals=_totals(LineAmounts(), LineAmounts()),
        replica=replica,
    )
    try:
        s = summarize(
            seen,
            by=query.aggregate,  # type: ignore[arg-type]  # checked against GROUPS above
            window=window,
            tenant=tenant,
            share=query.share_idle,
        )
    except EmptyReport:
        return empty
    fleet_idle = tenant is None and idle
    return msgspec.structs.replace(
        empty,
        covered_start_ms=s.covered_start_ms,
        covered_end_ms=s.covered_end_ms,
        lines=s.lines,
        allocations=[_row(r) for r in s.rows if idle or r.key != IDLE_KEY],
        totals=_totals(s.allocated, s.idle),
        idle_unshared_usd_micro=s.idle_unshared_usd_micro if fleet_idle else 0,
        idle_by_node=[_idle(r) for r in s.idle_by_node] if fleet_idle else [],
        rightsizing=(
            rightsizer.recommend_all(job_uses(lines, window=window, tenant=tenant))
            if query.rightsize and rightsizer is not None
            else []
        ),
        rightsizing_rule=rightsizer.rule if query.rightsize and rightsizer is not None else "",
    )


def _label(window: ReportWindow) -> str:
    if window.start_ms is None or window.end_ms is None:
        return "the whole stream"
    return f"{_iso(window.start_ms)},{_iso(window.end_ms)}"


def _idle(r: IdleRow) -> IdleAllocation:
    return IdleAllocation(
        node=r.key,
        gpu_model=r.gpu_model,
        idle_usd_micro=r.idle_usd_micro,
        idle_gpu_hours_micro=r.idle_gpu_hours_micro,
        gpu_hours_micro=r.gpu_hours_micro,
    )
