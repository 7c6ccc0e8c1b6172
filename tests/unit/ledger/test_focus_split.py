"""FOCUS 1.3 split cost allocation: every invariant, on MIG, shared-GPU and idle lines.

The origin charge is one node's GPU cost in one window. Invariants checked (FOCUS 1.3,
AllocatedMethodDetails / AllocatedResourceId and the split-cost-allocation handling):
- per origin charge the AllocatedRatio values sum to exactly 1;
- per origin charge the allocated costs (Billed, Effective, Contracted, List) sum to the
  origin's cost to the micro-dollar, and the origin's cost is what the node's GPUs cost;
- each ratio is the line's share of the origin's cost, to the 1e-12 the ratio is written in;
- allocated rows name what the cost goes to (AllocatedResourceId/Name, AllocatedTags); the one
  unallocated row of an origin (its idle) has AllocatedResourceId, Name and Tags null;
- every split row says its method (AllocatedMethodId) and its details object (Elements with
  AllocatedRatio, UsageUnit beside UsageQuantity); rows that are no split have all five null.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction

import pytest

from seedance.cost_ledger.core import (
    CostLine,
    GpuAllocation,
    GpuSample,
    JobEnded,
    Ledger,
    LedgerConfig,
    NodeInfo,
    default_price_book,
)
from seedance.reports import focus_split_csv
from seedance.reports.focus import FOCUS_1_3_ALLOCATION_COLUMNS

from .fleet import fleet_day
from .focus_rules import parse, violations

HOUR_MS = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _entries(book, events, end_ms) -> list[CostLine]:
    led = Ledger(book, LedgerConfig(window_s=3600, lateness_s=0))
    led.apply_many(events)
    return [o for o in led.advance(end_ms) if isinstance(o, CostLine)]


def _one_node_hour(book) -> list[CostLine]:
    """Node n1 (2 x X at $2/GPU-hour, on demand) for one hour: a MIG slice on GPU 0, two shared
    jobs (50 % and 25 %) on GPU 1, the rest idle."""
    jobs = [
        ("mig-a", "acme", "mig", (0,), {"mig_profile": "3g.40gb"}),
        ("share-b", "acme", "shared", (1,), {"gpu_milli": 500}),
        ("share-c", "globex", "shared", (1,), {"gpu_milli": 250}),
    ]
    events: list = [
        NodeInfo(event_id="node:n1", node="n1", gpu_model="X", gpu_count=2, at_ms=T0,
                 pricing_tier="on_demand"),
    ]  # fmt: skip
    for job, tenant, kind, gpus, extra in jobs:
        events.append(
            GpuAllocation(event_id=f"p:{job}", job_id=job, tenant=tenant, node="n1", gpu_model="X",
                      gpu_indices=gpus, start_ms=T0, kind=kind, **extra)
        )  # fmt: skip
        events.append(JobEnded(event_id=f"e:{job}", job_id=job, end_ms=T0 + HOUR_MS))
    return _entries(book, events, T0 + 2 * HOUR_MS)


def _origins(rows):
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["AllocatedMethodId"] is not None:
            by[(r["ResourceId"], r["ChargePeriodStart"])].append(r)
    return by


def _ratio(r) -> Decimal:
    # Parsed as Decimal so the sum is exact (a float would hide an off-by-1e-12).
    details = json.loads(r["AllocatedMethodDetails"], parse_float=Decimal, parse_int=Decimal)
    (element,) = details["Elements"]
    return element["AllocatedRatio"]


def check_invariants(entries: list[CostLine]) -> dict[tuple[str, str], list[dict]]:
    rows, columns = parse(focus_split_csv(entries))
    assert violations(rows, columns) == {}  # the split rows obey every FOCUS 1.2 rule too
    origin_cost: dict[tuple[str, int], int] = defaultdict(int)
    origin_list: dict[tuple[str, int], int] = defaultdict(int)
    for e in entries:
        origin_cost[(e.node, e.window_start_ms)] += e.amounts.cost_usd_micro
        origin_list[(e.node, e.window_start_ms)] += e.amounts.list_cost_usd_micro
    origins = _origins(rows)
    assert origins
    for (resource, start), members in origins.items():
        node = resource.removeprefix("seedance:node/")
        key = next(k for k in origin_cost if k[0] == node and _iso(k[1]) == start)
        _check_origin(members, origin_cost[key], origin_list[key])
    for r in rows:
        if r["AllocatedMethodId"] is None:  # energy: each job's own charge, not a split
            assert all(r[c] is None for c in FOCUS_1_3_ALLOCATION_COLUMNS)
            assert r["PricingUnit"] == "kWh"
    return origins


def _check_origin(members: list[dict], cost_micro: int, list_micro: int) -> None:
    """One origin charge's split rows: ratios add to 1, costs to the charge, rows well formed."""
    # ratios: exactly 1, each the line's share of the origin's cost within 1e-12
    assert sum(_ratio(r) for r in members) == 1
    total = sum(Decimal(r["BilledCost"]) for r in members)
    assert total == Decimal(cost_micro).scaleb(-6)  # to the micro-dollar
    for col in ("EffectiveCost", "ContractedCost", "PricingCurrencyEffectiveCost"):
        assert sum(Decimal(r[col]) for r in members) == total
    assert sum(Decimal(r["ListCost"]) for r in members) == Decimal(list_micro).scaleb(-6)
    for r in members:
        share = Fraction(Decimal(r["BilledCost"])) / Fraction(total) if total else None
        if share is not None:
            assert abs(Fraction(_ratio(r)) - share) < Fraction(1, 10**12)
        assert 0 <= _ratio(r) <= 1
        details = json.loads(r["AllocatedMethodDetails"])
        assert all("UsageUnit" in el for el in details["Elements"] if "UsageQuantity" in el)
        assert r["AllocatedMethodId"] == "seedance.gpu-time-share.v1"
    assert len([r for r in members if r["AllocatedResourceId"] is None]) <= 1
    for r in members:
        _check_allocated_row(r)


