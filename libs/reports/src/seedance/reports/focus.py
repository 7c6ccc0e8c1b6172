"""FinOps FOCUS exports of cost entries: FOCUS 1.2 CostAndUsage, and 1.3 split cost allocation.

Owns the mapping from the ledger's cost entries to FOCUS rows, as pure functions: entries in,
rows (dicts keyed by column ID, ``None`` for null) out. Must not compute costs: every money
figure is an integer micro-dollar sum of what the ledger emitted, rendered as an exact decimal.

Two formats, each saying which version it claims, in ``x_FocusVersion`` on every row and in
the dataset metadata of ``focus_metadata`` (FOCUS 1.2 has no version column of its own; its
metadata supplement puts ``FocusVersion`` in a file-level schema object, so both are given):
- ``focus_rows`` / ``focus_csv``: FOCUS **1.2**, all 57 CostAndUsage columns.
- ``focus_split_rows`` / ``focus_split_csv``: FOCUS **1.3** split cost allocation: the same
  columns plus ``AllocatedMethodId``, ``AllocatedMethodDetails``, ``AllocatedResourceId``,
  ``AllocatedResourceName`` and ``AllocatedTags``. The origin charge is one node's GPU cost in
  one window; each job's line is an allocated charge of it, the node's idle the unallocated
  part (``AllocatedResourceId`` null). Ratios sum to exactly 1 and costs to the origin's cost
  to the micro-dollar. A separate format, not an option of the 1.2 one: a 1.2 reader would not
  know that the rows of an origin charge must be summed together.

Mapping (column by column in docs/cost-ledger.md):
- ``ResourceId`` = ``seedance:node/<node>`` (system-generated), ``ResourceName`` = the node.
- ``SubAccountId`` = tenant; idle lines belong to no tenant, so their sub-account is null and
  ``Tags`` carry ``seedance:allocation = __idle__``.
- ``PricingQuantity``/``ConsumedQuantity`` = GPU-hours (energy rows: kWh). Unit prices are
  ``cost / quantity``, exact when that decimal terminates within 15 places, else rounded half
  to even at 15 places (kWh quantities too, and the price is then cost / the written
  quantity): the product of written price and quantity equals the cost within quantity x
  5e-16, far inside the micro-dollar.
- ``PricingCategory``: on_demand -> Standard, reserved -> Standard (an agreed rate; Seedance
  models no commitment-discount object, which "Committed" would require), spot -> Dynamic,
  on_prem -> Other (an amortised purchase, none of the market models).
- ``InvoiceId`` = ``<billing account>-<YYYY-MM>``: the provisional invoice of the billing
  month (the spec allows an id generated before the invoice is issued).
- No commitment discounts, capacity reservations, regions or availability zones: those
  columns are present and null, as the spec asks of charges unrelated to them.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

import msgspec

from seedance.events.cost import is_source_summary, source_count
from seedance.reports.idle import apportion
from seedance.reports.lines import LineAmounts, ReportLine

__all__ = [
    "FOCUS_1_2_COLUMNS",
    "FOCUS_1_3_ALLOCATION_COLUMNS",
    "FOCUS_COLUMNS",
    "FOCUS_CUSTOM_COLUMNS",
    "FOCUS_SPLIT_COLUMNS",
    "FocusContext",
    "FocusError",
    "focus_csv",
    "focus_files",
    "focus_metadata",
    "focus_rows",
    "focus_split_csv",
    "focus_split_rows",
]

# Every CostAndUsage column FOCUS 1.2 defines: (column ID, data type, feature level).
FOCUS_1_2_SPEC: tuple[tuple[str, str, str], ...] = (
    ("AvailabilityZone", "String", "Recommended"),
    ("BilledCost", "Decimal", "Mandatory"),
    ("BillingAccountId", "String", "Mandatory"),
    ("BillingAccountName", "String", "Mandatory"),
    ("BillingAccountType", "String", "Conditional"),
    ("BillingCurrency", "String", "Mandatory"),
    ("BillingPeriodEnd", "Date/Time", "Mandatory"),
    ("BillingPeriodStart", "Date/Time", "Mandatory"),
    ("CapacityReservationId", "String", "Conditional"),
    ("CapacityReservationStatus", "String", "Conditional"),
    ("ChargeCategory", "String", "Mandatory"),
    ("ChargeClass", "String", "Mandatory"),
    ("ChargeDescription", "String", "Mandatory"),
    ("ChargeFrequency", "String", "Recommended"),
    ("ChargePeriodEnd", "Date/Time", "Mandatory"),
    ("ChargePeriodStart", "Date/Time", "Mandatory"),
    ("CommitmentDiscountCategory", "String", "Conditional"),
    ("CommitmentDiscountId", "String", "Conditional"),
    ("CommitmentDiscountName", "String", "Conditional"),
    ("CommitmentDiscountQuantity", "Decimal", "Conditional"),
    ("CommitmentDiscountStatus", "String", "Conditional"),
    ("CommitmentDiscountType", "String", "Conditional"),
    ("CommitmentDiscountUnit", "String", "Conditional"),
    ("ConsumedQuantity", "Decimal", "Conditional"),
    ("ConsumedUnit", "String", "Conditional"),
    ("ContractedCost", "Decimal", "Mandatory"),
    ("ContractedUnitPrice", "Decimal", "Conditional"),
    ("EffectiveCost", "Decimal", "Mandatory"),
    ("InvoiceId", "String", "Recommended"),
    ("InvoiceIssuerName", "String", "Mandatory"),
    ("ListCost", "Decimal", "Mandatory"),
    ("ListUnitPrice", "Decimal", "Conditional"),
    ("PricingCategory", "String", "Conditional"),
    ("PricingCurrency", "String", "Conditional"),
    ("PricingCurrencyContractedUnitPrice", "Decimal", "Conditional"),
    ("PricingCurrencyEffectiveCost", "Decimal", "Conditional"),
    ("PricingCurrencyListUnitPrice", "Decimal", "Conditional"),
    ("PricingQuantity", "Decimal", "Mandatory"),
    ("PricingUnit", "String", "Mandatory"),
    ("ProviderName", "String", "Mandatory"),
    ("PublisherName", "String", "Mandatory"),
    ("RegionId", "String", "Conditional"),
    ("RegionName", "String", "Conditional"),
    ("ResourceId", "String", "Conditional"),
    ("ResourceName", "String", "Conditional"),
    ("ResourceType", "String", "Conditional"),
    ("ServiceCategory", "String", "Mandatory"),
    ("ServiceName", "String", "Mandatory"),
    ("ServiceSubcategory", "String", "Recommended"),
    ("SkuId", "String", "Conditional"),
    ("SkuMeter", "String", "Conditional"),
    ("SkuPriceDetails", "Key-Value", "Conditional"),
    ("SkuPriceId", "String", "Conditional"),
    ("SubAccountId", "String", "Conditional"),
    ("SubAccountName", "String", "Conditional"),
    ("SubAccountType", "String", "Conditional"),
    ("Tags", "Key-Value", "Conditional"),
)
FOCUS_1_2_COLUMNS = tuple(c for c, _, _ in FOCUS_1_2_SPEC)

# FOCUS 1.3's split cost allocation columns (all nullable; JSON ones serialised as strings).
FOCUS_1_3_ALLOCATION_SPEC: tuple[tuple[str, str, str], ...] = (
    ("AllocatedMethodDetails", "JSON", "Recommended"),
    ("AllocatedMethodId", "String", "Conditional"),
    ("AllocatedResourceId", "String", "Conditional"),
    ("AllocatedResourceName", "String", "Conditional"),
    ("AllocatedTags", "JSON", "Conditional"),
)
FOCUS_1_3_ALLOCATION_COLUMNS = tuple(c for c, _, _ in FOCUS_1_3_ALLOCATION_SPEC)

# Seedance's own figures, after every FOCUS column, with the spec's x_ prefix.
FOCUS_CUSTOM_COLUMNS = (
    "x_FocusVersion", "x_LineKind", "x_JobId", "x_GpuModel", "x_PricingTier",
    "x_EnergyMillijoules", "x_TflopHours", "x_Activity", "x_Assumptions", "x_SourceEventCount",
    "x_PriceAssumed", "x_PriceFallback",
)  # fmt: skip

FOCUS_COLUMNS = FOCUS_1_2_COLUMNS + FOCUS_CUSTOM_COLUMNS
FOCUS_SPLIT_COLUMNS = FOCUS_1_2_COLUMNS + FOCUS_1_3_ALLOCATION_COLUMNS + FOCUS_CUSTOM_COLUMNS

ALLOCATION_METHOD_ID = "seedance.gpu-time-share.v1"
_UNIT_PRICE_PLACES = 15
_RATIO_SCALE = 10**12  # AllocatedRatio has 12 decimal places; the parts sum to exactly 1

_PRICING_CATEGORY = {
    "on_demand": "Standard",
    "reserved": "Standard",
    "spot": "Dynamic",
    "on_prem": "Other",
}

_DETAILS = msgspec.json.Encoder(decimal_format="number", order="sorted")


class FocusError(ValueError):
    """A ledger line that cannot be written as a conforming FOCUS row (names the line)."""


class FocusContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who bills whom: the FOCUS columns the ledger cannot know."""

    billing_account_id: str = "seedance"
    billing_account_name: str = "Seedance GPU fleet"
    billing_account_type: str = "GPU fleet"
    sub_account_type: str = "Tenant"
    provider_name: str = "Seedance"
    publisher_name: str = "Seedance"
    invoice_issuer_name: str = "Seedance"
    service_name: str = "Seedance GPU compute"
    service_category: str = "AI and Machine Learning"
    service_subcategory: str = "AI Platforms"
    currency: str = "USD"
    region_id: str | None = None
    region_name: str | None = None

    def __post_init__(self) -> None:
        if len(self.currency) != 3 or not self.currency.isalpha() or not self.currency.isupper():
            raise FocusError(f"currency = {self.currency!r} is not an ISO 4217 code")
        if (self.region_id is None) != (self.region_name is None):
            raise FocusError("region_id and region_name are given together or not at all")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _month_bounds(ms: int) -> tuple[str, str]:
    t = datetime.fromtimestamp(ms / 1000, tz=UTC)
    start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ")


