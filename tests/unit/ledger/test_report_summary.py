"""Report figures: windows, groupings, idle by node and GPU model, shared idle (issue 17).

The fleet's total of every report (any grouping, shared idle or not) equals the ledger's cost
of the fleet, allocated + idle, to the micro-dollar; an empty window is an error, not a report
dated 1970.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from seedance.cost_ledger.core import CostLine, Ledger, LedgerConfig, default_price_book
from seedance.cost_ledger.core.mapping import to_bus
from seedance.events import decode, encode
from seedance.reports import ReportInput, render_html
from seedance.reports.from_bus import lines_from_events, render_lines
from seedance.reports.idle import share_idle
from seedance.reports.summary import (
    GROUPS,
    IDLE_KEY,
    EmptyReport,
    ReportWindow,
    parse_instant,
    summarize,
)

from .fleet import DAY0_MS, HOUR_MS, fleet_day


@pytest.fixture(scope="module")
def day() -> tuple[list[CostLine], Ledger]:
    events, end_ms = fleet_day()
    led = Ledger(default_price_book(), LedgerConfig(window_s=1800, lateness_s=0))
    led.apply_many(events)
    out = led.advance(end_ms)
    return [o for o in out if isinstance(o, CostLine)], led


@pytest.mark.parametrize("by", GROUPS)
@pytest.mark.parametrize("share", [False, True])
def test_every_fleet_report_totals_the_fleets_cost(day, by, share):
    entries, ledger = day
    t = ledger.totals()
    s = summarize(entries, by=by, share=share)
    assert s.total_usd_micro == t.total.total_usd_micro
    assert sum(r.total_usd_micro for r in s.rows) == t.total.total_usd_micro
    assert s.idle.total_usd_micro == t.idle.total_usd_micro > 0
    assert s.allocated.total_usd_micro == t.total.total_usd_micro - t.idle.total_usd_micro


def test_idle_by_node_and_gpu_model_match_the_ledger(day):
    entries, ledger = day
    s = summarize(entries)
    t = ledger.totals()
    assert {r.key: r.idle_usd_micro for r in s.idle_by_node} == {
        n: a.total_usd_micro for n, a in t.idle_by_node.items()
    }
    by_model: dict[str, int] = defaultdict(int)
    for r in s.idle_by_node:
        by_model[r.gpu_model] += r.idle_usd_micro
    assert {r.key: r.idle_usd_micro for r in s.idle_by_gpu_model} == by_model
    # the fleet names its GPUs by the short names (H100, A100, T4, G2): lines carry the
    # canonical models they are billed as
    assert {r.key for r in s.idle_by_gpu_model} == {
        "H100-SXM5-80GB", "A100-SXM4-80GB", "T4-PCIE-16GB", "G2",
    }  # fmt: skip
    for r in s.idle_by_node:
        assert 0 < r.idle_pct < 100
    # without sharing, tenant rows are allocated cost only and idle is its own last row
    assert s.rows[-1].key == IDLE_KEY
    assert s.rows[-1].idle_usd_micro == t.idle.total_usd_micro
    assert {r.key: r.total_usd_micro for r in s.rows[:-1]} == {
        k: a.total_usd_micro for k, a in t.by_tenant.items()
    }


def test_shared_idle_goes_to_the_jobs_on_the_same_node_and_window(day):
    entries, ledger = day
    shares, unshared = share_idle(entries)
    s = summarize(entries, by="tenant", share=True)
    expected: dict[str, int] = defaultdict(int)
    for sh in shares:
        expected[sh.tenant] += sh.idle_usd_micro
    assert {r.key: r.idle_usd_micro for r in s.rows if r.key != IDLE_KEY} == expected
    assert s.idle_unshared_usd_micro == unshared
    assert sum(expected.values()) + unshared == ledger.totals().idle.total_usd_micro
    # the shares of each tenant add up to its jobs' shares
    jobs = summarize(entries, by="job", share=True)
    per_tenant: dict[str, int] = defaultdict(int)
    for r in jobs.rows:
        if r.key != IDLE_KEY:
            per_tenant[r.tenant] += r.idle_usd_micro
    assert per_tenant == expected


def test_a_tenants_report_has_no_idle_unless_shared(day):
    entries, ledger = day
    t = ledger.totals()
    own = summarize(entries, tenant="search")
    assert own.total_usd_micro == t.by_tenant["search"].total_usd_micro
    assert not own.idle_included
    assert own.idle_by_node == []
    assert [r.key for r in own.rows] == ["search"]
    shares, _ = share_idle(entries)
    share = sum(s.idle_usd_micro for s in shares if s.tenant == "search")
    shared = summarize(entries, tenant="search", share=True)
    assert shared.idle_included
    assert shared.total_usd_micro == t.by_tenant["search"].total_usd_micro + share
    by_node = summarize(entries, tenant="search", by="node", share=True)
    assert sum(r.total_usd_micro for r in by_node.rows) == shared.total_usd_micro


def test_a_window_takes_the_lines_whose_charge_period_starts_in_it(day):
    entries, _ = day
    w = ReportWindow(start_ms=DAY0_MS + 6 * HOUR_MS, end_ms=DAY0_MS + 12 * HOUR_MS)
    s = summarize(entries, window=w)
    inside = [e for e in entries if w.start_ms <= e.window_start_ms < w.end_ms]
    assert s.lines == len(inside)
    assert s.total_usd_micro == sum(e.amounts.total_usd_micro for e in inside)
    assert s.covered_start_ms == w.start_ms
    assert s.covered_end_ms == w.end_ms
    # the two halves of the day add up to the day
    am = summarize(entries, window=ReportWindow(end_ms=DAY0_MS + 12 * HOUR_MS))
    pm = summarize(entries, window=ReportWindow(start_ms=DAY0_MS + 12 * HOUR_MS))
    assert am.total_usd_micro + pm.total_usd_micro == summarize(entries).total_usd_micro


def test_an_empty_window_says_so(day):
    entries, _ = day
    w = ReportWindow.parse("2030-01-01", "2030-01-02T00:00:00Z")
    with pytest.raises(EmptyReport, match="no cost in 2030-01-01 00:00 UTC – 2030-01-02 00:00"):
        summarize(entries, window=w)
    with pytest.raises(EmptyReport, match="no cost for tenant 'nobody' in the whole stream"):
        summarize(entries, tenant="nobody")
    with pytest.raises(EmptyReport, match="no cost in the whole stream"):
        render_html(ReportInput(title="x", entries=[], generated_at_ms=0))
    with pytest.raises(EmptyReport):
        render_lines([], fmt="text", tenant=None, window=ReportWindow(), by="tenant",
                     share=False, generated_at_ms=0)  # fmt: skip


def test_times_are_iso_8601_in_utc():
    assert parse_instant("2026-01-01", "--from") == DAY0_MS
    assert parse_instant("2026-01-01T00:00:00Z", "--from") == DAY0_MS
    assert parse_instant("2026-01-01T01:00:00+01:00", "--from") == DAY0_MS
    with pytest.raises(ValueError, match=r"--to = 'yesterday' is not an ISO 8601 time"):
        parse_instant("yesterday", "--to")
    with pytest.raises(ValueError, match="--from must be before --to"):
        ReportWindow.parse("2026-01-02", "2026-01-01")
    with pytest.raises(ValueError, match="--by 'team'"):
        summarize([], by="team")  # type: ignore[arg-type]


def test_the_fleet_report_of_the_ledgers_bus_events_totals_the_fleets_cost(day):
    """A replay's outputs, through the bus encoding, give a report whose total is the fleet's."""
    entries, ledger = day
    wire = [decode(encode(to_bus(e).event)) for e in entries]
    lines = lines_from_events(wire)
    total = ledger.totals().total.total_usd_micro
    text, n = render_lines(lines, fmt="text", tenant=None, window=ReportWindow(), by="node",
                           share=False, generated_at_ms=DAY0_MS)  # fmt: skip
    assert n == len(entries)
    assert f"total ${total / 1e6:,.2f} = " in text
    html, _ = render_lines(lines, fmt="html", tenant=None, window=ReportWindow(), by="tenant",
                           share=False, generated_at_ms=DAY0_MS)  # fmt: skip
    idle = ledger.totals().idle.total_usd_micro
    assert f'<div class="v">${total / 1e6:,.2f}</div>' in html
    assert f"${(total - idle) / 1e6:,.2f} allocated + ${idle / 1e6:,.2f} idle" in html


def test_the_html_report_has_jobs_window_and_idle_by_node(day):
    entries, _ = day
    w = ReportWindow.parse("2026-01-01T06:00Z", "2026-01-01T12:00Z")
    html = render_html(ReportInput(title="t", entries=entries, generated_at_ms=DAY0_MS, window=w))
    assert "Covers 2026-01-01 06:00 UTC – 2026-01-01 12:00 UTC" in html
    assert "window asked: 2026-01-01 06:00 UTC – 2026-01-01 12:00 UTC" in html
    assert "1970" not in html
    assert '<table class="jobs">' in html
    assert '<table class="idle-nodes">' in html
    assert '<table class="idle-models">' in html
    jobs = summarize(entries, by="job", window=w)
    assert html.count("<tr><td>job-") == len([r for r in jobs.rows if r.key != IDLE_KEY])
    # more jobs than rows: the rest summed in one line
    few = render_html(ReportInput(title="t", entries=entries, generated_at_ms=0, max_job_rows=3))
    assert few.count("<tr><td>job-") == 3
    assert "more jobs costing" in few


def test_a_tenants_html_report_says_why_it_shows_no_idle(day):
    entries, _ = day
    html = render_html(ReportInput(title="t", entries=entries, generated_at_ms=0, tenant="search"))
    assert "Not shown: idle is capacity no tenant held" in html
    assert 'aria-label="Idle cost by node"' not in html
    assert ">not included<" in html
    for other in ("ads-ranking", "llm-serving", "research"):
        assert other not in html
    shared = render_html(
        ReportInput(title="t", entries=entries, generated_at_ms=0, tenant="search", share_idle=True)
    )
    assert "<th>Idle share</th>" in shared


def test_panels_without_data_say_why(day):
    entries, _ = day
    # no activity measured and no idle: the $/TFLOP-h and idle panels say why, draw nothing
    bare = [
        CostLine(**{**_fields(e), "activity_ppm": None,
                     "amounts": type(e.amounts)(cost_usd_micro=e.amounts.cost_usd_micro,
                                                gpu_hours_micro=e.amounts.gpu_hours_micro)})
        for e in entries
        if e.kind == "usage"
    ]  # fmt: skip
    html = render_html(ReportInput(title="t", entries=bare, generated_at_ms=0))
    assert "No idle: every GPU-hour in this window was held by a job." in html
    assert "Not shown: no line in this window has a measured GPU activity" in html
    assert html.count("<svg") == 2  # cost over time and utilisation only


def _fields(e: CostLine) -> dict:
    return {f: getattr(e, f) for f in e.__struct_fields__}


def test_the_demos_report_shows_idle_and_totals_the_fleets_cost(day):
    """``make demo``'s report (seedance.bench.demo_report) of replayed costs, idle included."""
    from seedance.bench.demo_report import fleet_report_html

    entries, ledger = day
    wire = [decode(encode(to_bus(e).event)) for e in entries]
    t = ledger.totals()
    total, idle = t.total.total_usd_micro, t.idle.total_usd_micro
    html, fleet = fleet_report_html(wire, {k: a.total_usd_micro for k, a in t.by_tenant.items()})
    assert fleet.total_usd_micro == total
    assert fleet.idle.total_usd_micro == idle > 0
    assert f'Total GPU cost</div><div class="v">${total / 1e6:,.2f}</div>' in html
    assert f"${(total - idle) / 1e6:,.2f} allocated + ${idle / 1e6:,.2f} idle" in html
    assert f'<div class="v">{100 * idle / total:.1f} %</div>' in html  # the idle share, not 0.0
