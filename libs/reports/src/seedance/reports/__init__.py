"""Seedance's cost reports: CSV, FOCUS 1.2 and 1.3 split-allocation exports, the HTML report and
the grouped text table, rendered from the cost entries a stream holds.

A library: pure rendering from ``seedance.events`` cost events, no bus, no clock, no service.
The SDK's ``seedance costs report``, the ledger's ``report`` and the tools render through it.
"""

from seedance.reports.focus import (
    FOCUS_COLUMNS,
    FOCUS_SPLIT_COLUMNS,
    FocusContext,
    FocusError,
    focus_csv,
    focus_files,
    focus_metadata,
    focus_rows,
    focus_split_csv,
    focus_split_rows,
)
from seedance.reports.from_bus import (
    FORMATS,
    IdleNeedsOperator,
    render_lines,
    summary_text,
)
from seedance.reports.html import Baseline, ReportInput, render_html
from seedance.reports.lines import LineAmounts, ReportLine, lines_from_events
from seedance.reports.summary import (
    GROUPS,
    CostSummary,
    EmptyReport,
    ReportWindow,
    summarize,
)
from seedance.reports.tabular import entries_csv

__all__ = [
    "FOCUS_COLUMNS",
    "FOCUS_SPLIT_COLUMNS",
    "FORMATS",
    "GROUPS",
    "Baseline",
    "CostSummary",
    "EmptyReport",
    "FocusContext",
    "FocusError",
    "IdleNeedsOperator",
    "LineAmounts",
    "ReportInput",
    "ReportLine",
    "ReportWindow",
    "entries_csv",
    "focus_csv",
    "focus_files",
    "focus_metadata",
    "focus_rows",
    "focus_split_csv",
    "focus_split_rows",
    "lines_from_events",
    "render_html",
    "render_lines",
    "summarize",
    "summary_text",
]