def _fixed(d: Decimal) -> str:
    """Plain decimal text, never E notation (``0E-6`` would read as a formula to some tools)."""
    text = format(d, "f")
    return "0" if text.lstrip("-").strip("0.") == "" else text


def _micro(micro: int) -> str:
    return _fixed(Decimal(micro).scaleb(-6))


def _ratio(num: Fraction, places: int = _UNIT_PRICE_PLACES) -> Decimal:
    """An exact rational as a decimal: exact if it terminates within ``places``, else rounded."""
    scaled = round(num * 10**places)  # half to even, exact on Fractions
    d = Decimal(scaled).scaleb(-places)
    return d.normalize()


def _fold(entries: Iterable[ReportLine]) -> list[tuple[ReportLine, LineAmounts, int]]:
    """One line per (kind, job, node, window): amounts summed over revisions, and the number
    of distinct sources of its revisions. Where a revision's list is capped (its last entry
    names the rest by count, ``bounded_source_ids``), at least its count: the ids it does not
    list cannot be told apart from another revision's."""
    folded: dict[tuple[str, str, str, int], tuple[ReportLine, LineAmounts, set[str], int]] = {}
    for e in entries:
        key = (e.kind, e.job_id, e.node, e.window_start_ms)
        if key not in folded:
            folded[key] = (e, LineAmounts(), set(), 0)
        first, amounts, sources, counted = folded[key]
        amounts.add(e.amounts)
        sources.update(e.source_event_ids)
        counted = max(counted, source_count(e.source_event_ids))
        # the latest revision carries current metadata
        folded[key] = (e if e.revision > first.revision else first, amounts, sources, counted)
    return [(e, a, max(c, len(s) - _capped(s))) for _, (e, a, s, c) in sorted(folded.items())]


