"""Reports of the cost ledger: CSV, FOCUS 1.2 and 1.3 split-allocation exports, the HTML report."""

from seedance.cost_ledger.reports.focus import (
    FOCUS_COLUMNS,
    FOCUS_SPLIT_COLUMNS,
    FocusContext,
    FocusError,
    focus_csv,
    focus_metadata,
    focus_rows,
    focus_split_csv,
    focus_split_rows,
)
from seedance.cost_ledger.reports.html import Baseline, ReportInput, render_html
from seedance.cost_ledger.reports.tabular import entries_csv

__all__ = [
    "FOCUS_COLUMNS",
    "FOCUS_SPLIT_COLUMNS",
    "Baseline",
    "FocusContext",
    "FocusError",
    "ReportInput",
    "entries_csv",
    "focus_csv",
    "focus_metadata",
    "focus_rows",
    "focus_split_csv",
    "focus_split_rows",
    "render_html",
]
