"""The HTML cost report: one self-contained file a person opens in a browser.

Owns the aggregation of cost entries into what a reader wants to see (cost over time by tenant,
utilisation, idle, $ per TFLOP-hour, savings against a baseline placement policy) and its
rendering as a single HTML file with inline CSS and inline SVG: no script, no font, no CDN, so
it opens offline and can be mailed. Must not compute costs: it reads the ledger's entries, and
the baseline's figures come from the caller (a replay of the same jobs under another policy).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from html import escape

import msgspec

from seedance.reports import svg
from seedance.reports.lines import ReportLine, usd_from_micro
from seedance.reports.rightsizing import Recommendation, rightsizing_html
from seedance.reports.summary import IDLE_KEY, CostSummary, ReportWindow, summarize

__all__ = ["Baseline", "ReportInput", "render_html"]


class Baseline(msgspec.Struct, frozen=True, kw_only=True):
    """What the same work cost under another placement policy (supplied by the caller)."""

    policy_name: str
    cost_usd_micro_by_tenant: dict[str, int]
    gpu_hours_micro: int | None = None


class ReportInput(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the report shows. ``generated_at_ms`` is passed in: the core has no clock.

    ``entries`` are the lines the reader could see (the fleet's, idle included, or one
    tenant's); ``tenant`` narrows the report to one tenant, ``window`` to a time window, and
    ``share_idle`` charges idle to the jobs that ran beside it (rules: ``reports.summary``).
    """

    title: str
    entries: Sequence[ReportLine]
    generated_at_ms: int
    assumptions: Sequence[str] = ()
    baseline: Baseline | None = None
    share_idle: bool = False
    max_buckets: int = 48
    window: ReportWindow | None = None
    tenant: str | None = None
    #: Rows of the per-job table; the rest are summed in one line under it.
    max_job_rows: int = 100
    #: Right-sizing recommendations for the jobs in the window and the rule that chose them
    #: (None: not computed, no section).
    rightsizing: Sequence[Recommendation] | None = None
    rightsizing_rule: str = ""


_CSS = """
:root{--ink:#1f2329;--muted:#5f6670;--line:#e6e8eb;--bg:#f6f7f9;--card:#fff;--accent:#4e79a7}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);
 font:15px/1.5 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif}
header{background:#1f2a3a;color:#fff;padding:28px 40px}
header h1{margin:0;font-size:24px;font-weight:600}
header p{margin:4px 0 0;color:#c3cad5;font-size:13px}
main{max-width:1200px;margin:0 auto;padding:24px 40px 48px}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(200px,1fr));gap:16px}
.tile{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:16px 18px}
.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.tile .v{font-size:26px;font-weight:600;margin-top:2px}
.tile .s{color:var(--muted);font-size:12px}
.good{color:#2f7d32}.bad{color:#b3261e}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;
 padding:18px 22px;margin-top:20px}
section h2{margin:0 0 2px;font-size:17px;font-weight:600}
section p.sub{margin:0 0 12px;color:var(--muted);font-size:13px}
.row{display:grid;grid-template-columns:1fr 1fr;gap:20px}
.row section{margin-top:20px}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{padding:6px 10px;border-bottom:1px solid var(--line);text-align:right}
th:first-child,td:first-child{text-align:left}
th{color:var(--muted);font-weight:600;font-size:12px;text-transform:uppercase}
ul.assume{margin:6px 0 0;padding-left:18px;color:var(--muted);font-size:13px}
@media(max-width:900px){.row{grid-template-columns:1fr}main{padding:16px}}
"""


