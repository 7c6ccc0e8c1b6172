"""``seedance-cost-ledger``: serve the ledger (default), or ``report`` a tenant's costs."""

from __future__ import annotations

import asyncio
import sys

from seedance.core import ServiceRuntime, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.cost_ledger import core
from seedance.cost_ledger.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.cost_ledger.settings import LedgerSettings, load_budgets, replica_name

NAME = "cost-ledger"


def main() -> None:
    settings = load_settings(LedgerSettings, NAME)
    configure_logging()
    configure_tracing(NAME)
    book = core.load_price_book(settings.price_book) if settings.price_book else None
    replica = LedgerReplica(
        book or core.default_price_book(),
        settings.ledger_config(),
        budgets=load_budgets(settings.budgets),
        tenants=settings.tenant_set(),
    )
    runtime = ServiceRuntime(NAME, bus_settings(NAME), http_port=settings.http_port)
    service = LedgerService(
        runtime,
        replica,
        name=replica_name(settings),
        checkpoint_key=settings.state_key,
        batch=settings.batch,
        checkpoint_every_events=settings.checkpoint_every_events,
        checkpoint_every_s=settings.checkpoint_every_s,
        from_start=settings.from_start,
    )
    asyncio.run(serve(service))


if __name__ == "__main__":
    sys.exit(main())