def _capped(ids: set[str]) -> int:
    """How many of ``ids`` are a capped list's last entry (``bounded_source_ids``)."""
    return sum(is_source_summary(i) for i in ids)


def _tags(e: ReportLine) -> dict[str, str]:
    # Provider-defined tag keys carry the provider's prefix (FOCUS Tags rules).
    base = (
        {"seedance:allocation": "__idle__"}
        if e.kind == "idle"
        else {"seedance:job": e.job_id, "seedance:tenant": e.tenant}
    )
    return {**base, "seedance:pricing_tier": e.pricing_tier}


def _common(
    e: ReportLine, a: LineAmounts, n_sources: int, ctx: FocusContext, version: str
) -> dict[str, Any]:
    period_start, period_end = _month_bounds(e.window_start_ms)
    idle = e.kind == "idle"
    null_columns = (
        "AvailabilityZone", "CapacityReservationId", "CapacityReservationStatus", "ChargeClass",
        "CommitmentDiscountCategory", "CommitmentDiscountId", "CommitmentDiscountName",
        "CommitmentDiscountQuantity", "CommitmentDiscountStatus", "CommitmentDiscountType",
        "CommitmentDiscountUnit",
    )  # fmt: skip
    return {
        **dict.fromkeys(null_columns),
        "BillingAccountId": ctx.billing_account_id,
        "BillingAccountName": ctx.billing_account_name,
        "BillingAccountType": ctx.billing_account_type,
        "BillingCurrency": ctx.currency,
        "BillingPeriodStart": period_start,
        "BillingPeriodEnd": period_end,
        "ChargeCategory": "Usage",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": _iso(e.window_start_ms),
        "ChargePeriodEnd": _iso(e.window_end_ms),
        # A provisional invoice per billing account and month (the spec allows an id before
        # the invoice is issued): the month's BilledCost sums to what that statement asks.
        "InvoiceId": f"{ctx.billing_account_id}-{period_start[:7]}",
        "InvoiceIssuerName": ctx.invoice_issuer_name,
        "PricingCategory": _PRICING_CATEGORY.get(e.pricing_tier, "Other"),
        "PricingCurrency": ctx.currency,
        "ProviderName": ctx.provider_name,
        "PublisherName": ctx.publisher_name,
        "RegionId": ctx.region_id,
        "RegionName": ctx.region_name,
        "ResourceId": f"seedance:node/{e.node}",
        "ResourceName": e.node,
        "ServiceCategory": ctx.service_category,
        "ServiceName": ctx.service_name,
        "ServiceSubcategory": ctx.service_subcategory,
        "SubAccountId": None if idle else e.tenant,
        "SubAccountName": None if idle else e.tenant,
        "SubAccountType": None if idle else ctx.sub_account_type,
        "Tags": json.dumps(_tags(e), sort_keys=True),
        "x_FocusVersion": version,
        "x_LineKind": e.kind,
        "x_JobId": None if idle else e.job_id,
        "x_GpuModel": e.gpu_model,
        "x_PricingTier": e.pricing_tier,
        "x_EnergyMillijoules": a.energy_mj,
        "x_TflopHours": _micro(a.tflop_hours_micro),
        "x_Activity": (
            None if e.activity_ppm is None else _fixed(Decimal(e.activity_ppm).scaleb(-6))
        ),
        "x_Assumptions": " ".join(e.assumptions) or None,
        "x_SourceEventCount": n_sources,
        # Issue 28: a price the book assumed (configured, or its fallback for a GPU it could
        # not identify) is marked on every row it bills, not only among the assumptions.
        "x_PriceAssumed": "true" if e.price_assumed else "false",
        "x_PriceFallback": "true" if e.price_fallback else "false",
    }


