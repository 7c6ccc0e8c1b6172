"""CSV and FinOps FOCUS 1.2 exports of cost entries.

Owns two tabular views of the ledger: the raw entry log (every revision, with its source event
ids, for audit) and a FOCUS 1.2 cost-and-usage table (one row per line per charge window, the
revisions folded, energy as its own rows), with the spec's column IDs. Must not compute costs:
it only formats what the ledger emitted.

FOCUS mapping (spec v1.2, ``specification/columns/*.md`` of FinOps-Open-Cost-and-Usage-Spec):
- ``SubAccountId`` = tenant (idle rows: ``__idle__``), ``ResourceId``/``ResourceName`` = node,
  ``ResourceType`` = "GPU" or "GPU energy", ``ChargeCategory`` = "Usage".
- ``PricingQuantity``/``ConsumedQuantity`` = GPU-hours (energy rows: kWh at the wall).
- ``ListCost`` = on-demand list price × quantity; ``ContractedCost`` and ``EffectiveCost`` and
  ``BilledCost`` = the cost at the node's pricing tier (no invoice-level discounts here).
- ``PricingCategory``: on_demand → Standard, spot → Dynamic, reserved → Committed, on_prem →
  Other. ``BillingPeriodStart/End`` = the UTC calendar month of the charge period.
- Seedance's own figures use the spec's ``x_`` prefix for custom columns.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from decimal import Decimal

import msgspec

from seedance.cost_ledger.core.ledger import Amounts, CostEntry
from seedance.cost_ledger.core.money import usd_from_micro

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

FOCUS_COLUMNS = (
    # the 21 columns FOCUS 1.2 makes mandatory
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency",
    "BillingPeriodEnd", "BillingPeriodStart", "ChargeCategory", "ChargeClass",
    "ChargeDescription", "ChargePeriodEnd", "ChargePeriodStart", "ContractedCost",
    "EffectiveCost", "InvoiceIssuerName", "ListCost", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
    # conditional ones that apply to GPU usage
    "ChargeFrequency", "ConsumedQuantity", "ConsumedUnit", "ContractedUnitPrice",
    "ListUnitPrice", "PricingCategory", "ResourceId", "ResourceName", "ResourceType",
    "SkuId", "SubAccountId", "SubAccountName", "Tags",
    # Seedance's own (x_ prefix per the spec's rule for custom columns)
    "x_GpuModel", "x_EnergyMillijoules", "x_TflopHours", "x_Activity", "x_Assumptions",
    "x_SourceEventCount",
)  # fmt: skip

_PRICING_CATEGORY = {
    "on_demand": "Standard",
    "spot": "Dynamic",
    "reserved": "Committed",
    "on_prem": "Other",
}


class FocusContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who bills whom: the FOCUS columns the ledger cannot know."""

    billing_account_id: str = "seedance"
    billing_account_name: str = "Seedance GPU fleet"
    provider_name: str = "Seedance"
    publisher_name: str = "Seedance"
    invoice_issuer_name: str = "Seedance"
    service_name: str = "Seedance GPU compute"
    service_category: str = "AI and Machine Learning"
    currency: str = "USD"


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


def _dec(micro: int) -> str:
    return str(usd_from_micro(micro))


def entries_csv(entries: Iterable[CostEntry]) -> str:
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


def _fold(entries: Iterable[CostEntry]) -> list[tuple[CostEntry, Amounts, int]]:
    """One line per (kind, job, node, window): amounts summed over revisions."""
    folded: dict[tuple[str, str, str, int], tuple[CostEntry, Amounts, set[str]]] = {}
    for e in entries:
        key = (e.kind, e.job_id, e.node, e.window_start_ms)
        if key not in folded:
            folded[key] = (e, Amounts(), set())
        first, amounts, sources = folded[key]
        amounts.add(e.amounts)
        sources.update(e.source_event_ids)
        if e.revision > first.revision:
            folded[key] = (e, amounts, sources)  # the latest revision carries current metadata
    return [(e, a, len(s)) for _, (e, a, s) in sorted(folded.items())]


