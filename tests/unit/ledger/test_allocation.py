"""The allocation API's answers (pure): scopes, idle, windows and refusals naming the parameter.

The lines are a fleet day's as the ledger publishes them (``cost.entry`` events rebuilt into
report lines); every fleet answer with idle totals the ledger's cost of the fleet, allocated +
idle, to the micro-dollar, and a tenant's answer holds only its own rows.
"""

from __future__ import annotations

import msgspec
import pytest

from seedance.cost_ledger.core import CostLine, Ledger, LedgerConfig, default_price_book
from seedance.cost_ledger.core.mapping import to_bus
from seedance.events.allocation import AllocationAnswer, AllocationQuery, AllocationRefusal
from seedance.reports.allocation import allocation
from seedance.reports.idle import share_idle
from seedance.reports.lines import ReportLine, lines_from_events
from seedance.reports.summary import GROUPS, IDLE_KEY

from .fleet import DAY0_MS, HOUR_MS, fleet_day


@pytest.fixture(scope="module")
def day() -> tuple[list[ReportLine], Ledger]:
    events, end_ms = fleet_day(hours=12)
    led = Ledger(default_price_book(), LedgerConfig(window_s=1800, lateness_s=0))
    led.apply_many(events)
    out = [o for o in led.advance(end_ms) if isinstance(o, CostLine)]
    return lines_from_events(to_bus(o).event for o in out), led


def ask(lines: list[ReportLine], tenant: str | None = None, **q: object) -> AllocationAnswer:
    reply = allocation(lines, AllocationQuery(**{"window": "7d", **q}), tenant=tenant, as_of_seq=9)  # type: ignore[arg-type]
    assert isinstance(reply, AllocationAnswer), reply
    return reply


def refused(lines: list[ReportLine], tenant: str | None = None, **q: object) -> AllocationRefusal:
    reply = allocation(lines, AllocationQuery(**q), tenant=tenant, as_of_seq=9)  # type: ignore[arg-type]
    assert isinstance(reply, AllocationRefusal), reply
    return reply


@pytest.mark.parametrize("aggregate", GROUPS)
@pytest.mark.parametrize("share", [False, True])
def test_the_fleets_allocation_with_idle_totals_the_fleets_cost(day, aggregate, share):
    lines, ledger = day
    t = ledger.totals()
    a = ask(lines, aggregate=aggregate, include_idle=True, share_idle=share)
    assert a.scope == "fleet"
    assert a.as_of_seq == 9
    assert a.totals.total_usd_micro == t.total.total_usd_micro
    assert sum(r.total_usd_micro for r in a.allocations) == t.total.total_usd_micro
    assert a.totals.idle_usd_micro == t.idle.total_usd_micro > 0
    assert {i.node: i.idle_usd_micro for i in a.idle_by_node} == {
        n: x.total_usd_micro for n, x in t.idle_by_node.items()
    }
    if aggregate in ("tenant", "job"):
        # unshared, idle is the __idle__ row; shared, only what no job ran beside stays there
        idle_row = [r for r in a.allocations if r.name == IDLE_KEY]
        left = a.idle_unshared_usd_micro
        assert sum(r.total_usd_micro for r in idle_row) == left
        assert (left == t.idle.total_usd_micro) is (not share)


def test_without_idle_the_fleet_gets_its_allocated_cost_only(day):
    lines, ledger = day
    t = ledger.totals()
    a = ask(lines)
    assert a.totals.total_usd_micro == t.total.total_usd_micro - t.idle.total_usd_micro
    assert {r.name: r.total_usd_micro for r in a.allocations} == {
        k: v.total_usd_micro for k, v in t.by_tenant.items()
    }
    assert not a.idle_by_node
    assert a.totals.idle_usd_micro == 0


@pytest.mark.parametrize("aggregate", GROUPS)
def test_a_tenant_sees_only_its_own_rows_and_its_share_of_idle(day, aggregate):
    lines, ledger = day
    own = ledger.totals().by_tenant["search"].total_usd_micro
    share = sum(s.idle_usd_micro for s in share_idle(lines)[0] if s.tenant == "search")
    plain = ask(lines, "search", aggregate=aggregate)
    assert plain.scope == "search"
    assert plain.totals.total_usd_micro == own
    assert plain.totals.idle_usd_micro == 0
    shared = ask(lines, "search", aggregate=aggregate, share_idle=True)
    assert shared.totals.total_usd_micro == own + share
    assert share > 0
    for a in (plain, shared):
        assert not a.idle_by_node
        assert a.idle_unshared_usd_micro == 0
        assert IDLE_KEY not in {r.name for r in a.allocations}
        text = msgspec.json.encode(a).decode()
        for other in ("ads-ranking", "llm-serving", "research"):
            assert other not in text


