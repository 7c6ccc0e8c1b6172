"""FOCUS conformance of the ledger's exports: every rule of focus_rules.RULES, on real exports.

The exports checked: the one ``make report-ledger-sample`` writes (the Alibaba trace through
the ledger core, by the same tool in a temporary folder) and a demo-like fleet day (whole,
shared and MIG jobs on reserved, on-demand, spot and on-prem nodes, with idle and energy).
Both formats: the FOCUS 1.2 export and the FOCUS 1.3 split-allocation export (whose 1.2
columns obey the same rules). A broken copy of an export proves the rules can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pytest

from seedance.cost_ledger.core import CostLine, Ledger, LedgerConfig, default_price_book
from seedance.reports import (
    FOCUS_COLUMNS,
    FOCUS_SPLIT_COLUMNS,
    FocusContext,
    FocusError,
    focus_csv,
    focus_metadata,
    focus_split_csv,
)
from seedance.reports.focus import FOCUS_1_2_COLUMNS
from seedance.testing.paths import data_dir

from .fleet import fleet_day
from .focus_rules import RULES, Row, parse, violations

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def demo_entries() -> list[CostLine]:
    events, end_ms = fleet_day(seed=11, hours=30)  # crosses no month; 30 h of windows
    led = Ledger(default_price_book(), LedgerConfig(window_s=3600, lateness_s=0))
    led.apply_many(events)
    return [o for o in led.advance(end_ms) if isinstance(o, CostLine)]


@pytest.fixture(scope="module")
def sample_dir(tmp_path_factory) -> Path:
    data = data_dir()
    if not (data / "alibaba-gpu-v2023").exists():
        pytest.skip(f"shared data not present at {data} (set SEEDANCE_DATA_DIR)")
    out = tmp_path_factory.mktemp("ledger-sample")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "bench" / "ledger_sample_report.py"),
            str(data),
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


@pytest.fixture(scope="module", params=["sample-1.2", "sample-1.3", "demo-1.2", "demo-1.3"])
def export(request, sample_dir_or_none, demo_entries) -> tuple[list[Row], tuple[str, ...]]:
    source, version = request.param.split("-")
    if source == "sample":
        if sample_dir_or_none is None:
            pytest.skip("shared data not present (set SEEDANCE_DATA_DIR)")
        name = "cost-focus.csv" if version == "1.2" else "cost-focus-split.csv"
        return parse((sample_dir_or_none / name).read_text(encoding="utf-8"))
    text = focus_csv(demo_entries) if version == "1.2" else focus_split_csv(demo_entries)
    return parse(text)


@pytest.fixture(scope="module")
def sample_dir_or_none(request) -> Path | None:
    try:
        return request.getfixturevalue("sample_dir")
    except pytest.skip.Exception:
        return None


def test_every_rule_holds_on_the_exports(export):
    rows, columns = export
    assert rows, "an export with no rows proves nothing"
    assert violations(rows, columns) == {}


def test_the_rule_table_covers_every_column_and_names_each_rule_once_per_text():
    columns_with_rules = {c for c in FOCUS_1_2_COLUMNS if any(c in r.rule_id for r in RULES)}
    assert columns_with_rules == set(FOCUS_1_2_COLUMNS)
    keys = [(r.rule_id, r.text) for r in RULES]
    assert len(keys) == len(set(keys))
    assert all(r.rule_id.split("-")[-1] in {"M", "C", "O"} or r.rule_id.startswith("Seedance-")
               for r in RULES)  # fmt: skip


@pytest.mark.parametrize(
    ("column", "value", "rule"),
    [
        ("BilledCost", "1,000.00", "BilledCost-C-001-M"),
        ("BilledCost", "+1", "BilledCost-C-001-M"),
        ("ChargeCategory", "Usage-Based", "ChargeCategory-C-003-M"),
        ("ChargeClass", "Refund", "ChargeClass-C-005-C"),
        ("ChargePeriodEnd", "2026-01-01 01:00:00", "ChargePeriodEnd-C-002-M"),
        ("ChargePeriodEnd", "2025-12-31T23:00:00Z", "ChargePeriodStart-C-004-M"),
        ("BillingCurrency", "usd", "CurrencyFormat-A-001-C"),
        ("PricingCurrency", "XYZ", "CurrencyFormat-A-001-C"),
        ("ServiceSubcategory", "Virtual Machines", "ServiceSubcategory-C-004-M"),
        ("Tags", '{"seedance:job": {"a": 1}}', "KeyValueFormat-A-004-M"),
        ("Tags", '{"job": "j"}', "Tags-C-012-M"),
        ("ListCost", "123456", "ListCost-C-009-C"),
        ("EffectiveCost", "0.5", "Seedance-EffectiveCostIsBilledCost"),
        ("SubAccountName", None, "SubAccountName-C-005-C"),
        ("ResourceName", "seedance:node/h100-a", "ResourceName-C-006-C"),
        ("CommitmentDiscountId", "cd-1", "CommitmentDiscountId-C-004-C"),
        ("PricingCategory", "Committed", "PricingCategory-C-009-C"),
        ("InvoiceIssuerName", "Not Applicable", "NullHandling-A-002-M"),
        ("SkuPriceDetails", '{"Tier": "spot"}', "SkuPriceDetails-C-017-C"),
    ],
)
def test_a_broken_row_fails_the_rule_that_names_it(demo_entries, column, value, rule):
    rows, columns = parse(focus_csv(demo_entries))
    i = next(i for i, r in enumerate(rows) if r["x_LineKind"] == "usage" and r["x_JobId"])
    rows[i] = {**rows[i], column: value}
    assert any(k.startswith(f"{rule}:") for k in violations(rows, columns)), rule


def test_a_missing_column_fails_its_presence_rule(demo_entries):
    rows, columns = parse(focus_csv(demo_entries))
    columns = tuple(c for c in columns if c != "ServiceSubcategory")
    assert any(k.startswith("CostAndUsage-D-042-O:") for k in violations(rows, columns))


def test_custom_columns_come_after_focus_columns_and_carry_the_prefix():
    assert FOCUS_COLUMNS[: len(FOCUS_1_2_COLUMNS)] == FOCUS_1_2_COLUMNS
    assert len(FOCUS_1_2_COLUMNS) == 57
    assert all(c.startswith("x_") for c in FOCUS_COLUMNS[len(FOCUS_1_2_COLUMNS) :])


def test_each_file_says_which_version_it_claims(demo_entries, sample_dir_or_none):
    rows12, _ = parse(focus_csv(demo_entries))
    rows13, cols13 = parse(focus_split_csv(demo_entries))
    assert {r["x_FocusVersion"] for r in rows12} == {"1.2"}
    assert {r["x_FocusVersion"] for r in rows13} == {"1.3"}
    assert "AllocatedResourceId" in cols13
    meta = focus_metadata("1.2", FOCUS_COLUMNS, created_ms=0)
    assert meta["Schema"][0]["FocusVersion"] == "1.2"
    assert [c["ColumnName"] for c in meta["Schema"][0]["ColumnDefinition"]] == list(FOCUS_COLUMNS)
    with pytest.raises(FocusError, match=r"1\.4"):
        focus_metadata("1.4", FOCUS_COLUMNS, created_ms=0)
    if sample_dir_or_none is not None:
        for name, version, columns in (
            ("cost-focus", "1.2", FOCUS_COLUMNS),
            ("cost-focus-split", "1.3", FOCUS_SPLIT_COLUMNS),
        ):
            meta = json.loads((sample_dir_or_none / f"{name}.metadata.json").read_text())
            schema = meta["Schema"][0]
            assert schema["FocusVersion"] == version
            assert len(schema["ColumnDefinition"]) == len(columns)


def test_money_is_exact_and_billed_cost_per_invoice_is_the_ledgers_total(demo_entries):
    rows, _ = parse(focus_csv(demo_entries))
    by_invoice: dict[str, Decimal] = defaultdict(Decimal)
    for r in rows:
        assert "E" not in r["BilledCost"]
        assert "e" not in r["BilledCost"]
        assert len(r["BilledCost"].partition(".")[2]) <= 6  # micro-dollars, rendered exactly
        by_invoice[r["InvoiceId"]] += Decimal(r["BilledCost"])
    total_micro = sum(e.amounts.total_usd_micro for e in demo_entries)
    assert list(by_invoice) == ["seedance-2026-01"]
    assert by_invoice["seedance-2026-01"] == Decimal(total_micro).scaleb(-6)


def test_a_bad_context_is_refused_with_the_field_named():
    with pytest.raises(FocusError, match="currency"):
        FocusContext(currency="dollars")
    with pytest.raises(FocusError, match="region"):
        FocusContext(region_id="eu-west-1")