def focus_rows(entries: Iterable[CostEntry], ctx: FocusContext | None = None) -> list[dict]:
    """FOCUS 1.2 rows (dicts keyed by column ID), in a stable order."""
    ctx = ctx or FocusContext()
    rows = []
    for e, a, n_sources in _fold(entries):
        if a.is_zero():
            continue
        period_start, period_end = _month_bounds(e.window_start_ms)
        idle = e.kind == "idle"
        tags = {"allocation": "__idle__"} if idle else {"job": e.job_id, "tenant": e.tenant}
        tags["pricing_tier"] = e.pricing_tier
        gpu_hours = usd_from_micro(a.gpu_hours_micro)
        common = {
            "BillingAccountId": ctx.billing_account_id,
            "BillingAccountName": ctx.billing_account_name,
            "BillingCurrency": ctx.currency,
            "BillingPeriodStart": period_start,
            "BillingPeriodEnd": period_end,
            "ChargeCategory": "Usage",
            "ChargeClass": "",
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodStart": _iso(e.window_start_ms),
            "ChargePeriodEnd": _iso(e.window_end_ms),
            "InvoiceIssuerName": ctx.invoice_issuer_name,
            "ProviderName": ctx.provider_name,
            "PublisherName": ctx.publisher_name,
            "ServiceCategory": ctx.service_category,
            "ServiceName": ctx.service_name,
            "PricingCategory": _PRICING_CATEGORY.get(e.pricing_tier, "Other"),
            "ResourceId": e.node,
            "ResourceName": e.node,
            "SubAccountId": "__idle__" if idle else e.tenant,
            "SubAccountName": "idle capacity" if idle else e.tenant,
            "Tags": json.dumps(tags, sort_keys=True),
            "x_GpuModel": e.gpu_model,
            "x_EnergyMillijoules": a.energy_mj,
            "x_TflopHours": _dec(a.tflop_hours_micro),
            "x_Activity": "" if e.activity_ppm is None else str(Decimal(e.activity_ppm).scaleb(-6)),
            "x_Assumptions": " ".join(e.assumptions),
            "x_SourceEventCount": n_sources,
        }
        what = "Idle GPU capacity" if idle else f"GPU time of job {e.job_id}"
        rows.append(
            {
                **common,
                "BilledCost": _dec(a.cost_usd_micro),
                "EffectiveCost": _dec(a.cost_usd_micro),
                "ContractedCost": _dec(a.cost_usd_micro),
                "ListCost": _dec(a.list_cost_usd_micro),
                "ChargeDescription": f"{what} on {e.node} ({e.gpu_model}, {e.pricing_tier})",
                "PricingQuantity": str(gpu_hours),
                "PricingUnit": "GPU-Hours",
                "ConsumedQuantity": str(gpu_hours),
                "ConsumedUnit": "GPU-Hours",
                "ListUnitPrice": _unit_price(a.list_cost_usd_micro, a.gpu_hours_micro),
                "ContractedUnitPrice": _unit_price(a.cost_usd_micro, a.gpu_hours_micro),
                "ResourceType": "GPU",
                "SkuId": f"gpu-{e.gpu_model}-{e.pricing_tier}",
            }
        )
        if a.energy_usd_micro:
            kwh = Decimal(a.energy_mj) / Decimal(3_600_000_000)
            rows.append(
                {
                    **common,
                    "BilledCost": _dec(a.energy_usd_micro),
                    "EffectiveCost": _dec(a.energy_usd_micro),
                    "ContractedCost": _dec(a.energy_usd_micro),
                    "ListCost": _dec(a.energy_usd_micro),
                    "ChargeDescription": f"Measured GPU energy: {what.lower()} on {e.node}",
                    "PricingQuantity": f"{kwh:.6f}",
                    "PricingUnit": "kWh",
                    "ConsumedQuantity": f"{kwh:.6f}",
                    "ConsumedUnit": "kWh",
                    "ListUnitPrice": "",
                    "ContractedUnitPrice": "",
                    "ResourceType": "GPU energy",
                    "SkuId": "gpu-energy",
                }
            )
    return rows


def _unit_price(cost_micro: int, qty_micro: int) -> str:
    if qty_micro == 0:
        return ""
    return f"{Decimal(cost_micro) / Decimal(qty_micro):.6f}"


def focus_csv(entries: Iterable[CostEntry], ctx: FocusContext | None = None) -> str:
    """FOCUS 1.2 rows as CSV with the spec's column IDs as the header."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FOCUS_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(focus_rows(entries, ctx))
    return buf.getvalue()
