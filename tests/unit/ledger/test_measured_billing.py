"""Shared GPUs billed by the node agent's measured per-pod shares (``[sharing] billing``).

X costs $2 per GPU-hour on demand (tests/unit/ledger/conftest.py); a 5-minute window of one
whole X is 1/12 h = $0.166667.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from seedance.cost_ledger.core import (
    GpuAllocation,
    GpuSample,
    JobEnded,
    Ledger,
    LedgerConfig,
    LedgerInput,
    NodeInfo,
    PriceBook,
    PriceBookError,
    parse_price_book,
    recompute,
)
from seedance.cost_ledger.core.facts import PodShareReading
from seedance.cost_ledger.core.lines import CostLine, JobCost
from seedance.cost_ledger.core.mapping import facts_of, to_bus
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.telemetry import PodShare, PodShares
from tests.unit.ledger.conftest import BOOK_TOML

W = 300_000
MEASURED = parse_price_book(BOOK_TOML + '\n[sharing]\nbilling = "measured"\n')


def _events(*, readings: Sequence[dict[str, float]], whole: bool = False) -> list[LedgerInput]:
    """Jobs a and b share GPU 0 of node n (half each) for window 0; ``readings`` are the node
    agent's per-window shares (job -> SM share); ``whole``: a third job holds GPU 1 whole."""
    out: list[LedgerInput] = [
        NodeInfo(event_id="inv", node="n", gpu_model="X", gpu_count=2, at_ms=0),
        *(
            GpuAllocation(
                event_id=f"p:{j}",
                job_id=f"acme/{j}",
                tenant="acme",
                node="n",
                gpu_model="X",
                gpu_indices=(0,),
                start_ms=0,
                kind="shared",
                gpu_milli=500,
            )
            for j in ("a", "b")
        ),
        GpuSample(event_id="s0", node="n", gpu_index=0, at_ms=1_000, activity=0.7),
    ]
    if whole:
        out.append(
            GpuAllocation(
                event_id="p:c",
                job_id="acme/c",
                tenant="acme",
                node="n",
                gpu_model="X",
                gpu_indices=(1,),
                start_ms=0,
            )
        )
    for i, shares in enumerate(readings):
        out.append(
            PodShareReading(
                event_id=f"ps{i}",
                node="n",
                at_ms=1_000 + i * 1_000,
                shares=tuple((0, f"acme/{j}", round(v * 1e6)) for j, v in sorted(shares.items())),
            )
        )
    out += [JobEnded(event_id=f"e:{j}", job_id=f"acme/{j}", end_ms=W) for j in ("a", "b", "c")]
    return out


def _run(book: PriceBook, events: Sequence[LedgerInput]) -> tuple[list[CostLine], list[JobCost]]:
    """The lines of window 0 (the jobs' one) and the job reports."""
    led = Ledger(book, LedgerConfig())
    led.apply_many(events)
    out = led.advance(3 * W)
    lines = [o for o in out if isinstance(o, CostLine) and o.window_start_ms == 0]
    return lines, [o for o in out if isinstance(o, JobCost)]


def test_sharers_pay_their_measured_share_and_the_allocation_bill_stands_beside_it() -> None:
    lines, reports = _run(MEASURED, _events(readings=[{"a": 0.6, "b": 0.1}] * 10))
    cost = {o.job_id or "idle": o.amounts.cost_usd_micro for o in lines}
    alloc = {o.job_id or "idle": o.amounts.allocation_cost_usd_micro for o in lines}
    # 60 % and 10 % of a $2 GPU-hour for 1/12 h; the 30 % nobody used (and GPU 1) is idle.
    assert cost == {"acme/a": 100_000, "acme/b": 16_667, "idle": 50_000 + 166_667}
    # By allocation both hold half the GPU: $2 x 1/2 x 1/12 h each.
    assert alloc["acme/a"] == alloc["acme/b"] == 83_333
    by_job = {r.job_id: r for r in reports}
    assert by_job["acme/a"].amounts.cost_usd_micro == 100_000
    assert by_job["acme/a"].amounts.allocation_cost_usd_micro == 83_333
    wire = to_bus(by_job["acme/b"]).event
    assert isinstance(wire, JobCostReport)
    assert (wire.cost_micro_usd, wire.allocation_cost_micro_usd) == (16_667, 83_333)
    entry = to_bus(next(o for o in lines if o.job_id == "acme/a")).event
    assert isinstance(entry, CostEntry)
    assert (entry.cost_micro_usd, entry.allocation_cost_micro_usd) == (100_000, 83_333)


def test_a_window_without_a_pods_share_counts_as_no_use() -> None:
    # a ran in 5 of the node's 10 readings at 60 %: 30 % of the window.
    readings = [{"a": 0.6, "b": 0.1}] * 5 + [{"b": 0.1}] * 5
    lines, _ = _run(MEASURED, _events(readings=readings))
    cost = {o.job_id: o.amounts.cost_usd_micro for o in lines if o.kind == "usage"}
    assert cost["acme/a"] == 50_000