def _priced(
    *, cost_micro: int, list_micro: int, quantity: Fraction, unit: str, what: str
) -> dict[str, Any]:
    """The cost, quantity and unit-price columns of one charge, exact and consistent."""
    if quantity <= 0:
        raise FocusError(f"{what}: cost {cost_micro} µUSD with quantity {quantity} {unit}")
    # The quantity as written (kWh may not terminate) is what the prices are divided by, so
    # the only rounding left is the price's: |price x quantity - cost| <= quantity x 5e-16.
    written = _ratio(quantity)
    if written <= 0:
        raise FocusError(f"{what}: quantity {quantity} {unit} rounds to nothing")
    shown = Fraction(written)
    cost, list_cost = Fraction(cost_micro, 10**6), Fraction(list_micro, 10**6)
    contracted_unit = _fixed(_ratio(cost / shown))
    list_unit = _fixed(_ratio(list_cost / shown))
    qty = _fixed(written)
    return {
        "BilledCost": _micro(cost_micro),
        "EffectiveCost": _micro(cost_micro),
        "ContractedCost": _micro(cost_micro),
        "PricingCurrencyEffectiveCost": _micro(cost_micro),
        "ListCost": _micro(list_micro),
        "PricingQuantity": qty,
        "PricingUnit": unit,
        "ConsumedQuantity": qty,
        "ConsumedUnit": unit,
        "ContractedUnitPrice": contracted_unit,
        "PricingCurrencyContractedUnitPrice": contracted_unit,
        "ListUnitPrice": list_unit,
        "PricingCurrencyListUnitPrice": list_unit,
    }


