"""`make demo`'s cost report files: the fleet's HTML report (tenants and idle, whole-GPU
allocation as the baseline, right-sizing) and the FinOps FOCUS exports, from the run's cost
events. Must not read the bus or print: the demo hands the events in and names the files.
"""

from __future__ import annotations

from pathlib import Path

from seedance.events.cost import CostEntry
from seedance.reports.summary import CostSummary

__all__ = ["fleet_report_html", "write_focus"]


def write_focus(entries: list[CostEntry], out_dir: Path) -> list[Path]:
    """``focus-1.2.csv`` (FOCUS 1.2 CostAndUsage) and ``focus-1.3.csv`` (1.3 split
    allocation) of the run's cost events, each with its ``.metadata.json``; the CSV paths."""
    from seedance.reports import focus_files
    from seedance.reports.from_bus import lines_from_events

    lines = lines_from_events(entries)
    files = focus_files(lines, created_ms=max(ln.window_end_ms for ln in lines))
    for name, text in files.items():
        (out_dir / name).write_text(text, encoding="utf-8")
    return [out_dir / name for name in files if name.endswith(".csv")]


def fleet_report_html(
    entries: list[CostEntry], whole_by_tenant: dict[str, int]
) -> tuple[str, CostSummary]:
    """The demo's report from the run's cost events (tenants' entries and the idle lines of
    ``seedance.ledger.idle.*``), with whole-GPU allocation as the baseline and right-sizing,
    and the fleet's figures it shows (its total is the fleet's cost: allocated + idle)."""
    from seedance.cost_ledger.core import BookRightsizer, default_price_book
    from seedance.reports import Baseline, ReportInput, job_uses, render_html
    from seedance.reports.from_bus import lines_from_events
    from seedance.reports.summary import summarize

    lines = lines_from_events(entries)
    sizer = BookRightsizer(default_price_book())  # the demo's ledger runs the bundled book
    html = render_html(
        ReportInput(
            title="Seedance demo: cost per tenant, and idle",
            entries=lines,
            generated_at_ms=max(ln.window_end_ms for ln in lines),
            baseline=Baseline(
                policy_name="whole-GPU allocation", cost_usd_micro_by_tenant=whole_by_tenant
            ),
            rightsizing=sizer.recommend_all(job_uses(lines)),
            rightsizing_rule=sizer.rule,
        )
    )
    return html, summarize(lines)