def _check_allocated_row(r: dict) -> None:
    """A usage row names its job; the one unallocated (idle) row names nothing."""
    if r["AllocatedResourceId"] is None:
        assert r["x_LineKind"] == "idle"
        assert r["AllocatedResourceName"] is None
        assert r["AllocatedTags"] is None
        return
    assert r["x_LineKind"] == "usage"
    assert r["AllocatedResourceId"] == f"{r['SubAccountId']}/{r['x_JobId']}"
    assert r["AllocatedResourceName"] == r["x_JobId"]
    assert json.loads(r["AllocatedTags"])["seedance:job"] == r["x_JobId"]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_mig_shared_and_idle_split_one_node_hour_exactly(book):
    entries = _one_node_hour(book)
    origins = check_invariants(entries)
    members = origins[("seedance:node/n1", "2026-01-01T00:00:00Z")]  # the hour the jobs ran
    assert sum(Decimal(r["BilledCost"]) for r in members) == Decimal("4")  # 2 GPUs x $2 x 1 h
    by = {r["AllocatedResourceId"]: r for r in members}
    assert set(by) == {"acme/mig-a", "acme/share-b", "globex/share-c", None}
    # shared: billed by their share of GPU 1 (OpenCost #3828: never as whole GPUs)
    assert Decimal(by["acme/share-b"]["BilledCost"]) == Decimal("1")
    assert Decimal(by["globex/share-c"]["BilledCost"]) == Decimal("0.5")
    # the MIG slice is a fraction of GPU 0, and idle is what no job used: never zero here
    mig = Decimal(by["acme/mig-a"]["BilledCost"])
    assert 0 < mig < 2
    assert Decimal(by[None]["BilledCost"]) == 4 - mig - Decimal("1.5")
    assert _ratio(by["acme/share-b"]) == Decimal("0.25")
    assert _ratio(by["globex/share-c"]) == Decimal("0.125")


def test_a_node_wholly_idle_is_one_unallocated_row_with_ratio_1(book):
    events = [
        NodeInfo(event_id="node:n2", node="n2", gpu_model="X", gpu_count=1, at_ms=T0,
                 pricing_tier="on_demand"),
        GpuSample(event_id="s:1", node="n2", gpu_index=0, at_ms=T0 + 60_000, activity=0.0),
    ]  # fmt: skip
    entries = _entries(book, events, T0 + 2 * HOUR_MS)
    origins = check_invariants(entries)
    for members in origins.values():
        (row,) = members
        assert row["AllocatedResourceId"] is None
        assert _ratio(row) == 1


@pytest.mark.parametrize("seed", [3, 11])
def test_a_fleet_day_of_whole_shared_and_mig_jobs_splits_exactly(seed):
    events, end_ms = fleet_day(seed=seed, hours=24)
    entries = _entries(default_price_book(), events, end_ms)
    origins = check_invariants(entries)
    kinds = {r["x_LineKind"] for members in origins.values() for r in members}
    assert kinds == {"usage", "idle"}
    assert any(r["AllocatedResourceId"] is None for m in origins.values() for r in m)


def test_ratios_that_do_not_terminate_still_sum_to_exactly_1(book):
    # Three equal shares: 1/3 does not terminate; apportioning in 1e-12 steps keeps the sum 1.
    jobs = [f"j{i}" for i in range(3)]
    events: list = [
        NodeInfo(event_id="node:n3", node="n3", gpu_model="X", gpu_count=3, at_ms=T0,
                 pricing_tier="on_demand"),
    ]  # fmt: skip
    for i, job in enumerate(jobs):
        events += [
            GpuAllocation(event_id=f"p:{job}", job_id=job, tenant="acme", node="n3", gpu_model="X",
                      gpu_indices=(i,), start_ms=T0, kind="whole"),
            JobEnded(event_id=f"e:{job}", job_id=job, end_ms=T0 + HOUR_MS),
        ]  # fmt: skip
    entries = _entries(book, events, T0 + 2 * HOUR_MS)
    origins = check_invariants(entries)
    members = origins[("seedance:node/n3", "2026-01-01T00:00:00Z")]
    ratios = sorted(_ratio(r) for r in members)
    assert ratios == [Decimal("0.333333333333"), Decimal("0.333333333333"),
                      Decimal("0.333333333334")]  # fmt: skip


def test_split_rows_are_csv_with_the_allocation_columns_before_the_custom_ones(book):
    header = next(csv.reader(io.StringIO(focus_split_csv(_one_node_hour(book)))))
    first_custom = next(i for i, c in enumerate(header) if c.startswith("x_"))
    assert set(FOCUS_1_3_ALLOCATION_COLUMNS) <= set(header[:first_custom])
