"""Reports from the bus: rebuild the core's cost lines from cost events, and render them.

A ``cost.entry.v1`` carries the exact parts of its line (micro-dollars, GPU-hours, energy), so the
CSV, FOCUS and HTML reports of any reader of a cost stream equal the ledger's own to the cent.
Owns what a report reads (a tenant's own stream, or the fleet's with idle under operator
credentials) and the refusal to include idle when the reader may not see it. The figures come
from ``reports.summary``; this module adds no arithmetic of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from seedance.cost_ledger.core.lines import Amounts
from seedance.cost_ledger.core.lines import CostLine as LedgerLine
from seedance.cost_ledger.core.windows import epoch_ms
from seedance.cost_ledger.reports.summary import (
    IDLE_KEY,
    CostSummary,
    EmptyReport,
    ReportWindow,
    summarize,
)
from seedance.events.cost import CostEntry, CostKind

__all__ = [
    "FORMATS",
    "EmptyReport",
    "IdleNeedsOperator",
    "lines_from_events",
    "render_lines",
    "render_report",
    "render_tenant_report",
    "summary_text",
]

#: What a report is written as: the HTML report, a grouped text table, the entry CSV, or
#: FOCUS 1.2 CSV.
FORMATS = ("html", "text", "csv", "focus")


class IdleNeedsOperator(LookupError):
    """A report that includes idle was asked for without operator credentials.

    A ``LookupError`` like ``EmptyReport``: the CLI's contract with this plugin is that a
    ``LookupError`` is a report that cannot be made (exit 1), a ``ValueError`` a bad request
    (exit 2). Not a ``PermissionError``: that is an ``OSError``, which the CLI reads as an
    unreachable server."""


def lines_from_events(events: Iterable[object]) -> list[LedgerLine]:
    """The ledger lines of the ``CostEntry`` events among ``events`` (others are skipped)."""
    out: list[LedgerLine] = []
    for ev in events:
        if not isinstance(ev, CostEntry):
            continue
        out.append(
            LedgerLine(
                entry_id=ev.line_id or ev.id,
                kind="idle" if ev.kind == CostKind.IDLE else "usage",
                revision=ev.revision,
                tenant=ev.tenant,
                job_id=ev.job_id,
                node=ev.node,
                gpu_model=ev.gpu_model,
                pricing_tier=ev.pricing_tier,
                window_start_ms=epoch_ms(ev.period_start),
                window_end_ms=epoch_ms(ev.period_end),
                amounts=Amounts(
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
            )
        )
    return out


def render_lines(
    lines: list[LedgerLine],
    *,
    fmt: str,
    tenant: str | None,
    window: ReportWindow,
    by: str,
    share: bool,
    generated_at_ms: int,
) -> tuple[str, int]:
    """A report of ``lines`` in ``fmt`` and the number of lines it covers (pure).

    ``text`` is the grouped table (``--by``), ``html`` the HTML report, ``csv`` / ``focus``
    the line exports of the window (idle rows only in the fleet's). Raises ``EmptyReport``
    when nothing falls in the window.
    """
    from seedance.cost_ledger.reports import entries_csv, focus_csv, render_html
    from seedance.cost_ledger.reports.html import ReportInput

    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: choose one of {', '.join(FORMATS)}")
    summary = summarize(lines, by=by, window=window, tenant=tenant, share=share)  # type: ignore[arg-type]
    if fmt == "text":
        return summary_text(summary), summary.lines
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


async def render_report(
    client: Any,
    *,
    tenant: str | None,
    fmt: str = "html",
    start: str | None = None,
    end: str | None = None,
    by: str = "tenant",
    share_idle: bool = False,
) -> tuple[str, int]:
    """A report from what the cost stream holds, and the number of lines it covers.

    ``client`` is a connected ``seedance.sdk.SeedanceClient``. ``tenant=None`` is the fleet
    report (all tenants and the idle lines: operator credentials). A tenant's report reads the
    tenant's own stream (its own credentials suffice) and has no idle; with ``share_idle`` it
    reads the fleet instead, since the share depends on the idle lines and on the other
    tenants' allocations beside it, which a tenant may not read: with a tenant's credentials
    that is refused with :class:`IdleNeedsOperator`. ``start`` / ``end`` are ISO 8601 (UTC).
    The ``seedance costs report`` command finds this function through the ``seedance.cli``
    entry point, so the SDK never imports the ledger.

    Raises:
        EmptyReport: no cost line in the window.
        IdleNeedsOperator: ``share_idle`` without operator credentials.
        ValueError: a bad format, grouping or time.
    """
    from seedance.sdk.client import PermissionRefused

    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: choose one of {', '.join(FORMATS)}")
    window = ReportWindow.parse(start, end)
    if tenant is None or share_idle:
        try:
            events = await client.fleet_cost_history()
        except PermissionRefused as exc:
            what = "the fleet report" if tenant is None else f"tenant {tenant}'s share of idle"
            raise IdleNeedsOperator(
                f"{what} needs operator credentials: idle lines (seedance.ledger.idle.<node>) "
                "and the allocations they are shared by are not readable with these "
                f"({exc.server_text or exc}); without --share-idle a tenant's report has its "
                "own costs and no idle"
            ) from None
    else:
        events = await client.cost_history(tenant)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return render_lines(
        lines_from_events(events),
        fmt=fmt,
        tenant=tenant,
        window=window,
        by=by,
        share=share_idle,
        generated_at_ms=now_ms,
    )


async def render_tenant_report(client: Any, tenant: str, fmt: str) -> tuple[str, int]:
    """A tenant's whole report (no window, no idle): ``render_report`` for one tenant."""
    return await render_report(client, tenant=tenant, fmt=fmt)