def _gpu_row(e: ReportLine, a: LineAmounts, common: dict[str, Any]) -> dict[str, Any]:
    what = "Idle GPU capacity" if e.kind == "idle" else f"GPU time of job {e.job_id}"
    return {
        **common,
        **_priced(
            cost_micro=a.cost_usd_micro,
            list_micro=a.list_cost_usd_micro,
            quantity=Fraction(a.gpu_hours_micro, 10**6),
            unit="GPU-Hours",
            what=f"line {e.entry_id}",
        ),
        "ChargeDescription": f"{what} on {e.node} ({e.gpu_model}, {e.pricing_tier})",
        "ResourceType": "GPU",
        "SkuId": f"seedance-gpu-hour-{e.gpu_model}",
        "SkuPriceId": f"seedance-gpu-hour-{e.gpu_model}-{e.pricing_tier}",
        "SkuMeter": "GPU time",
        "SkuPriceDetails": json.dumps(
            {"x_GpuModel": e.gpu_model, "x_PricingTier": e.pricing_tier}, sort_keys=True
        ),
    }


def _energy_row(e: ReportLine, a: LineAmounts, common: dict[str, Any]) -> dict[str, Any]:
    what = "idle GPU capacity" if e.kind == "idle" else f"GPU time of job {e.job_id}"
    # Energy is billed at the measured rate: list and contracted prices are the same.
    return {
        **common,
        **_priced(
            cost_micro=a.energy_usd_micro,
            list_micro=a.energy_usd_micro,
            quantity=Fraction(a.energy_mj, 3_600_000_000),  # millijoules -> kWh
            unit="kWh",
            what=f"energy of line {e.entry_id}",
        ),
        "ChargeDescription": f"Measured GPU energy: {what} on {e.node}",
        "ResourceType": "GPU energy",
        "SkuId": "seedance-gpu-energy",
        "SkuPriceId": "seedance-gpu-energy-kwh",
        "SkuMeter": "GPU energy",
        "SkuPriceDetails": json.dumps({"x_MeasuredAt": "wall, with PUE"}, sort_keys=True),
    }