def test_a_tenant_asking_for_the_fleets_idle_is_refused_naming_include_idle(day):
    lines, _ = day
    r = refused(lines, "search", window="7d", include_idle=True)
    assert r.parameter == "include_idle"
    assert "share_idle" in r.message


@pytest.mark.parametrize(
    ("query", "parameter", "words"),
    [
        ({"window": "7d", "aggregate": "namespace"}, "aggregate", "tenant, job, node, gpu_model"),
        ({"window": "7 days"}, "window", "7d, 24h, 90m"),
        ({"window": "0d"}, "window", "not a window"),
        ({"window": "2026-01-01T00:00:00Z"}, "window", "start,end"),
        ({"window": "2026-01-02T00:00:00Z,2026-01-01T00:00:00Z"}, "window", "before its end"),
        ({"window": "yesterday,today"}, "window", "not an ISO 8601 time"),
        # once resolved to the year -711: the answer crashed, and nobody got a reply
        ({"window": "999999d"}, "window", "more than 36525 days"),
        ({"window": "999999h"}, "window", "more than 36525 days"),
        ({"window": "36526d"}, "window", "more than 36525 days"),
        ({"window": "0001-01-01T00:00:00+01:00,0001-01-02T00:00:00Z"}, "window", "outside"),
        ({"window": "9999-12-31T00:00:00Z,9999-12-31T23:59:59-01:00"}, "window", "outside"),
        ({"window": "1969-12-31T00:00:00Z,1970-01-02T00:00:00Z"}, "window", "outside"),
        ({"window": "2000-01-01T00:00:00Z,2200-01-01T00:00:00Z"}, "window", "a century"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(day, query, parameter, words):
    r = refused(day[0], **query)
    assert r.parameter == parameter
    assert words in r.message


@pytest.mark.parametrize(
    "window", ["\x7f" * 400_001, "7d," * 140_000, "1" * 101], ids=["del-400k", "7d-x140k", "101"]
)
def test_a_long_window_is_refused_without_repeating_it(day, window):
    # A refusal once repeated the window twice: a 400 KB one made an 800 KB reply, and past the
    # server's payload limit there was no reply at all (the asker timed out).
    r = refused(day[0], window=window)
    assert r.parameter == "window"
    assert f"is {len(window)} characters, over 100" in r.message
    assert len(r.message) < 400  # a few hundred characters, whatever the window


def test_windows_relative_to_the_newest_charge_period_and_absolute(day):
    lines, _ = day
    newest = max(e.window_end_ms for e in lines)
    last2h = ask(lines, window="2h", include_idle=True)
    assert (last2h.window_start_ms, last2h.window_end_ms) == (newest - 2 * HOUR_MS, newest)
    inside = [e for e in lines if e.window_start_ms >= newest - 2 * HOUR_MS]
    assert last2h.totals.total_usd_micro == sum(e.amounts.total_usd_micro for e in inside)
    assert last2h.lines == len(inside)
    first = ask(lines, window="2026-01-01T00:00:00Z,2026-01-01T03:00:00Z", include_idle=True)
    assert first.window_start_ms == DAY0_MS
    assert first.window_end_ms == DAY0_MS + 3 * HOUR_MS
    head = [e for e in lines if e.window_start_ms < DAY0_MS + 3 * HOUR_MS]
    assert first.totals.total_usd_micro == sum(e.amounts.total_usd_micro for e in head)
    assert first.window == "2026-01-01T00:00:00Z,2026-01-01T03:00:00Z"


def test_an_empty_window_is_an_answer_with_no_rows(day):
    a = ask(day[0], window="2030-01-01T00:00:00Z,2030-01-02T00:00:00Z", include_idle=True)
    assert a.allocations == []
    assert a.lines == 0
    assert a.totals.total_usd_micro == 0
    none_yet = ask([], window="7d")
    assert none_yet.allocations == []
    assert none_yet.window == "the whole stream"


def test_a_relative_window_longer_than_the_history_starts_at_the_epoch(day):
    lines, _ = day
    newest = max(e.window_end_ms for e in lines)
    everything = ask(lines, window="36525d", include_idle=True)
    assert (everything.window_start_ms, everything.window_end_ms) == (0, newest)
    assert everything.window.startswith("1970-01-01T00:00:00Z,")
    assert everything.lines == len(lines)
