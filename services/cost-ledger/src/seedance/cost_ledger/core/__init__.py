"""The cost-ledger's pure core: prices, attribution, budgets. No NATS, no clock, no files
except the price book the caller asks to load."""

from seedance.cost_ledger.core.budget import (
    Budget,
    BudgetAlert,
    BudgetDecision,
    PauseRequest,
    SpendPoint,
    evaluate_budget,
    plan_usd_micro,
    spend_points,
)
from seedance.cost_ledger.core.idle import IdleShare, apportion, share_idle
from seedance.cost_ledger.core.ledger import (
    Amounts,
    CostEntry,
    GpuSample,
    JobCostReport,
    JobEnded,
    Ledger,
    LedgerConfig,
    LedgerInput,
    LedgerInputError,
    LedgerTotals,
    NodeInfo,
    Placement,
    recompute,
    usd_per_tflop_hour_micro,
)
from seedance.cost_ledger.core.money import format_usd, micro_from_usd, round_micro
from seedance.cost_ledger.core.peaks import PEAK_TFLOPS, PeakTflops
from seedance.cost_ledger.core.pricebook import (
    GpuPrice,
    PriceBook,
    PriceBookError,
    default_price_book,
    load_price_book,
    parse_price_book,
)
from seedance.cost_ledger.core.windows import emission_due, epoch_ms, next_emission_ms

__all__ = [
    "PEAK_TFLOPS",
    "Amounts",
    "Budget",
    "BudgetAlert",
    "BudgetDecision",
    "CostEntry",
    "GpuPrice",
    "GpuSample",
    "IdleShare",
    "JobCostReport",
    "JobEnded",
    "Ledger",
    "LedgerConfig",
    "LedgerInput",
    "LedgerInputError",
    "LedgerTotals",
    "NodeInfo",
    "PauseRequest",
    "PeakTflops",
    "Placement",
    "PriceBook",
    "PriceBookError",
    "SpendPoint",
    "apportion",
    "default_price_book",
    "emission_due",
    "epoch_ms",
    "evaluate_budget",
    "format_usd",
    "load_price_book",
    "micro_from_usd",
    "next_emission_ms",
    "parse_price_book",
    "plan_usd_micro",
    "recompute",
    "round_micro",
    "share_idle",
    "spend_points",
    "usd_per_tflop_hour_micro",
]
