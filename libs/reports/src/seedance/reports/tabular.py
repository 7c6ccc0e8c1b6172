"""The audit CSV of cost entries, and the FOCUS exports' old import path.

Owns the raw entry log (every revision, with its source event ids, for audit and
reconciliation). Must not compute costs: it only formats what the ledger emitted. The FOCUS
exports live in ``reports.focus``; their names are re-exported here for existing callers.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal

from seedance.reports.focus import FOCUS_COLUMNS, FocusContext, focus_csv, focus_rows
from seedance.reports.lines import ReportLine, usd_from_micro

__all__ = [
    "ENTRY_CSV_COLUMNS",
    "FOCUS_COLUMNS",
    "FocusContext",
    "entries_csv",
    "focus_csv",
    "focus_rows",
]

ENTRY_CSV_COLUMNS = (
    "entry_id", "kind", "revision", "tenant", "job_id", "node", "gpu_model", "pricing_tier",
    "window_start", "window_end", "gpu_hours", "cost_usd", "energy_usd", "total_usd",
    "list_cost_usd", "energy_mj", "tflop_hours", "activity", "assumptions", "source_event_ids",
)  # fmt: skip


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _dec(micro: int) -> str:
    return str(usd_from_micro(micro))


def entries_csv(entries: Iterable[ReportLine]) -> str:
    """Every entry as emitted (adjustments included), for audit and reconciliation."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(ENTRY_CSV_COLUMNS)
    for e in entries:
        a = e.amounts
        w.writerow(
            [
                e.entry_id, e.kind, e.revision, e.tenant, e.job_id, e.node, e.gpu_model,
                e.pricing_tier, _iso(e.window_start_ms), _iso(e.window_end_ms),
                _dec(a.gpu_hours_micro), _dec(a.cost_usd_micro), _dec(a.energy_usd_micro),
                _dec(a.total_usd_micro), _dec(a.list_cost_usd_micro), a.energy_mj,
                _dec(a.tflop_hours_micro),
                "" if e.activity_ppm is None else str(Decimal(e.activity_ppm).scaleb(-6)),
                " ".join(e.assumptions), " ".join(e.source_event_ids),
            ]
        )  # fmt: skip
    return buf.getvalue()
