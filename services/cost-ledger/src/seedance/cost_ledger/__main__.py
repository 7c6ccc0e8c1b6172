"""``seedance-cost-ledger``: serve the ledger (default), or ``report`` a tenant's costs."""

from __future__ import annotations

import asyncio
import sys

from seedance.core import ServiceRuntime, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import SettingsError, bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.cost_ledger import core
from seedance.cost_ledger.allocation_api import AllocationApi
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.cost_ledger.settings import LedgerSettings, load_budgets, replica_name

NAME = "cost-ledger"


def report(argv: list[str]) -> int:
    """``seedance-cost-ledger report (--tenant T | --fleet) [--format html|text|csv|focus]
    [--from ISO] [--to ISO] [--by tenant|job|node|gpu_model] [--share-idle] [--out FILE]``.

    Reads what the cost stream holds (a tenant's own with its credentials; the fleet's, idle
    included, with an operator's) and renders it with the reports library, so the
    figures match the ledger's to the cent. The same as ``seedance costs report``: both read
    through ``seedance.sdk.reports`` and render with ``seedance.reports``. Exits 1 when
    there is nothing in the window or idle was asked for without operator credentials.
    """
    import argparse
    import os
    from pathlib import Path

    from seedance.reports import FORMATS, GROUPS
    from seedance.sdk import SeedanceClient
    from seedance.sdk.reports import render_report

    p = argparse.ArgumentParser(prog="seedance-cost-ledger report", description=report.__doc__)
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant")
    scope.add_argument("--fleet", action="store_true")
    p.add_argument("--format", choices=FORMATS, default="html")
    p.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    p.add_argument("--from", dest="start", default=None, help="ISO 8601 start, UTC (inclusive)")
    p.add_argument("--to", dest="end", default=None, help="ISO 8601 end, UTC (exclusive)")
    p.add_argument("--by", choices=GROUPS, default="tenant")
    p.add_argument("--share-idle", action="store_true")
    p.add_argument("--nats-url", default=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--creds", default=os.environ.get("NATS_CREDS"))
    args = p.parse_args(argv)

    async def render() -> tuple[str, int]:
        client = await SeedanceClient.connect(args.nats_url, creds=args.creds)
        async with client:
            return await render_report(
                client,
                tenant=None if args.fleet else args.tenant,
                fmt=args.format,
                start=args.start,
                end=args.end,
                by=args.by,
                share_idle=args.share_idle,
            )

    try:
        text, n = asyncio.run(render())
    except ValueError as exc:
        sys.stderr.write(f"seedance-cost-ledger report: {exc}\n")
        return 2
    except LookupError as exc:
        sys.stderr.write(f"seedance-cost-ledger report: {exc}\n")
        return 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        sys.stderr.write(f"wrote {n} cost lines as {args.format} to {args.out}\n")
    return 0


def main() -> int | None:
    if sys.argv[1:2] == ["report"]:
        return report(sys.argv[2:])
    try:
        settings = load_settings(LedgerSettings, NAME)
        bus = bus_settings(NAME)
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None  # one line naming the variable; exit status 1
    configure_logging()
    configure_tracing(NAME)
    book = core.load_price_book(settings.price_book) if settings.price_book else None
    replica = LedgerReplica(
        book or core.default_price_book(),
        settings.ledger_config(),
        budgets=load_budgets(settings.budgets),
        tenants=settings.tenant_set(),
        max_ahead_s=settings.max_ahead_s,
    )
    runtime = ServiceRuntime(NAME, bus, http_port=settings.http_port)
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
    # The allocation API runs on the same runtime, beside the replica (docs/cost-ledger.md).
    AllocationApi(runtime, replica=service.name)
    asyncio.run(serve(service))
    return None


if __name__ == "__main__":
    sys.exit(main())
