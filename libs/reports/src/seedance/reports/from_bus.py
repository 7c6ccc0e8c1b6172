"""Reports of what a cost stream holds: its lines rendered in one of the report formats.

A ``cost.entry`` carries the exact parts of its line (micro-dollars, GPU-hours, energy), so the
CSV, FOCUS and HTML reports of any reader of a cost stream equal the ledger's own to the cent
(``seedance.reports.lines`` rebuilds the lines). Owns the formats, the plain-text table and the
refusal to include idle a reader may not see (``IdleNeedsOperator``); reading the stream is the
SDK's (``seedance.sdk.reports``). The figures come from ``reports.summary``; this module adds no
arithmetic of its own. Must not read the bus or a clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from seedance.reports.lines import ReportLine, lines_from_events
from seedance.reports.rightsizing import Rightsizer, job_uses, rightsizing_text
from seedance.reports.summary import (
    IDLE_KEY,
    CostSummary,
    EmptyReport,
    ReportWindow,
    summarize,
)

__all__ = [
    "FORMATS",
    "EmptyReport",
    "IdleNeedsOperator",
    "lines_from_events",
    "render_lines",
    "summary_text",
]

#: What a report is written as: the HTML report, a grouped text table, the entry CSV, or
#: FOCUS 1.2 CSV.
FORMATS = ("html", "text", "csv", "focus")


class IdleNeedsOperator(LookupError):
    """A report that includes idle was asked for without operator credentials.

    A ``LookupError`` like ``EmptyReport``: the CLIs' contract with the reports is that a
    ``LookupError`` is a report that cannot be made (exit 1), a ``ValueError`` a bad request
    (exit 2). Not a ``PermissionError``: that is an ``OSError``, which the CLI reads as an
    unreachable server."""


def render_lines(
    lines: list[ReportLine],
    *,
    fmt: str,
    tenant: str | None,
    window: ReportWindow,
    by: str,
    share: bool,
    generated_at_ms: int,
    rightsizer: Rightsizer | None = None,
) -> tuple[str, int]:
    """A report of ``lines`` in ``fmt`` and the number of lines it covers (pure).

    ``text`` is the grouped table (``--by``), ``html`` the HTML report, ``csv`` / ``focus``
    the line exports of the window (idle rows only in the fleet's). With a ``rightsizer`` the
    text and HTML reports end with its recommendations for the jobs in the window. Raises
    ``EmptyReport`` when nothing falls in the window.
    """
    from seedance.reports import entries_csv, focus_csv, render_html
    from seedance.reports.html import ReportInput

    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: choose one of {', '.join(FORMATS)}")
    summary = summarize(lines, by=by, window=window, tenant=tenant, share=share)  # type: ignore[arg-type]
    recs = (
        rightsizer.recommend_all(job_uses(lines, window=window, tenant=tenant))
        if rightsizer is not None and fmt in ("text", "html")
        else None
    )
    if fmt == "text":
        text = summary_text(summary)
        if recs is not None and rightsizer is not None:
            text += rightsizing_text(recs, rightsizer.rule)
        return text, summary.lines
    if fmt in ("csv", "focus"):
        chosen = [
            e
            for e in lines
            if window.holds(e) and (tenant is None or (e.kind == "usage" and e.tenant == tenant))
        ]
        return (entries_csv(chosen) if fmt == "csv" else focus_csv(chosen)), len(chosen)
    title = "Seedance costs: fleet" if tenant is None else f"Seedance costs: {tenant}"
    data = ReportInput(
        title=title,
        entries=lines,
        generated_at_ms=generated_at_ms,
        window=window,
        tenant=tenant,
        share_idle=share,
        rightsizing=recs,
        rightsizing_rule=rightsizer.rule if rightsizer is not None else "",
    )
    return render_html(data), summary.lines


def summary_text(s: CostSummary) -> str:
    """The grouped figures as a plain table, for a terminal."""
    head = {"tenant": "tenant", "job": "tenant/job", "node": "node", "gpu_model": "GPU model"}
    idle_col = s.idle_included and (s.idle_shared or s.by in ("node", "gpu_model"))
    out = [
        f"costs of {'the fleet' if s.scope == 'fleet' else 'tenant ' + s.scope}, "
        f"{_iso_minute(s.covered_start_ms)} – {_iso_minute(s.covered_end_ms)} "
        f"(window asked: {s.window.label()}), {s.lines} lines",
        f"{head[s.by]:<40} {'allocated':>14}" + (f" {'idle':>14}" if idle_col else "")
        + f" {'total':>14} {'GPU-h':>10}",
    ]  # fmt: skip
    for r in s.rows:
        name = "idle (unallocated)" if r.key == IDLE_KEY else r.key
        out.append(
            f"{name:<40} {_usd(r.allocated.total_usd_micro):>14}"
            + (f" {_usd(r.idle_usd_micro):>14}" if idle_col else "")
            + f" {_usd(r.total_usd_micro):>14}"
            + f" {(r.allocated.gpu_hours_micro + r.idle_gpu_hours_micro) / 1e6:>10,.2f}"
        )
    out.append(
        f"total {_usd(s.total_usd_micro)} = {_usd(s.allocated.total_usd_micro)} allocated + "
        f"{_usd(s.idle.total_usd_micro)} idle"
        + (" (shared by node and window, OpenCost shareIdle)" if s.idle_shared else "")
        + ("" if s.idle_included else " (idle not included: it is the fleet's; a tenant's "
           "share needs operator credentials and --share-idle)")
    )  # fmt: skip
    if s.idle_shared and s.idle_unshared_usd_micro:
        out.append(
            f"  of the idle, {_usd(s.idle_unshared_usd_micro)} ran on node-windows no job used "
            "and stays unshared"
        )
    if s.idle_by_node and s.by not in ("node", "gpu_model"):
        out.append("idle by node:")
        out.extend(
            f"  {r.key:<30} {r.gpu_model:<10} {_usd(r.idle_usd_micro):>14} "
            f"{r.idle_gpu_hours_micro / 1e6:>10,.2f} GPU-h  {r.idle_pct:5.1f} % of its GPU-h"
            for r in s.idle_by_node
        )
        out.append("idle by GPU model:")
        out.extend(
            f"  {r.key:<30} {_usd(r.idle_usd_micro):>14} "
            f"{r.idle_gpu_hours_micro / 1e6:>10,.2f} GPU-h  {r.idle_pct:5.1f} %"
            for r in s.idle_by_gpu_model
        )
    return "\n".join(out) + "\n"


def _usd(micro: int) -> str:
    return f"${Decimal(micro).scaleb(-6).quantize(Decimal('0.01')):,}"


def _iso_minute(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
