"""Write a sample cost report from the Alibaba trace: HTML, entry CSV, FOCUS 1.2 and 1.3 CSVs.

Replays the trace through the ledger core twice: once as placed (GPU-sharing pods share a GPU
by their milli share) and once under a baseline policy that gives every pod whole GPUs, which
is what a scheduler without GPU sharing does; the report shows the difference as savings.

The FOCUS files: ``cost-focus.csv`` (FOCUS 1.2 CostAndUsage) and ``cost-focus-split.csv``
(FOCUS 1.3 split cost allocation), each with a ``.metadata.json`` that states its version.

Usage: ledger_sample_report.py DATA_DIR OUT_DIR [--pods N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from seedance.bench.ledger_core import trace_events
from seedance.cost_ledger.core import (
    CostLine,
    GpuAllocation,
    Ledger,
    LedgerConfig,
    default_price_book,
)
from seedance.reports import (
    Baseline,
    LineAmounts,
    ReportInput,
    ReportLine,
    entries_csv,
    focus_files,
    render_html,
)


def run(events, as_of_ms: int) -> tuple[list[ReportLine], Ledger]:
    led = Ledger(default_price_book(), LedgerConfig(window_s=3600, lateness_s=0))
    led.apply_many(events)
    out = [report_line(o) for o in led.advance(as_of_ms) if isinstance(o, CostLine)]
    return out, led


def report_line(line: CostLine) -> ReportLine:
    """The ledger core's line as the reports library reads it (the same fields, exactly): the
    library imports nothing from the ledger, so a replay hands it its own type."""
    fields = msgspec.structs.asdict(line)
    fields["amounts"] = LineAmounts(**msgspec.structs.asdict(line.amounts))
    return ReportLine(**fields)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_dir", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--pods", type=int, default=3000)
    args = ap.parse_args()
    events, as_of = trace_events(args.data_dir, args.pods, samples=6000, seed=7)
    # Only the nodes the pods use: an untouched fleet of 1,213 nodes would drown the picture.
    used = {e.node for e in events if isinstance(e, GpuAllocation)}
    events = [e for e in events if getattr(e, "node", None) in used or not hasattr(e, "node")]
    entries, led = run(events, as_of)
    whole = [
        msgspec.structs.replace(e, kind="whole", gpu_milli=1000)
        if isinstance(e, GpuAllocation)
        else e
        for e in events
    ]
    _, base = run(whole, as_of)
    baseline = Baseline(
        policy_name="whole GPUs, no sharing",
        cost_usd_micro_by_tenant={t: a.total_usd_micro for t, a in base.totals().by_tenant.items()},
    )
    book = default_price_book()
    html = render_html(
        ReportInput(
            title="Seedance GPU cost report: Alibaba trace sample",
            entries=entries,
            generated_at_ms=as_of,
            assumptions=[
                *book.assumptions({e.gpu_model for e in entries}),
                "Trace time compressed 100x; tenants assigned by a hash of the pod name; GPU "
                "activity and energy are synthetic (the trace has none).",
            ],
            baseline=baseline,
        )
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "cost-report.html").write_text(html, encoding="utf-8")
    (args.out_dir / "cost-entries.csv").write_text(entries_csv(entries), encoding="utf-8")
    files = focus_files(entries, created_ms=as_of, names=("cost-focus", "cost-focus-split"))
    for name, text in files.items():
        (args.out_dir / name).write_text(text, encoding="utf-8")
    total = led.totals().total.total_usd_micro / 1e6
    print(f"wrote {args.out_dir}/cost-report.html ({len(entries)} entries, {total:,.2f} USD)")