def test_whole_gpus_and_unmeasured_windows_are_billed_by_allocation_in_either_mode() -> None:
    lines, _ = _run(MEASURED, _events(readings=[], whole=True))  # no reading of the node
    cost = {o.job_id: o.amounts.cost_usd_micro for o in lines if o.kind == "usage"}
    alloc = {o.job_id: o.amounts.allocation_cost_usd_micro for o in lines if o.kind == "usage"}
    assert cost == alloc == {"acme/a": 83_333, "acme/b": 83_333, "acme/c": 166_667}
    book = parse_price_book(BOOK_TOML)  # the default: allocation
    lines, reports = _run(book, _events(readings=[{"a": 0.6, "b": 0.1}] * 10, whole=True))
    cost = {o.job_id: o.amounts.cost_usd_micro for o in lines if o.kind == "usage"}
    assert cost == {"acme/a": 83_333, "acme/b": 83_333, "acme/c": 166_667}
    assert all(o.amounts.allocation_cost_usd_micro == 0 for o in lines)
    wire = to_bus(reports[0]).event
    assert isinstance(wire, JobCostReport)
    assert wire.allocation_cost_micro_usd is None


def test_measured_billing_is_exact_in_any_order_with_duplicates_and_restarts() -> None:
    readings = [{"a": 0.3 + 0.01 * i, "b": 0.2} for i in range(12)]
    events = _events(readings=readings, whole=True)
    expected = recompute(events, MEASURED, 3 * W)
    rng = random.Random(5)
    for _ in range(5):
        shuffled = events + rng.sample(events, k=len(events) // 3)
        rng.shuffle(shuffled)
        led = Ledger(MEASURED, LedgerConfig())
        for i, e in enumerate(shuffled):
            led.apply(e)
            if i % 7 == 0:
                led.advance(e.at_ms if hasattr(e, "at_ms") else 0)
                led = Ledger.from_bytes(led.to_bytes(), MEASURED)  # a restart
        led.advance(3 * W)
        assert led.totals() == expected
    assert expected.by_job["acme/a"].allocation_cost_usd_micro == 83_333


def test_the_price_book_option_is_validated() -> None:
    assert parse_price_book(BOOK_TOML).shared_billing == "allocation"
    with pytest.raises(PriceBookError, match=r"sharing\.billing = 'usage'"):
        parse_price_book(BOOK_TOML + '\n[sharing]\nbilling = "usage"\n')


def _wire(event_id: str, start_ms: int, end_ms: int, shares: dict[str, float]) -> LedgerInput:
    """The node agent's ``gpu.pod_share.v1`` for node n's GPU 0 over ``[start_ms, end_ms)``,
    mapped as the replica maps it."""
    event = PodShares(
        id=event_id, at=_utc(end_ms), node="n", window_start=_utc(start_ms),
        shares=[
            PodShare(gpu_index=0, pod_uid=j, tenant="acme", job_id=j, sm_share=v, mem_share=0.0)
            for j, v in sorted(shares.items())
        ],
    )  # fmt: skip
    (reading,), _ = facts_of(event, end_ms, frozenset(), {})
    return reading


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def test_a_window_sent_twice_under_two_ids_is_applied_once_in_any_order() -> None:
    """The node agent's pod-share id is random (docs/security.md, "Nats-Msg-Id"), so one window
    built into two events would be two readings, and the mean over the node's readings
    re-weighted. A node's window is applied once, by (node, window start): the smaller id's,
    so every order, a restart and a late copy of a closed window bill alike. a ran at 60 % in
    4 of 10 windows and at 30 % in the first (the copy under the smaller id says 30 %, the
    other 60 %): 27 % of the window. Counted twice it was 30 % (50,000)."""
    base = _events(readings=[])
    shares = [{"a": 0.6, "b": 0.1}] * 5 + [{"b": 0.1}] * 5
    readings = [_wire(f"ps{i}", i * 20_000, (i + 1) * 20_000, s) for i, s in enumerate(shares)]
    again = _wire("ps-0", 0, 19_000, {"a": 0.3, "b": 0.1})  # "ps-0" < "ps0"
    for events in ([*base, *readings, again], [*base, again, *readings]):
        lines, _ = _run(MEASURED, events)
        cost = {o.job_id: o.amounts.cost_usd_micro for o in lines if o.kind == "usage"}
        assert cost["acme/a"] == 45_000
        assert recompute(events, MEASURED, 3 * W).by_job["acme/a"].cost_usd_micro == 45_000
    # The copy comes after the window was billed, and after a restart: one adjustment.
    led = Ledger(MEASURED, LedgerConfig())
    led.apply_many([*base, *readings])
    first = led.advance(3 * W)
    led = Ledger.from_bytes(led.to_bytes(), MEASURED)
    assert led.apply(again)
    led = Ledger.from_bytes(led.to_bytes(), MEASURED)
    assert not led.apply(readings[0])  # the one it replaced, delivered again: changes nothing
    later = led.advance(3 * W)
    assert [o.amounts.cost_usd_micro for o in first if isinstance(o, CostLine)
            and o.job_id == "acme/a"] == [50_000]  # fmt: skip
    assert led.totals() == recompute([*base, *readings, again], MEASURED, 3 * W)
    assert any(isinstance(o, CostLine) and o.revision > 0 for o in later)
