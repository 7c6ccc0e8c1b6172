"""``python -m seedance.cost_ledger``: load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.cost_ledger.service import LedgerService
from seedance.cost_ledger.settings import LedgerSettings
from seedance.cost_ledger.state import PriceBook

NAME = "cost-ledger"

#: Foundation price book: on-demand $/GPU-hour (micro-dollars), to be replaced by the price-book
#: file of the cost-ledger issue.
DEFAULT_PRICES = PriceBook(
    micro_usd_per_gpu_hour={
        "P100": 1_460_000,
        "T4": 350_000,
        "V100M16": 2_480_000,
        "V100M32": 2_480_000,
        "A10": 1_010_000,
        "G1": 2_480_000,
        "G2": 2_480_000,
        "G3": 2_480_000,
    }
)


def main() -> None:
    settings = load_settings(LedgerSettings, NAME)
    configure_logging()
    configure_tracing(NAME)
    runtime = ServiceRuntime(NAME, bus_settings(NAME), http_port=settings.http_port)
    service = LedgerService(
        runtime, DEFAULT_PRICES, state_key=settings.state_key, batch=settings.batch
    )
    asyncio.run(serve(service))


if __name__ == "__main__":
    main()
