"""Reports of the cost ledger: CSV and FOCUS 1.2 exports, the HTML report."""

from seedance.cost_ledger.reports.html import Baseline, ReportInput, render_html
from seedance.cost_ledger.reports.tabular import (
    FOCUS_COLUMNS,
    FocusContext,
    entries_csv,
    focus_csv,
    focus_rows,
)

__all__ = [
    "FOCUS_COLUMNS",
    "Baseline",
    "FocusContext",
    "ReportInput",
    "entries_csv",
    "focus_csv",
    "focus_rows",
    "render_html",
]
