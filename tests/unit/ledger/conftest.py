"""Fixtures for the cost-ledger unit tests: a price book with round numbers."""

from __future__ import annotations

import pytest

from seedance.cost_ledger.core import PriceBook, parse_price_book

# Round prices so hand-computed expectations stay readable: X costs $2/GPU-hour on demand,
# on-prem 43,800 USD over 5 years with no overhead = $1/GPU-hour.
BOOK_TOML = """
[energy]
usd_per_kwh = "0.10"
pue = "1.5"

[gpu.X]
source = "test"
on_demand_usd_per_hour = "2"
reserved_usd_per_hour = "1.5"
spot_usd_per_hour = "0.5"
purchase_usd = "43800"
lifetime_years = "5"
hosting_overhead_fraction = "0"
mig_memory_gb = 80
peak_fp16_dense_tflops = "100"
peak_fp32_tflops = "10"
peak_source = "test"
peak_assumed = false

[gpu.Y]
source = "assumption"
price_assumed = true
on_demand_usd_per_hour = "1"
reserved_usd_per_hour = "1"
spot_usd_per_hour = "1"
purchase_usd = "1000"
lifetime_years = "1"
hosting_overhead_fraction = "0"
"""

HOUR_MS = 3_600_000


@pytest.fixture
def book() -> PriceBook:
    return parse_price_book(BOOK_TOML)