def _iso_minute(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _bucket_label(ms: int, span_ms: int) -> str:
    t = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return t.strftime("%H:%M") if span_ms <= 86_400_000 else t.strftime("%m-%d %H:%M")


def _usd(micro: int) -> str:
    return f"${usd_from_micro(micro).quantize(Decimal('0.01')):,}"


def render_html(data: ReportInput) -> str:
    """The report as one HTML document (UTF-8 text).

    Raises:
        EmptyReport: no cost line in the window (an empty report would have nothing to show).
    """
    window = data.window or ReportWindow()
    by_job = summarize(
        data.entries, by="job", window=window, tenant=data.tenant, share=data.share_idle
    )
    fleet = data.tenant is None
    entries = [
        e
        for e in data.entries
        if window.holds(e) and (fleet or (e.kind == "usage" and e.tenant == data.tenant))
    ]
    tenants = sorted({e.tenant for e in entries if e.kind == "usage"})
    colours = {t: svg.PALETTE[i % len(svg.PALETTE)] for i, t in enumerate(tenants)}

    t0, t1 = by_job.covered_start_ms, by_job.covered_end_ms
    window_ms = min((e.window_end_ms - e.window_start_ms for e in entries), default=3_600_000)
    n_windows = max(1, (t1 - t0) // window_ms)
    per_bucket = max(1, -(-n_windows // data.max_buckets))
    bucket_ms = per_bucket * window_ms
    n_buckets = max(1, -(-(t1 - t0) // bucket_ms))
    labels = [_bucket_label(t0 + i * bucket_ms, t1 - t0) for i in range(n_buckets)]

    sums = _Buckets(tenants, n_buckets)
    for e in entries:
        sums.add(e, (e.window_start_ms - t0) // bucket_ms)
    cost, idle_cost, alloc_h, idle_h = sums.cost, sums.idle_cost, sums.alloc_h, sums.idle_h
    act_weighted, act_hours = sums.act_weighted, sums.act_hours
    by_tenant, assumed_models = sums.by_tenant, sums.assumed_models

    total_alloc = sum(r[0] for r in by_tenant.values())
    total_idle = by_job.idle.total_usd_micro
    total = by_job.total_usd_micro
    gpu_h = sum(alloc_h) + sum(idle_h)
    alloc_pct = 100 * sum(alloc_h) / gpu_h if gpu_h else 0.0
    activity_pct = 100 * sum(act_weighted) / sum(act_hours) / 1e6 if sum(act_hours) else None
    tflop_total = sum(r[2] for r in by_tenant.values())
    fleet_tflop = f"${total_alloc / tflop_total:.4f}" if tflop_total else "n/a"

    # ---------------------------------------------------------------- charts
    series = [(t, colours[t], [v / 1e6 for v in cost[t]]) for t in tenants]
    if fleet:
        series.append(("idle", svg.IDLE_COLOUR, [v / 1e6 for v in idle_cost]))
    cost_chart = svg.stacked_bars(
        labels,
        series,
        label="Cost over time by tenant, with idle" if fleet else "Cost over time",
    )

    alloc_series = [
        100 * alloc_h[i] / (alloc_h[i] + idle_h[i]) if alloc_h[i] + idle_h[i] else None
        for i in range(n_buckets)
    ]
    act_series = [
        act_weighted[i] / act_hours[i] / 1e4 if act_hours[i] else None for i in range(n_buckets)
    ]
    util_chart = svg.lines(
        labels,
        [
            ("GPU allocation (% of GPU-hours held)", "#4e79a7", alloc_series),
            ("GPU activity (SM / utilisation, GPU-hour weighted)", "#f28e2b", act_series),
        ],
        label="Allocation and activity over time",
        vmax=100,
    )
    idle_html, idle_tables = _idle_section(by_job, data.tenant)
    tflop_html = _tflop_section(by_tenant, colours, assumed_models)

    savings_tile, savings_html = _savings(data.baseline, by_tenant, total_alloc)

    table = _tenant_table(data, by_job, tenants, colours, sums)
    assumptions = list(data.assumptions)
    if assumed_models:
        assumptions.append(
            "* $ / TFLOP-hour of these tenants uses a configured (not published) peak."
        )
    assume_html = (
        "<ul class=assume>" + "".join(f"<li>{escape(a)}</li>" for a in assumptions) + "</ul>"
        if assumptions
        else "<p class=sub>None: every price and peak used has a published source.</p>"
    )
    act_text = f"{activity_pct:.0f} %" if activity_pct is not None else "n/a"
    idle_tile, alloc_tile, cost_sub = _tiles(
        data, total_idle=total_idle, total=total, idle_h=sum(idle_h), alloc_pct=alloc_pct,
        act_text=act_text, gpu_h=gpu_h,
    )  # fmt: skip
    asked = "" if window == ReportWindow() else f" · window asked: {escape(window.label())}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(data.title)}</title><style>{_CSS}</style></head>
<body><header><h1>{escape(data.title)}</h1>
<p class="window">Covers {_iso_minute(t0)} – {_iso_minute(t1)}{asked}
 · generated {_iso_minute(data.generated_at_ms)}
 · {len(tenants)} tenants · {by_job.lines} ledger entries</p></header>
<main>
<div class="tiles">
<div class="tile"><div class="k">Total GPU cost</div><div class="v">{_usd(total)}</div>
<div class="s">{_usd(total_alloc)} allocated + {_usd(total_idle)} idle</div></div>
<div class="tile"><div class="k">{"Idle share" if fleet else "Idle"}</div>{idle_tile}</div>
<div class="tile">{alloc_tile}</div>
<div class="tile"><div class="k">$ per TFLOP-hour</div><div class="v">{fleet_tflop}</div>
<div class="s">allocated cost / delivered TFLOP-hours</div></div>
{savings_tile}
</div>
<section><h2>Cost over time{" by tenant" if fleet else ""}</h2>
<p class="sub">{cost_sub}</p>{cost_chart}</section>
<section><h2>Utilisation</h2><p class="sub">{
        "Share of GPU-hours held by jobs, and how busy the GPUs were"
        if fleet
        else "How busy the tenant's GPUs were"
    } (SM / tensor activity where measured, else utilisation).</p>{util_chart}</section>
<div class="row">
{idle_html}
{tflop_html}
</div>
{idle_tables}
{savings_html}
<section><h2>By tenant</h2>{table}</section>
{_jobs_section(by_job, data.max_job_rows)}
{
        ""
        if data.rightsizing is None
        else rightsizing_html(data.rightsizing, data.rightsizing_rule, data.max_job_rows)
    }
<section><h2>Assumptions</h2><p class="sub">Figures in this report that are configured
rather than published.</p>{assume_html}</section>
</main></body></html>
"""


class _Buckets:
    """Per-bucket and per-tenant sums of the report's lines (integers, exact)."""

    def __init__(self, tenants: list[str], n_buckets: int) -> None:
        self.cost = {t: [0] * n_buckets for t in tenants}
        self.idle_cost = [0] * n_buckets
        self.alloc_h = [0] * n_buckets
        self.idle_h = [0] * n_buckets
        self.act_weighted = [0] * n_buckets
        self.act_hours = [0] * n_buckets
        # $, GPU-h, TFLOP-h, list price
        self.by_tenant: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.assumed_models: set[str] = set()

    def add(self, e: ReportLine, b: int) -> None:
        a = e.amounts
        if e.activity_ppm is not None and a.gpu_hours_micro > 0:
            self.act_weighted[b] += e.activity_ppm * a.gpu_hours_micro
            self.act_hours[b] += a.gpu_hours_micro
        if e.kind == "idle":
            self.idle_cost[b] += a.total_usd_micro
            self.idle_h[b] += a.gpu_hours_micro
            return
        self.cost[e.tenant][b] += a.total_usd_micro
        self.alloc_h[b] += a.gpu_hours_micro
        row = self.by_tenant[e.tenant]
        row[0] += a.total_usd_micro
        row[1] += a.gpu_hours_micro
        row[2] += a.tflop_hours_micro
        row[3] += a.list_cost_usd_micro
        if any(x.startswith("peak:") for x in e.assumptions):
            self.assumed_models.add(e.tenant)


def _tflop_section(
    by_tenant: dict[str, list[int]], colours: dict[str, str], assumed_models: set[str]
) -> str:
    tflop_rows = sorted(
        ((t, r[0] / r[2]) for t, r in by_tenant.items() if r[2] > 0), key=lambda kv: -kv[1]
    )
    if not tflop_rows:
        return (
            '<section><h2>$ per TFLOP-hour</h2><p class="sub">Not shown: no line in this window '
            "has a measured GPU activity and a known peak, so no TFLOP-hours were delivered "
            "that the ledger can count.</p></section>"
        )
    tflop_chart = svg.hbars(
        [(t, v, colours[t]) for t, v in tflop_rows],
        label="Dollars per delivered TFLOP-hour by tenant",
        value_text=[f"${v:.4f}{' *' if t in assumed_models else ''}" for t, v in tflop_rows],
    )
    return (
        '<section><h2>$ per TFLOP-hour</h2><p class="sub">Cost per delivered TFLOP-hour '
        f"(activity × dense FP16 peak × hours). Lower is better.</p>{tflop_chart}</section>"
    )


def _savings(
    base: Baseline | None, by_tenant: dict[str, list[int]], total_alloc: int
) -> tuple[str, str]:
    """The savings tile and section against the caller's baseline (none without one)."""
    if base is None:
        return "", ""
    base_total = sum(base.cost_usd_micro_by_tenant.values())
    saved = base_total - total_alloc
    pct = 100 * saved / base_total if base_total else 0.0
    names = sorted(set(base.cost_usd_micro_by_tenant) | set(by_tenant))
    chart = svg.grouped_bars(
        names,
        [
            (
                f"{base.policy_name} (baseline)",
                "#bab0ac",
                [base.cost_usd_micro_by_tenant.get(t, 0) / 1e6 for t in names],
            ),
            (
                "Seedance",
                "#59a14f",
                [by_tenant[t][0] / 1e6 if t in by_tenant else 0 for t in names],
            ),
        ],
        label="Cost by tenant: baseline policy against Seedance",
    )
    cls = "good" if saved >= 0 else "bad"
    tile = (
        f'<div class="tile"><div class="k">Saved vs {escape(base.policy_name)}</div>'
        f'<div class="v {cls}">{_usd(saved)}</div><div class="s">{pct:.1f} % of the '
        f"baseline's {_usd(base_total)}</div></div>"
    )
    section = (
        f"<section><h2>Savings against {escape(base.policy_name)}</h2>"
        '<p class="sub">Allocated cost of the same work under the baseline placement policy '
        f"(supplied by the caller) and under Seedance: {_usd(saved)} saved "
        f"({pct:.1f} %).</p>{chart}</section>"
    )
    return tile, section


def _tenant_table(
    data: ReportInput,
    by_job: CostSummary,
    tenants: list[str],
    colours: dict[str, str],
    sums: _Buckets,
) -> str:
    shared_idle: dict[str, int] = defaultdict(int)
    for r in by_job.rows:
        if r.key != IDLE_KEY:
            shared_idle[r.tenant] += r.idle_usd_micro
    rows = []
    for t in tenants:
        c, h, tf, lst = sums.by_tenant[t]
        per = f"${c / tf:.4f}" if tf else "n/a"
        mark = " *" if t in sums.assumed_models else ""
        idle_col = f"<td>{_usd(shared_idle[t])}</td>" if data.share_idle else ""
        rows.append(
            f'<tr><td><span style="color:{colours[t]}">■</span> {escape(t)}</td>'
            f"<td>{_usd(c)}</td>{idle_col}<td>{h / 1e6:,.2f}</td><td>{tf / 1e6:,.1f}</td>"
            f"<td>{per}{mark}</td><td>{_usd(lst)}</td></tr>"
        )
    if data.tenant is None and by_job.idle_unshared_usd_micro:
        # The idle no tenant carries closes the table, so its Cost column adds up to the total.
        unshared = by_job.idle_unshared_usd_micro
        idle_col = f"<td>{_usd(0)}</td>" if data.share_idle else ""
        hours = "" if data.share_idle else f"{sum(sums.idle_h) / 1e6:,.2f}"
        rows.append(
            f'<tr class="idle-row"><td><span style="color:{svg.IDLE_COLOUR}">■</span> idle '
            f"(no tenant)</td><td>{_usd(unshared)}</td>{idle_col}<td>{hours}</td><td></td>"
            "<td></td><td></td></tr>"
        )
    idle_head = "<th>Shared idle</th>" if data.share_idle else ""
    return (
        f"<table><thead><tr><th>Tenant</th><th>Cost</th>{idle_head}<th>GPU-hours</th>"
        "<th>TFLOP-hours</th><th>$ / TFLOP-hour</th><th>At list price</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _tiles(
    data: ReportInput,
    *,
    total_idle: int,
    total: int,
    idle_h: int,
    alloc_pct: float,
    act_text: str,
    gpu_h: int,
) -> tuple[str, str, str]:
    """The idle tile, the allocation tile and the cost chart's caption: the fleet's or a
    tenant's."""
    if data.tenant is None:
        idle_tile = (
            f'<div class="v">{100 * total_idle / total if total else 0:.1f} %</div>'
            f'<div class="s">{_usd(total_idle)}, {idle_h / 1e6:,.1f} idle GPU-hours</div>'
        )
        alloc_tile = (
            '<div class="k">Allocation / activity</div>'
            f'<div class="v">{alloc_pct:.0f} % / {act_text}</div>'
            f'<div class="s">of {gpu_h / 1e6:,.1f} GPU-hours</div>'
        )
        cost_sub = (
            "Attributed GPU cost per period, stacked by tenant; grey is capacity nobody held "
            "(idle), kept as its own line."
        )
        return idle_tile, alloc_tile, cost_sub
    idle_tile = (
        f'<div class="v">{_usd(total_idle)}</div><div class="s">its share of the fleet\'s '
        "idle (OpenCost shareIdle, by node and window)</div>"
        if data.share_idle
        else '<div class="v">not included</div><div class="s">idle belongs to the fleet: '
        "a share of it needs operator credentials (--share-idle)</div>"
    )
    alloc_tile = (
        f'<div class="k">GPU activity</div><div class="v">{act_text}</div>'
        f'<div class="s">over {gpu_h / 1e6:,.1f} GPU-hours held</div>'
    )
    cost_sub = "Attributed GPU cost per period" + (
        " (the idle share is in the tables, not in this chart)." if data.share_idle else "."
    )
    return idle_tile, alloc_tile, cost_sub


def _idle_section(summary: CostSummary, tenant: str | None) -> tuple[str, str]:
    """Idle by node: the chart's panel and the tables' (or why there is none to show)."""
    head = "<section><h2>Idle cost by node</h2>"
    if tenant is not None:
        return (
            f'{head}<p class="sub">Not shown: idle is capacity no tenant held, so it is the '
            "fleet's, not this tenant's (the fleet report, with operator credentials, has it "
            "by node and GPU model).</p></section>",
            "",
        )
    if not summary.idle_by_node:
        return (
            f'{head}<p class="sub">No idle: every GPU-hour in this window was held by a job.'
            "</p></section>",
            "",
        )
    top = summary.idle_by_node[:12]
    chart = svg.hbars(
        [(r.key, r.idle_usd_micro / 1e6, svg.IDLE_COLOUR) for r in top],
        label="Idle cost by node",
    )
    rows = "".join(
        f"<tr><td>{escape(r.key)}</td><td>{escape(r.gpu_model)}</td>"
        f"<td>{_usd(r.idle_usd_micro)}</td><td>{r.idle_gpu_hours_micro / 1e6:,.2f}</td>"
        f"<td>{r.idle_pct:.0f} %</td></tr>"
        for r in summary.idle_by_node
    )
    models = "".join(
        f"<tr><td>{escape(r.key)}</td><td>{_usd(r.idle_usd_micro)}</td>"
        f"<td>{r.idle_gpu_hours_micro / 1e6:,.2f}</td><td>{r.idle_pct:.0f} %</td></tr>"
        for r in summary.idle_by_gpu_model
    )
    more = (
        f" (chart: top {len(top)} of {len(summary.idle_by_node)})"
        if len(top) < len(summary.idle_by_node)
        else ""
    )
    chart_html = (
        f'{head}<p class="sub">Cost of GPU time no job held, per node{more}.</p>{chart}</section>'
    )
    tables = (
        '<section><h2>Idle by node and GPU model</h2><p class="sub">Idle % is of the GPU-hours '
        'of the node (or model) in the window.</p><div class="row"><div>'
        '<table class="idle-nodes"><thead><tr><th>Node</th><th>GPU model</th><th>Idle cost</th>'
        f"<th>Idle GPU-hours</th><th>Idle %</th></tr></thead><tbody>{rows}</tbody></table></div>"
        '<div><table class="idle-models"><thead><tr><th>GPU model</th><th>Idle cost</th>'
        f"<th>Idle GPU-hours</th><th>Idle %</th></tr></thead><tbody>{models}</tbody></table>"
        "</div></div></section>"
    )
    return chart_html, tables


def _jobs_section(summary: CostSummary, max_rows: int) -> str:
    """One row per job, costliest first; the rest summed under the table."""
    jobs = [r for r in summary.rows if r.key != IDLE_KEY]
    shown, rest = jobs[:max_rows], jobs[max_rows:]
    idle_head = "<th>Idle share</th>" if summary.idle_shared else ""
    body = []
    for r in shown:
        job = r.key.split("/", 1)[1]
        tf = r.allocated.tflop_hours_micro
        per = f"${r.allocated.total_usd_micro / tf:.4f}" if tf else "n/a"
        idle_col = f"<td>{_usd(r.idle_usd_micro)}</td>" if summary.idle_shared else ""
        body.append(
            f"<tr><td>{escape(job)}</td><td>{escape(r.tenant)}</td>"
            f"<td>{_usd(r.allocated.total_usd_micro)}</td>{idle_col}"
            f"<td>{r.allocated.gpu_hours_micro / 1e6:,.2f}</td><td>{per}</td></tr>"
        )
    tail = ""
    if rest:
        tail = (
            f'<p class="sub">and {len(rest)} more jobs costing '
            f"{_usd(sum(r.total_usd_micro for r in rest))} in all.</p>"
        )
    return (
        '<section><h2>By job</h2><p class="sub">Each job\'s allocated cost in the window, '
        "costliest first.</p>"
        f'<table class="jobs"><thead><tr><th>Job</th><th>Tenant</th><th>Cost</th>{idle_head}'
        f"<th>GPU-hours</th><th>$ / TFLOP-hour</th></tr></thead><tbody>{''.join(body)}</tbody>"
        f"</table>{tail}</section>"
    )
