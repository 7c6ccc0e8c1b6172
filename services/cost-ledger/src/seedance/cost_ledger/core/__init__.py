"""The cost-ledger's pure core: prices, facts, attribution, the ledger and its snapshot,
budgets, the replica's step function and the one wire mapping. No NATS, no clock, no files
except the price book the caller asks to load.

Modules: ``money`` (exact rationals, micro-dollars), ``pricebook`` / ``booktoml`` / ``peaks``
(prices), ``facts`` (what is billed), ``attribution`` (one node-window's lines), ``lines`` (what is
emitted), ``ledger`` (the state machine), ``snapshot`` (its bytes), ``budget``,
``mapping`` (bus events ↔ core), ``replica`` (the deterministic step over the merged stream),
``rightsizing`` (the smallest request that covers a job's measured peak, and its saving)."""

from seedance.cost_ledger.core.booktoml import (
    default_price_book,
    load_price_book,
    parse_price_book,
)
from seedance.cost_ledger.core.budget import (
    Budget,
    BudgetDecision,
    BudgetDeviation,
    PauseDecision,
    SpendPoint,
    evaluate_budget,
    plan_usd_micro,
    spend_points,
)
from seedance.cost_ledger.core.config import LedgerConfig
from seedance.cost_ledger.core.facts import (
    GpuAllocation,
    GpuSample,
    JobEnded,
    LedgerInput,
    LedgerInputError,
    NodeInfo,
)
from seedance.cost_ledger.core.ledger import Ledger, recompute
from seedance.cost_ledger.core.lines import (
    Amounts,
    CostLine,
    JobCost,
    LedgerOutput,
    LedgerTotals,
    LineUse,
    usd_per_tflop_hour_micro,
)
from seedance.cost_ledger.core.money import format_usd, micro_from_usd, round_micro
from seedance.cost_ledger.core.peaks import PEAK_TFLOPS, PeakTflops
from seedance.cost_ledger.core.pricebook import (
    GpuPrice,
    PriceBook,
    PriceBookError,
    PriceLookup,
    price_summary,
)
from seedance.cost_ledger.core.rightsizing import BookRightsizer, recommend, recommend_all
from seedance.cost_ledger.core.windows import emission_due, epoch_ms, next_emission_ms

__all__ = [
    "PEAK_TFLOPS",
    "Amounts",
    "BookRightsizer",
    "Budget",
    "BudgetDecision",
    "BudgetDeviation",
    "CostLine",
    "GpuAllocation",
    "GpuPrice",
    "GpuSample",
    "JobCost",
    "JobEnded",
    "Ledger",
    "LedgerConfig",
    "LedgerInput",
    "LedgerInputError",
    "LedgerOutput",
    "LedgerTotals",
    "LineUse",
    "NodeInfo",
    "PauseDecision",
    "PeakTflops",
    "PriceBook",
    "PriceBookError",
    "PriceLookup",
    "SpendPoint",
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
    "price_summary",
    "recommend",
    "recommend_all",
    "recompute",
    "round_micro",
    "spend_points",
    "usd_per_tflop_hour_micro",
]
