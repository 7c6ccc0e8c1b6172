"""The FOCUS 1.2 CostAndUsage conformance rules, as data: one row per rule the spec states.

Each row is ``Rule(rule_id, text, check)``. ``rule_id`` is the spec's conformance rule id as
the FinOps Foundation numbers it (``<Column>-C-<nnn>-<M|C|O>`` for a column's rules,
``<Attribute>-A-...`` for the format attributes, ``CostAndUsage-D-...`` for a column's
presence in the dataset; M = mandatory, C = conditional, O = optional). ``text`` says the rule
in short. ``check(rows, columns)`` returns the violations (empty = conforming); ``rows`` are
the CSV rows with ``None`` for null (an empty CSV field).

Rules whose subject Seedance does not have (commitment discounts, capacity reservations,
corrections, taxes, purchases, regions, availability zones) are checked in the form that
applies to it: the column is present and null, or the condition never holds. Rules marked
``Seedance-`` are not numbered by the spec: they are relations the spec's definitions imply
for a dataset without commitment discounts, stated so a test can hold them.

What no row here can check (they need knowledge outside the file): that identifiers are unique
within the provider and stable across billing periods, that the BillingCurrency is the
invoice's, that PricingUnit matches a published price list, that Tags hold every finalized
tag. docs/cost-ledger.md lists them.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation

from seedance.reports.focus import FOCUS_1_2_COLUMNS, FOCUS_1_2_SPEC

Row = dict[str, str | None]
Check = Callable[[list[Row], tuple[str, ...]], list[str]]

# ISO 4217 active alphabetic codes (national currencies plus the fund / precious-metal codes).
_ISO_4217_CODES = """
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BOV BRL BSD
BTN BWP BYN BZD CAD CDF CHE CHF CHW CLF CLP CNY COP COU CRC CUC CUP CVE CZK DJF DKK DOP
DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR
IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD
MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB
PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SLL SOS SRD
SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS
VED VES VND VUV WST XAF XAG XAU XBA XBB XBC XBD XCD XCG XDR XOF XPD XPF XPT XSU XUA YER
ZAR ZMW ZWG ZWL
"""
ISO_4217 = frozenset(_ISO_4217_CODES.split())

CHARGE_CATEGORIES = ("Usage", "Purchase", "Tax", "Credit", "Adjustment")
CHARGE_FREQUENCIES = ("One-Time", "Recurring", "Usage-Based")
PRICING_CATEGORIES = ("Standard", "Committed", "Dynamic", "Other")
SERVICE_SUBCATEGORIES: dict[str, tuple[str, ...]] = {
    "AI and Machine Learning": ("AI Platforms", "Bots", "Generative AI", "Machine Learning",
                                "Natural Language Processing", "Other (AI and Machine Learning)"),
    "Analytics": ("Analytics Platforms", "Business Intelligence", "Data Processing", "Search",
                  "Streaming Analytics", "Other (Analytics)"),
    "Business Applications": ("Productivity and Collaboration", "Other (Business Applications)"),
    "Compute": ("Containers", "End User Computing", "Quantum Compute", "Serverless Compute",
                "Virtual Machines", "Other (Compute)"),
    "Databases": ("Caching", "Data Warehouses", "Ledger Databases", "NoSQL Databases",
                  "Relational Databases", "Time Series Databases", "Other (Databases)"),
    "Developer Tools": ("Developer Platforms", "Continuous Integration and Deployment",
                        "Development Environments", "Source Code Management",
                        "Quality Assurance", "Other (Developer Tools)"),
    "Identity": ("Identity and Access Management", "Other (Identity)"),
    "Integration": ("API Management", "Messaging", "Workflow Orchestration",
                    "Other (Integration)"),
    "Internet of Things": ("IoT Analytics", "IoT Platforms", "Other (Internet of Things)"),
    "Management and Governance": ("Architecture", "Compliance", "Cost Management",
                                  "Data Governance", "Disaster Recovery", "Endpoint Management",
                                  "Observability", "Support",
                                  "Other (Management and Governance)"),
    "Media": ("Content Creation", "Gaming", "Media Streaming", "Mixed Reality", "Other (Media)"),
    "Migration": ("Data Migration", "Resource Migration", "Other (Migration)"),
    "Mobile": ("Other (Mobile)",),
    "Multicloud": ("Multicloud Integration", "Other (Multicloud)"),
    "Networking": ("Application Networking", "Content Delivery", "Network Connectivity",
                   "Network Infrastructure", "Network Routing", "Network Security",
                   "Other (Networking)"),
    "Security": ("Secret Management", "Security Posture Management",
                 "Threat Detection and Response", "Other (Security)"),
    "Storage": ("Backup Storage", "Block Storage", "File Storage", "Object Storage",
                "Storage Platforms", "Other (Storage)"),
    "Web": ("Application Platforms", "Other (Web)"),
    "Other": ("Other (Other)",),
}  # fmt: skip
SERVICE_CATEGORIES = tuple(SERVICE_SUBCATEGORIES)

# NumericFormat: an integer, a decimal or E notation; a sign only for negatives (and only in
# the exponent when n < 0); no thousands separators, symbols or units.
_NUMERIC = re.compile(r"-?(\d+(\.\d+)?|\.\d+)(E-?\d+)?")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
_PASCAL = re.compile(r"[A-Z][a-zA-Z0-9]*")
_PLACEHOLDERS = {"n/a", "na", "not applicable", "null", "none", "-", "nan"}
_LIMIT = 5  # violations reported per rule


@dataclass(frozen=True)
class Rule:
    rule_id: str
    text: str
    check: Check


def _rows_where(col: str, bad: Callable[[Row], bool], why: str) -> Check:
    def check(rows: list[Row], columns: tuple[str, ...]) -> list[str]:
        if col not in columns:
            return [f"column {col} is missing"]
        out = []
        for i, r in enumerate(rows):
            if bad(r):
                out.append(f"row {i}: {col}={r.get(col)!r} {why}")
                if len(out) >= _LIMIT:
                    break
        return out

    return check


# -- the checks the table is built from --------------------------------------------------------


def present(col: str) -> Check:
    return lambda rows, columns: [] if col in columns else [f"column {col} is missing"]


def not_null(col: str) -> Check:
    return _rows_where(col, lambda r: r[col] is None, "is null")


def null(col: str) -> Check:
    return _rows_where(col, lambda r: r[col] is not None, "is not null")


def null_when(col: str, cond: Callable[[Row], bool], what: str) -> Check:
    return _rows_where(col, lambda r: cond(r) and r[col] is not None, f"is not null when {what}")


def not_null_when(col: str, cond: Callable[[Row], bool], what: str) -> Check:
    return _rows_where(col, lambda r: cond(r) and r[col] is None, f"is null when {what}")


def string(col: str) -> Check:
    # StringHandling: valid Unicode (a str that encodes), no blank-only text in a value.
    def bad(r: Row) -> bool:
        v = r[col]
        if v is None:
            return False
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return not v.strip()

    return _rows_where(col, bad, "is not a non-blank Unicode string")


def _dec(v: str | None) -> Decimal | None:
    if v is None or not _NUMERIC.fullmatch(v):
        return None
    try:
        return Decimal(v)
    except InvalidOperation:
        return None


def decimal(col: str) -> Check:
    return _rows_where(col, lambda r: r[col] is not None and _dec(r[col]) is None,
                       "is not in NumericFormat")  # fmt: skip


def non_negative(col: str) -> Check:
    def bad(r: Row) -> bool:
        d = _dec(r[col])
        return r[col] is not None and (d is None or d < 0)

    return _rows_where(col, bad, "is negative")


def datetime_format(col: str) -> Check:
    def bad(r: Row) -> bool:
        v = r[col]
        if v is None:
            return False
        if not _DATETIME.fullmatch(v):
            return True
        try:
            datetime.strptime(v + "+0000", "%Y-%m-%dT%H:%M:%SZ%z")
        except ValueError:
            return True
        return False

    return _rows_where(col, bad, "is not YYYY-MM-DDTHH:mm:ssZ (UTC)")


def allowed(col: str, values: Iterable[str]) -> Check:
    ok = frozenset(values)
    return _rows_where(col, lambda r: r[col] is not None and r[col] not in ok,
                       "is not an allowed value")  # fmt: skip


def currency(col: str) -> Check:
    return _rows_where(col, lambda r: r[col] is not None and r[col] not in ISO_4217,
                       "is not an ISO 4217 code")  # fmt: skip


def null_iff(col: str, other: str) -> tuple[Check, Check]:
    """(null when ``other`` is null, not null when ``other`` is not null)."""
    return (
        null_when(col, lambda r: r[other] is None, f"{other} is null"),
        not_null_when(col, lambda r: r[other] is not None, f"{other} is not null"),
    )


def _key_value(v: str, scalar_only: bool = True) -> str | None:
    pairs: list[tuple[str, object]] = []
    try:
        obj = json.loads(v, object_pairs_hook=lambda p: pairs.extend(p) or dict(p))
    except ValueError:
        return "is not JSON"
    if not isinstance(obj, dict):
        return "is not a JSON object"
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        return "repeats a key"
    if scalar_only and any(isinstance(x, dict | list) for x in obj.values()):
        return "has an object or array value"
    return None


def key_value(col: str) -> Check:
    return _rows_where(col, lambda r: r[col] is not None and _key_value(r[col]) is not None,
                       "is not a flat JSON object with unique keys")  # fmt: skip


def keys_match(col: str, pattern: str, what: str) -> Check:
    rx = re.compile(pattern)
    return _rows_where(
        col,
        lambda r: r[col] is not None and any(not rx.fullmatch(k) for k in json.loads(r[col])),
        f"has a key that is not {what}",
    )


def product(unit: str, qty: str, cost: str) -> Check:
    # "MUST match": exact up to the precision the unit price is written in (15 places), i.e.
    # |unit x qty - cost| <= qty x 1e-15; Seedance's own bound is qty x 5e-16.
    def bad(r: Row) -> bool:
        u, q, c = _dec(r[unit]), _dec(r[qty]), _dec(r[cost])
        if None in (u, q, c) or r["ChargeClass"] == "Correction":
            return False
        assert u is not None
        assert q is not None
        assert c is not None
        return abs(u * q - c) > abs(q) * Decimal("1e-15")

    return _rows_where(cost, bad, f"!= {unit} x {qty}")


def equal(a: str, b: str, when: Callable[[Row], bool] = lambda r: True) -> Check:
    return _rows_where(a, lambda r: when(r) and r[a] != r[b], f"differs from {b}")


def _lt(x: str | None, y: str | None) -> bool:
    return x is not None and y is not None and x < y  # ISO 8601 UTC text sorts as time does


def before(a: str, b: str) -> Check:
    return _rows_where(a, lambda r: not _lt(r[a], r[b]), f"is not before {b}")


def _inside_billing_period(r: Row) -> bool:
    return not _lt(r["ChargePeriodStart"], r["BillingPeriodStart"]) and not _lt(
        r["BillingPeriodEnd"], r["ChargePeriodEnd"]
    )


def one_per(key: str, value: str) -> Check:
    """Every ``key`` value maps to exactly one ``value`` across the dataset."""

    def check(rows: list[Row], columns: tuple[str, ...]) -> list[str]:
        seen: dict[str | None, set[str | None]] = defaultdict(set)
        for r in rows:
            if r[key] is not None:
                seen[r[key]].add(r[value])
        return [f"{key}={k!r} has {sorted(map(str, v))} as {value}" for k, v in seen.items()
                if len(v) > 1][:_LIMIT]  # fmt: skip

    return check


def columns_rule(pred: Callable[[tuple[str, ...]], list[str]]) -> Check:
    return lambda rows, columns: pred(columns)


# -- row conditions ----------------------------------------------------------------------------


def _tax(r: Row) -> bool:
    return r["ChargeCategory"] == "Tax"


def _usage_or_purchase(r: Row) -> bool:
    return r["ChargeCategory"] in ("Usage", "Purchase") and r["ChargeClass"] != "Correction"


def _usage(r: Row) -> bool:
    return r["ChargeCategory"] == "Usage" and r["CommitmentDiscountStatus"] != "Unused"


def _tenant_line(r: Row) -> bool:
    return r.get("x_LineKind") == "usage"


def _focus_cols(columns: tuple[str, ...]) -> list[str]:
    return [c for c in columns if not c.startswith("x_")]


def _pascal_case(columns: tuple[str, ...]) -> list[str]:
    return [f"{c} is not PascalCase" for c in _focus_cols(columns) if not _PASCAL.fullmatch(c)]


def _custom_prefixed(columns: tuple[str, ...]) -> list[str]:
    known = set(FOCUS_1_2_COLUMNS) | {
        "AllocatedMethodId", "AllocatedMethodDetails", "AllocatedResourceId",
        "AllocatedResourceName", "AllocatedTags",
    }  # fmt: skip
    return [f"{c} is neither a FOCUS column nor x_-prefixed" for c in columns
            if c not in known and not c.startswith("x_")]  # fmt: skip


def _custom_last(columns: tuple[str, ...]) -> list[str]:
    first_custom = next((i for i, c in enumerate(columns) if c.startswith("x_")), len(columns))
    return [f"{c} comes after a custom column" for c in columns[first_custom:]
            if not c.startswith("x_")]  # fmt: skip


def _no_placeholders(rows: list[Row], columns: tuple[str, ...]) -> list[str]:
    out = []
    for i, r in enumerate(rows):
        for c in _focus_cols(columns):
            v = r[c]
            if v is not None and (not v.strip() or v.strip().lower() in _PLACEHOLDERS):
                out.append(f"row {i}: {c}={v!r} stands for null")
    return out[:_LIMIT]


def _subcategory_parent(rows: list[Row], columns: tuple[str, ...]) -> list[str]:
    return [
        f"row {i}: {r['ServiceSubcategory']!r} is not a subcategory of {r['ServiceCategory']!r}"
        for i, r in enumerate(rows)
        if r["ServiceSubcategory"] is not None
        and r["ServiceSubcategory"] not in SERVICE_SUBCATEGORIES.get(r["ServiceCategory"] or "", ())
    ][:_LIMIT]


# -- the table ---------------------------------------------------------------------------------

_DATETIME_COLS = ("BillingPeriodEnd", "BillingPeriodStart", "ChargePeriodEnd", "ChargePeriodStart")
_DECIMAL_COLS = tuple(c for c, t, _ in FOCUS_1_2_SPEC if t == "Decimal")
_STRING_COLS = tuple(c for c, t, _ in FOCUS_1_2_SPEC if t == "String")
_KV_COLS = ("SkuPriceDetails", "Tags")
_PRESENCE_IDS = {
    "AvailabilityZone": "D-003-C", "ListUnitPrice": "D-004-C", "BillingAccountName": "D-005-M",
    "BilledCost": "D-006-M", "BillingAccountType": "D-007-C", "ChargeCategory": "D-008-M",
    "BillingPeriodStart": "D-009-M", "BillingPeriodEnd": "D-010-M",
    "ConsumedQuantity": "D-011-C", "CommitmentDiscountName": "D-012-C",
    "CommitmentDiscountId": "D-013-C", "CommitmentDiscountType": "D-014-C",
    "CommitmentDiscountUnit": "D-015-C", "CommitmentDiscountCategory": "D-016-C",
    "CommitmentDiscountStatus": "D-017-C", "CommitmentDiscountQuantity": "D-018-C",
    "SubAccountId": "D-019-C", "CapacityReservationStatus": "D-020-C",
    "PublisherName": "D-021-M", "PricingCategory": "D-022-C", "InvoiceIssuerName": "D-023-M",
    "BillingAccountId": "D-024-M", "ChargeDescription": "D-025-M", "ChargeClass": "D-026-M",
    "ChargeFrequency": "D-027-O", "ChargePeriodEnd": "D-028-M", "SubAccountName": "D-029-C",
    "ContractedCost": "D-030-M", "EffectiveCost": "D-031-M", "ListCost": "D-032-M",
    "InvoiceId": "D-033-O", "ContractedUnitPrice": "D-034-C", "BillingCurrency": "D-035-M",
    "PricingQuantity": "D-036-M", "ChargePeriodStart": "D-037-M", "ProviderName": "D-038-M",
    "ResourceType": "D-039-C", "ServiceCategory": "D-040-M", "ServiceName": "D-041-M",
    "ServiceSubcategory": "D-042-O", "ResourceId": "D-043-C", "ResourceName": "D-044-C",
    "PricingCurrency": "D-045-C", "PricingCurrencyContractedUnitPrice": "D-049-C",
    "PricingCurrencyEffectiveCost": "D-053-C", "PricingCurrencyListUnitPrice": "D-057-C",
    "SkuPriceId": "D-058-C", "SkuMeter": "D-059-C", "SkuId": "D-060-C",
    "SkuPriceDetails": "D-061-C", "RegionName": "D-062-C", "RegionId": "D-063-C",
    "Tags": "D-064-C", "CapacityReservationId": "D-065-C", "ConsumedUnit": "D-066-C",
    "SubAccountType": "D-067-C", "PricingUnit": "D-068-M",
}  # fmt: skip

# Per-column type rules: the spec numbers "MUST be of type X" per column (mostly C-001-M).
_TYPE_IDS = {c: f"{c}-C-001-M" for c in FOCUS_1_2_COLUMNS} | {
    "BillingAccountId": "BillingAccountId-C-002-M",
    "ContractedUnitPrice": "ContractedUnitPrice-C-002-M",
}
_FORMAT_IDS = {c: f"{c}-C-002-M" for c in FOCUS_1_2_COLUMNS} | {
    "BillingAccountId": "BillingAccountId-C-003-M",
    "ContractedUnitPrice": "ContractedUnitPrice-C-003-M",
    "Tags": "Tags-C-001-M",
    "SkuPriceDetails": "SkuPriceDetails-C-001-M",
}

RULES: tuple[Rule, ...] = (
    # presence: every column FOCUS 1.2 defines for CostAndUsage
    *(Rule(f"CostAndUsage-{_PRESENCE_IDS[c]}", f"{c} is present in the dataset", present(c))
      for c in FOCUS_1_2_COLUMNS),
    # column IDs and custom columns
    Rule("ColumnHandling-A-001-M", "Column IDs use PascalCase", columns_rule(_pascal_case)),
    Rule("ColumnHandling-A-003-M", "Column IDs are alphanumeric",
         columns_rule(lambda cs: [c for c in _focus_cols(cs) if not c.isalnum()])),
    Rule("ColumnHandling-A-005-O", "Column IDs are at most 50 characters",
         columns_rule(lambda cs: [c for c in cs if len(c) > 50])),
    Rule("ColumnHandling-A-010-M", "Custom columns carry the x_ prefix",
         columns_rule(_custom_prefixed)),
    Rule("ColumnHandling-A-013-O", "Custom columns come after all FOCUS columns",
         columns_rule(_custom_last)),
    # null handling and string handling, over every FOCUS column
    Rule("NullHandling-A-002-M", "No empty string or placeholder stands for null",
         _no_placeholders),
    # types and formats, column by column
    *(Rule(_TYPE_IDS[c], f"{c} is of type Decimal (NumericFormat)", decimal(c))
      for c in _DECIMAL_COLS),
    *(Rule(_TYPE_IDS[c], f"{c} is of type String (StringHandling)", string(c))
      for c in _STRING_COLS),
    *(Rule(_TYPE_IDS[c], f"{c} is of type Date/Time", datetime_format(c)) for c in _DATETIME_COLS),
    *(Rule(f"{c}-C-002-M", f"{c} conforms to DateTimeFormat (UTC, 'T', two-digit HH:mm:ss, 'Z')",
           datetime_format(c)) for c in _DATETIME_COLS),
    *(Rule(_FORMAT_IDS[c], f"{c} conforms to KeyValueFormat", key_value(c)) for c in _KV_COLS),
    Rule("KeyValueFormat-A-002-M", "Keys are unique within a Tags object", key_value("Tags")),
    Rule("KeyValueFormat-A-004-M", "Tags values are not objects or arrays", key_value("Tags")),
    Rule("CurrencyFormat-A-001-C", "BillingCurrency is an ISO 4217 code",
         currency("BillingCurrency")),
    Rule("CurrencyFormat-A-001-C", "PricingCurrency is an ISO 4217 code",
         currency("PricingCurrency")),
    # mandatory columns: not null
    *(Rule(rid, f"{c} is not null", not_null(c)) for rid, c in (
        ("BilledCost-C-003-M", "BilledCost"),
        ("BillingAccountId-C-001-M", "BillingAccountId"),
        ("BillingAccountName-C-003-C", "BillingAccountName"),
        ("BillingCurrency-C-004-M", "BillingCurrency"),
        ("BillingPeriodEnd-C-003-M", "BillingPeriodEnd"),
        ("BillingPeriodStart-C-003-M", "BillingPeriodStart"),
        ("ChargeCategory-C-002-M", "ChargeCategory"),
        ("ChargeDescription-C-003-O", "ChargeDescription"),
        ("ChargeFrequency-C-002-M", "ChargeFrequency"),
        ("ChargePeriodEnd-C-003-M", "ChargePeriodEnd"),
        ("ChargePeriodStart-C-003-M", "ChargePeriodStart"),
        ("ContractedCost-C-003-M", "ContractedCost"),
        ("EffectiveCost-C-003-M", "EffectiveCost"),
        ("InvoiceIssuerName-C-003-M", "InvoiceIssuerName"),
        ("ListCost-C-003-M", "ListCost"),
        ("PricingCurrency-C-004-M", "PricingCurrency"),
        ("PricingCurrencyEffectiveCost-C-003-M", "PricingCurrencyEffectiveCost"),
        ("ProviderName-C-003-M", "ProviderName"),
        ("PublisherName-C-003-M", "PublisherName"),
        ("ServiceCategory-C-002-M", "ServiceCategory"),
        ("ServiceName-C-003-M", "ServiceName"),
        ("ServiceSubcategory-C-002-M", "ServiceSubcategory"),
    )),
    # allowed values
    Rule("ChargeCategory-C-003-M", "ChargeCategory is an allowed value",
         allowed("ChargeCategory", CHARGE_CATEGORIES)),
    Rule("ChargeClass-C-005-C", "ChargeClass is 'Correction' when not null",
         allowed("ChargeClass", ("Correction",))),
    Rule("ChargeFrequency-C-003-M", "ChargeFrequency is an allowed value",
         allowed("ChargeFrequency", CHARGE_FREQUENCIES)),
    Rule("PricingCategory-C-007-M", "PricingCategory is an allowed value",
         allowed("PricingCategory", PRICING_CATEGORIES)),
    Rule("ServiceCategory-C-003-M", "ServiceCategory is an allowed value",
         allowed("ServiceCategory", SERVICE_CATEGORIES)),
    Rule("ServiceSubcategory-C-003-M", "ServiceSubcategory is an allowed value",
         allowed("ServiceSubcategory", [s for v in SERVICE_SUBCATEGORIES.values() for s in v])),
    Rule("ServiceSubcategory-C-004-M", "ServiceSubcategory has its one parent ServiceCategory",
         _subcategory_parent),
    Rule("CapacityReservationStatus-C-006-M", "CapacityReservationStatus is Used or Unused",
         allowed("CapacityReservationStatus", ("Used", "Unused"))),
    Rule("CommitmentDiscountCategory-C-005-M", "CommitmentDiscountCategory is Spend or Usage",
         allowed("CommitmentDiscountCategory", ("Spend", "Usage"))),
    Rule("CommitmentDiscountStatus-C-005-M", "CommitmentDiscountStatus is Used or Unused",
         allowed("CommitmentDiscountStatus", ("Used", "Unused"))),
    # charge class, category and frequency consistency
    Rule("ChargeClass-C-003-C", "ChargeClass is null: no row corrects a closed billing period",
         null("ChargeClass")),
    Rule("ChargeFrequency-C-004-C", "ChargeFrequency is not Usage-Based on Purchase rows",
         _rows_where("ChargeFrequency", lambda r: r["ChargeCategory"] == "Purchase"
                     and r["ChargeFrequency"] == "Usage-Based", "on a Purchase row")),
    # periods
    Rule("ChargePeriodStart-C-004-M", "ChargePeriodStart is the inclusive start: before End",
         before("ChargePeriodStart", "ChargePeriodEnd")),
    Rule("BillingPeriodStart-C-004-M", "BillingPeriodStart is the inclusive start: before End",
         before("BillingPeriodStart", "BillingPeriodEnd")),
    Rule("Seedance-ChargePeriodInBillingPeriod",
         "The charge period lies inside its billing period (both [start, end))",
         _rows_where("ChargePeriodStart", lambda r: not _inside_billing_period(r),
                     "is outside the billing period")),
    # costs
    *(Rule(f"{c}-C-004-M", f"{c} is a valid decimal value", decimal(c)) for c in (
        "BilledCost", "ContractedCost", "EffectiveCost", "ListCost",
        "PricingCurrencyEffectiveCost")),
    Rule("ListUnitPrice-C-008-M", "ListUnitPrice is non-negative", non_negative("ListUnitPrice")),
    Rule("ContractedUnitPrice-C-009-C", "ContractedUnitPrice is non-negative",
         non_negative("ContractedUnitPrice")),
    Rule("PricingCurrencyListUnitPrice-C-008-M", "PricingCurrencyListUnitPrice is non-negative",
         non_negative("PricingCurrencyListUnitPrice")),
    Rule("PricingCurrencyContractedUnitPrice-C-008-C",
         "PricingCurrencyContractedUnitPrice is non-negative",
         non_negative("PricingCurrencyContractedUnitPrice")),
    Rule("ListCost-C-009-C", "ListUnitPrice x PricingQuantity matches ListCost",
         product("ListUnitPrice", "PricingQuantity", "ListCost")),
    Rule("ContractedCost-C-009-C", "ContractedUnitPrice x PricingQuantity matches ContractedCost",
         product("ContractedUnitPrice", "PricingQuantity", "ContractedCost")),
    Rule("Seedance-EffectiveCostIsBilledCost",
         "No commitment discount or prepaid purchase to amortise: EffectiveCost = BilledCost",
         equal("EffectiveCost", "BilledCost")),
    Rule("PricingCurrencyEffectiveCost-C-006-M",
         "Priced in the billing currency: PricingCurrencyEffectiveCost = EffectiveCost",
         equal("PricingCurrencyEffectiveCost", "EffectiveCost",
               lambda r: r["PricingCurrency"] == r["BillingCurrency"])),
    Rule("PricingCurrencyListUnitPrice-C-009-M",
         "Priced in the billing currency: PricingCurrencyListUnitPrice = ListUnitPrice",
         equal("PricingCurrencyListUnitPrice", "ListUnitPrice",
               lambda r: r["PricingCurrency"] == r["BillingCurrency"])),
    Rule("PricingCurrencyContractedUnitPrice-C-009-C",
         "Priced in the billing currency: PricingCurrencyContractedUnitPrice = ContractedUnitPrice",
         equal("PricingCurrencyContractedUnitPrice", "ContractedUnitPrice",
               lambda r: r["PricingCurrency"] == r["BillingCurrency"])),
    # prices and quantities: null on Tax, not null on Usage/Purchase that is not a correction
    *(rule for rid_null, rid_not_null, c in (
        ("PricingQuantity-C-004-C", "PricingQuantity-C-005-C", "PricingQuantity"),
        ("ListUnitPrice-C-004-C", "ListUnitPrice-C-005-C", "ListUnitPrice"),
        ("ContractedUnitPrice-C-005-C", "ContractedUnitPrice-C-006-C", "ContractedUnitPrice"),
        ("PricingCategory-C-003-C", "PricingCategory-C-004-C", "PricingCategory"),
        ("PricingCurrencyListUnitPrice-C-004-C", "PricingCurrencyListUnitPrice-C-005-C",
         "PricingCurrencyListUnitPrice"),
        ("PricingCurrencyContractedUnitPrice-C-004-C",
         "PricingCurrencyContractedUnitPrice-C-005-C", "PricingCurrencyContractedUnitPrice"),
        ("SkuId-C-004-C", "SkuId-C-005-C", "SkuId"),
        ("SkuPriceId-C-004-C", "SkuPriceId-C-005-C", "SkuPriceId"),
    ) for rule in (
        Rule(rid_null, f"{c} is null on Tax rows", null_when(c, _tax, "ChargeCategory is Tax")),
        Rule(rid_not_null, f"{c} is not null on Usage/Purchase rows that are not corrections",
             not_null_when(c, _usage_or_purchase, "the row is Usage/Purchase")),
    )),
    Rule("ConsumedQuantity-C-004-C", "ConsumedQuantity is null unless a (used) Usage row",
         null_when("ConsumedQuantity", lambda r: not _usage(r), "not a used Usage row")),
    Rule("ConsumedQuantity-C-006-C", "ConsumedQuantity is not null on Usage rows",
         not_null_when("ConsumedQuantity", lambda r: _usage(r) and r["ChargeClass"] is None,
                       "a Usage row")),
    Rule("ConsumedQuantity-C-008-C", "ConsumedQuantity is a valid decimal",
         decimal("ConsumedQuantity")),
    Rule("PricingQuantity-C-008-M", "PricingQuantity is a valid decimal",
         decimal("PricingQuantity")),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("PricingUnit-C-005-C", "PricingUnit is null when PricingQuantity is null"),
         ("PricingUnit-C-006-C", "PricingUnit is not null when PricingQuantity is not null")),
        null_iff("PricingUnit", "PricingQuantity"), strict=True)),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("ConsumedUnit-C-005-C", "ConsumedUnit is null when ConsumedQuantity is null"),
         ("ConsumedUnit-C-006-C", "ConsumedUnit is not null when ConsumedQuantity is not null")),
        null_iff("ConsumedUnit", "ConsumedQuantity"), strict=True)),
    # SKUs
    Rule("SkuPriceId-C-008-M", "Each SkuPriceId has one and only one parent SkuId",
         one_per("SkuPriceId", "SkuId")),
    Rule("SkuId-C-009-M", "SkuId stays the same across PricingCategory values",
         one_per("SkuPriceId", "SkuId")),
    Rule("SkuId-C-009-M", "One SkuId per GPU model and resource type, whatever the pricing tier",
         lambda rows, cols: one_per("x_SkuKey", "SkuId")(
             [{**r, "x_SkuKey": f"{r['x_GpuModel']}|{r['ResourceType']}"} for r in rows], cols)),
    Rule("SkuMeter-C-004-C", "SkuMeter is null when SkuId is null",
         null_iff("SkuMeter", "SkuId")[0]),
    Rule("SkuMeter-C-005-C", "SkuMeter is not null when SkuId is not null",
         null_iff("SkuMeter", "SkuId")[1]),
    Rule("SkuMeter-C-006-O", "SkuMeter stays the same for a given SkuId",
         one_per("SkuId", "SkuMeter")),
    Rule("SkuPriceDetails-C-004-C", "SkuPriceDetails is null when SkuPriceId is null",
         null_when("SkuPriceDetails", lambda r: r["SkuPriceId"] is None, "SkuPriceId is null")),
    Rule("SkuPriceDetails-C-017-C", "SkuPriceDetails keys are x_-prefixed (no FOCUS-defined ones)",
         keys_match("SkuPriceDetails", r"x_[A-Z][A-Za-z0-9]*", "x_PascalCase")),
    # accounts and resources
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("BillingAccountType-C-004-C", "BillingAccountType is null when BillingAccountId is"),
         ("BillingAccountType-C-005-C", "BillingAccountType is set when BillingAccountId is")),
        null_iff("BillingAccountType", "BillingAccountId"), strict=True)),
    Rule("SubAccountId-C-004-C", "SubAccountId is null on lines of no tenant (idle)",
         null_when("SubAccountId", lambda r: not _tenant_line(r), "the line is not a tenant's")),
    Rule("SubAccountId-C-005-C", "SubAccountId is the tenant on a tenant's lines",
         not_null_when("SubAccountId", _tenant_line, "the line is a tenant's")),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("SubAccountName-C-004-C", "SubAccountName is null when SubAccountId is null"),
         ("SubAccountName-C-005-C", "SubAccountName is set when SubAccountId is")),
        null_iff("SubAccountName", "SubAccountId"), strict=True)),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("SubAccountType-C-004-C", "SubAccountType is null when SubAccountId is null"),
         ("SubAccountType-C-005-C", "SubAccountType is set when SubAccountId is")),
        null_iff("SubAccountType", "SubAccountId"), strict=True)),
    Rule("ResourceId-C-005-C", "ResourceId is set: every charge is a node's",
         not_null("ResourceId")),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("ResourceType-C-004-C", "ResourceType is null when ResourceId is null"),
         ("ResourceType-C-005-C", "ResourceType is set when ResourceId is")),
        null_iff("ResourceType", "ResourceId"), strict=True)),
    Rule("ResourceName-C-004-C", "ResourceName is null when ResourceId is null",
         null_iff("ResourceName", "ResourceId")[0]),
    Rule("ResourceName-C-005-C", "ResourceName is set when ResourceId is (nodes have names)",
         null_iff("ResourceName", "ResourceId")[1]),
    Rule("ResourceName-C-006-C", "ResourceName does not duplicate the system-made ResourceId",
         _rows_where("ResourceName", lambda r: r["ResourceName"] is not None
                     and r["ResourceName"] == r["ResourceId"], "equals ResourceId")),
    *(Rule(rid, text, check) for (rid, text), check in zip(
        (("RegionName-C-004-C", "RegionName is null when RegionId is null"),
         ("RegionName-C-005-C", "RegionName is set when RegionId is")),
        null_iff("RegionName", "RegionId"), strict=True)),
    Rule("ServiceName-C-005-C", "Each ServiceName has one and only one ServiceCategory",
         one_per("ServiceName", "ServiceCategory")),
    Rule("ServiceName-C-008-C", "Each ServiceName has one ServiceSubcategory",
         one_per("ServiceName", "ServiceSubcategory")),
    Rule("InvoiceId-C-007-C", "A (provisional) InvoiceId belongs to one BillingAccountId",
         one_per("InvoiceId", "BillingAccountId")),
    # tags
    Rule("Tags-C-012-M", "Provider-defined tag keys carry the provider's prefix (seedance:)",
         keys_match("Tags", r"seedance:[a-z_]+", "seedance:-prefixed")),
    # concepts Seedance does not have: the columns are present and null
    Rule("AvailabilityZone-C-003-C", "AvailabilityZone is null: no charge is zone-specific",
         null("AvailabilityZone")),
    Rule("CapacityReservationId-C-004-C", "CapacityReservationId is null: no reservations",
         null("CapacityReservationId")),
    Rule("CapacityReservationStatus-C-003-C",
         "CapacityReservationStatus is null when CapacityReservationId is null",
         null_iff("CapacityReservationStatus", "CapacityReservationId")[0]),
    Rule("CommitmentDiscountId-C-004-C", "CommitmentDiscountId is null: no commitment discounts",
         null("CommitmentDiscountId")),
    *(Rule(rid, f"{c} is null when CommitmentDiscountId is null",
           null_iff(c, "CommitmentDiscountId")[0]) for rid, c in (
        ("CommitmentDiscountName-C-004-C", "CommitmentDiscountName"),
        ("CommitmentDiscountCategory-C-003-C", "CommitmentDiscountCategory"),
        ("CommitmentDiscountType-C-004-C", "CommitmentDiscountType"),
        ("CommitmentDiscountStatus-C-003-C", "CommitmentDiscountStatus"),
        ("CommitmentDiscountQuantity-C-007-C", "CommitmentDiscountQuantity"),
    )),
    Rule("CommitmentDiscountUnit-C-005-C",
         "CommitmentDiscountUnit is null when CommitmentDiscountQuantity is null",
         null_iff("CommitmentDiscountUnit", "CommitmentDiscountQuantity")[0]),
    Rule("PricingCategory-C-009-C", "'Committed' only with a commitment discount",
         _rows_where("PricingCategory", lambda r: r["PricingCategory"] == "Committed"
                     and r["CommitmentDiscountId"] is None, "without a CommitmentDiscountId")),
)  # fmt: skip


def parse(text: str) -> tuple[list[Row], tuple[str, ...]]:
    """CSV rows with null for an empty field, every FOCUS 1.2 key present (None if absent)."""
    reader = csv.DictReader(io.StringIO(text))
    columns = tuple(reader.fieldnames or ())
    blank = dict.fromkeys(FOCUS_1_2_COLUMNS)
    rows = [{**blank, **{k: (v if v != "" else None) for k, v in r.items()}} for r in reader]
    return rows, columns


def violations(rows: list[Row], columns: tuple[str, ...]) -> dict[str, list[str]]:
    """Every rule's violations, keyed ``rule_id: text``; an empty dict means conforming."""
    out: dict[str, list[str]] = {}
    for rule in RULES:
        bad = rule.check(rows, columns)
        if bad:
            out[f"{rule.rule_id}: {rule.text}"] = bad
    return out