def _line_rows(
    e: ReportLine, a: LineAmounts, n: int, ctx: FocusContext, version: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    common = _common(e, a, n, ctx, version)
    gpu = _gpu_row(e, a, common) if (a.cost_usd_micro or a.gpu_hours_micro) else None
    energy = _energy_row(e, a, common) if a.energy_usd_micro else None
    return gpu, energy


def focus_rows(
    entries: Iterable[ReportLine], ctx: FocusContext | None = None
) -> list[dict[str, Any]]:
    """FOCUS 1.2 CostAndUsage rows (column ID -> value, ``None`` = null), in a stable order."""
    ctx = ctx or FocusContext()
    rows: list[dict[str, Any]] = []
    for e, a, n in _fold(entries):
        if a.is_zero():
            continue
        rows.extend(r for r in _line_rows(e, a, n, ctx, "1.2") if r is not None)
    return rows


def focus_split_rows(
    entries: Iterable[ReportLine], ctx: FocusContext | None = None
) -> list[dict[str, Any]]:
    """FOCUS 1.3 rows with split cost allocation of each node-window's GPU cost.

    The origin charge is the GPU cost of one node in one window (every job's line there plus
    the node's idle line). Each job line becomes an allocated charge (``AllocatedResourceId``
    = ``<tenant>/<job>``), the idle line the unallocated one (``AllocatedResourceId`` null).
    ``AllocatedRatio`` is the line's share of the origin's cost (of its GPU-hours where the
    origin cost nothing), apportioned in 1e-12 steps so the ratios sum to exactly 1. Energy
    rows are each job's own measured charge, not a split, and carry null allocation columns.
    """
    ctx = ctx or FocusContext()
    origins: dict[tuple[str, int], list[tuple[ReportLine, LineAmounts, int]]] = defaultdict(list)
    energy: list[dict[str, Any]] = []
    for e, a, n in _fold(entries):
        if a.is_zero():
            continue
        gpu, en = _line_rows(e, a, n, ctx, "1.3")
        if gpu is not None:
            origins[(e.node, e.window_start_ms)].append((e, a, n))
        if en is not None:
            energy.append({**en, **dict.fromkeys(FOCUS_1_3_ALLOCATION_COLUMNS)})
    rows: list[dict[str, Any]] = []
    for (node, start_ms), lines in sorted(origins.items()):
        weights = [a.cost_usd_micro for _, a, _ in lines]
        if sum(weights) <= 0:
            weights = [a.gpu_hours_micro for _, a, _ in lines]
        if sum(weights) <= 0:
            raise FocusError(f"origin charge {node}@{_iso(start_ms)} has no cost and no GPU-hours")
        ratios = apportion(_RATIO_SCALE, weights)
        for (e, a, n), ratio in zip(lines, ratios, strict=True):
            row = _gpu_row(e, a, _common(e, a, n, ctx, "1.3"))
            details = {
                "Elements": [
                    {
                        "AllocatedRatio": Decimal(ratio).scaleb(-12),
                        "UsageUnit": "GPU-Hours",
                        "UsageQuantity": Decimal(a.gpu_hours_micro).scaleb(-6),
                    }
                ],
                "x_OriginCharge": f"seedance:node/{node}@{_iso(start_ms)}",
            }
            allocated = e.kind != "idle"
            row.update(
                AllocatedMethodId=ALLOCATION_METHOD_ID,
                AllocatedMethodDetails=_DETAILS.encode(details).decode(),
                AllocatedResourceId=f"{e.tenant}/{e.job_id}" if allocated else None,
                AllocatedResourceName=e.job_id if allocated else None,
                AllocatedTags=(
                    json.dumps({"seedance:job": e.job_id, "seedance:tenant": e.tenant},
                               sort_keys=True)
                    if allocated
                    else None
                ),
            )  # fmt: skip
            rows.append(row)
    return rows + energy


def focus_metadata(version: str, columns: tuple[str, ...], created_ms: int) -> dict[str, Any]:
    """The dataset-level statement of a FOCUS file: its version and column definitions.

    FOCUS carries its version in metadata, not in a column; this is the schema object of the
    spec's metadata supplement, written beside the CSV (``<file>.metadata.json``).
    """
    if version not in ("1.2", "1.3"):
        raise FocusError(f"version = {version!r}: Seedance writes FOCUS 1.2 or 1.3")
    kinds = {c: (t, lvl) for c, t, lvl in FOCUS_1_2_SPEC + FOCUS_1_3_ALLOCATION_SPEC}
    return {
        "DatasetInstance": [{"DatasetInstanceId": "seedance-cost-and-usage", "FocusDatasetId":
                             "CostAndUsage", "DatasetInstanceName": "Seedance GPU cost"}],
        "Schema": [
            {
                "SchemaId": f"seedance-focus-{version}",
                "FocusVersion": version,
                "CreationDate": _iso(created_ms),
                "ColumnDefinition": [
                    {"ColumnName": c, "DataType": kinds.get(c, ("String", "Custom"))[0],
                     "FeatureLevel": kinds.get(c, ("String", "Custom"))[1]}
                    for c in columns
                ],
            }
        ],
    }  # fmt: skip


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")  # None is written empty
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def focus_csv(entries: Iterable[ReportLine], ctx: FocusContext | None = None) -> str:
    """FOCUS 1.2 rows as CSV with the spec's column IDs as the header (null = empty field)."""
    return _csv(focus_rows(entries, ctx), FOCUS_COLUMNS)


def focus_split_csv(entries: Iterable[ReportLine], ctx: FocusContext | None = None) -> str:
    """FOCUS 1.3 split-allocation rows as CSV."""
    return _csv(focus_split_rows(entries, ctx), FOCUS_SPLIT_COLUMNS)


def focus_files(
    entries: Iterable[ReportLine],
    *,
    created_ms: int,
    names: tuple[str, str] = ("focus-1.2", "focus-1.3"),
    ctx: FocusContext | None = None,
) -> dict[str, str]:
    """Both exports with their metadata, as file name -> text: ``<names[0]>.csv`` (FOCUS 1.2)
    and ``<names[1]>.csv`` (1.3 split allocation), each with its ``.metadata.json``."""
    lines = list(entries)
    out: dict[str, str] = {}
    for name, version, columns, text in (
        (names[0], "1.2", FOCUS_COLUMNS, focus_csv(lines, ctx)),
        (names[1], "1.3", FOCUS_SPLIT_COLUMNS, focus_split_csv(lines, ctx)),
    ):
        out[f"{name}.csv"] = text
        meta = focus_metadata(version, columns, created_ms=created_ms)
        out[f"{name}.metadata.json"] = json.dumps(meta, indent=2) + "\n"
    return out
