"""Rebuild the core's cost lines from the cost events on the bus, for reports.

A ``cost.entry.v1`` carries the exact parts of its line (micro-dollars, GPU-hours, energy), so the
CSV, FOCUS and HTML reports of any reader of a cost stream equal the ledger's own to the cent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from seedance.cost_ledger.core.ledger import Amounts
from seedance.cost_ledger.core.ledger import CostEntry as LedgerLine
from seedance.cost_ledger.core.windows import epoch_ms
from seedance.events.cost import CostEntry, CostKind

__all__ = ["FORMATS", "lines_from_events", "render_tenant_report"]

#: What ``render_tenant_report`` writes: the entry CSV, FOCUS 1.2 CSV, or the HTML report.
FORMATS = ("html", "csv", "focus")


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


async def render_tenant_report(client: Any, tenant: str, fmt: str) -> tuple[str, int]:
    """A tenant's report in ``fmt`` from what its cost stream holds, and the lines it covers.

    ``client`` is a connected ``seedance.sdk.SeedanceClient`` (with the tenant's own credentials
    it reads only that tenant's stream). The ``seedance costs report`` command finds this
    function through the ``seedance.cli`` entry point, so the SDK never imports the ledger.
    """
    from datetime import UTC, datetime

    from seedance.cost_ledger.reports import entries_csv, focus_csv, render_html
    from seedance.cost_ledger.reports.html import ReportInput

    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: choose one of {', '.join(FORMATS)}")
    lines = lines_from_events(await client.cost_history(tenant))
    if fmt == "csv":
        return entries_csv(lines), len(lines)
    if fmt == "focus":
        return focus_csv(lines), len(lines)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    title = f"Seedance costs: {tenant}"
    return render_html(ReportInput(title=title, entries=lines, generated_at_ms=now_ms)), len(lines)
