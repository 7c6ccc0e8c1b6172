"""``seedance-cost-ledger``: serve the ledger (default), ``report`` costs, ``rightsize`` jobs, or
print what a GPU name is billed at (``prices``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from seedance.core import ServiceRuntime, serve
from seedance.core.entry import start_service
from seedance.cost_ledger import core
from seedance.cost_ledger.allocation_api import AllocationApi
from seedance.cost_ledger.core.replica import LedgerReplica
from seedance.cost_ledger.service import LedgerService
from seedance.cost_ledger.settings import LedgerSettings, load_budgets, replica_name

NAME = "cost-ledger"
SUMMARY = (
    "The cost ledger: attributes GPU time, slices, energy and idle to tenants and jobs, "
    "exactly once, publishes cost entries, reports and budget alerts, and answers allocation "
    "queries. Replicas share one durable consumer; its state lives in JetStream KV."
)
#: The sub-commands ``main`` dispatches before serving (each answers its own ``--help``).
COMMANDS = {
    "(none)": "serve the ledger",
    "prices --gpu-model NAME": "what a GPU name is billed at, for any name a system reports",
    "report (--tenant T | --fleet)": "render the costs the stream holds (html, text, csv, focus)",
    "rightsize (--tenant T | --fleet)": "right-sizing recommendations from measured use",
}


def report(argv: list[str], *, rightsize_only: bool = False, logs: bool = False) -> int:
    """``seedance-cost-ledger report (--tenant T | --fleet) [--format html|text|csv|focus]
    [--from ISO] [--to ISO] [--by tenant|job|node|gpu_model] [--share-idle] [--rightsize]
    [--price-book FILE] [--out FILE]``, and the ``seedance`` CLI's connection flags.

    Reads what the cost stream holds (a tenant's own with its credentials; the fleet's, idle
    included, with an operator's) and renders it with the reports library, so the
    figures match the ledger's to the cent. The same as ``seedance costs report``: both read
    through ``seedance.sdk.reports`` and render with ``seedance.reports``; ``--rightsize``
    (text and HTML) adds the right-sizing recommendations, priced with the ledger's price book
    (``--price-book``, else ``SEEDANCE_COST_LEDGER_PRICE_BOOK``, else the bundled one), which
    is why it is here. ``seedance-cost-ledger rightsize ...`` prints only those.

    Logs in and fails as the ``seedance`` CLI does (``seedance.sdk.cli.execute``): ``NATS_URL``,
    ``NATS_USER`` / ``NATS_PASSWORD`` (else ``NATS_PASSWORD_FILE``) or ``NATS_CREDS``,
    ``SEEDANCE_CONNECT_TIMEOUT_S`` (or their flags), and one line on stderr for a failure.
    Exits 1 when there is nothing in the window or idle was asked for without operator
    credentials, 2 on a bad request, price book or password file, 69 when no NATS answers
    within the connect timeout, 77 when it refuses the credentials, 73 when ``--out`` cannot be
    created, 74 when it or stdout cannot be written, 141 (and nothing on stderr) when stdout's
    reader went away. ``logs``: set this process's logging as the console script does
    (``main``).
    """
    from seedance.reports import ReportWindow, job_uses, rightsizing_text
    from seedance.sdk import SeedanceClient
    from seedance.sdk.cli import execute, fail, quiet_logging
    from seedance.sdk.cli_output import write_file
    from seedance.sdk.reports import render_report, report_lines

    prog = "seedance-cost-ledger " + ("rightsize" if rightsize_only else "report")
    args = _report_args(prog, rightsize_only).parse_args(argv)
    if rightsize_only:
        args.format, args.rightsize, args.by, args.share_idle = "rightsize", True, "job", False
    if logs:
        quiet_logging(args)
    try:
        book = core.load_price_book(args.price_book) if args.price_book else None
    except (OSError, core.PriceBookError) as exc:
        return fail(prog, exc, 2)
    sizer = core.BookRightsizer(book or core.default_price_book()) if args.rightsize else None

    async def render(client: SeedanceClient, args: argparse.Namespace) -> int:
        tenant = None if args.fleet else args.tenant
        try:
            if rightsize_only and sizer is not None:
                window = ReportWindow.parse(args.start, args.end)
                uses = job_uses(
                    await report_lines(client, tenant=tenant), window=window, tenant=tenant
                )
                if not uses:
                    raise LookupError(f"no job with measured use in {window.label()}")
                text, n = rightsizing_text(sizer.recommend_all(uses), sizer.rule), len(uses)
            else:
                text, n = await render_report(
                    client,
                    tenant=tenant,
                    fmt=args.format,
                    start=args.start,
                    end=args.end,
                    by=args.by,
                    share_idle=args.share_idle,
                    rightsizer=sizer,
                )
        except LookupError as exc:
            # The reports' contract: a report that cannot be made (nothing in the window, idle
            # without operator credentials) is a LookupError; a bad request a ValueError (2).
            return fail(prog, exc.args[0] if exc.args else exc, 1)
        if args.out is None:
            sys.stdout.write(text)
        else:
            write_file(args.out, text)  # 73/74 and one line when it cannot be written
            what = (
                f"{n} jobs' recommendations"
                if rightsize_only
                else f"{n} cost lines as {args.format}"
            )
            sys.stderr.write(f"wrote {what} to {args.out}\n")
        return 0

    return execute(prog, args, render)


def _report_args(prog: str, rightsize_only: bool) -> argparse.ArgumentParser:
    """The options of ``report`` (``rightsize``: without format, grouping and idle sharing)."""
    from seedance.reports import FORMATS, GROUPS
    from seedance.sdk.cli_args import connection_args

    p = argparse.ArgumentParser(prog=prog, description=report.__doc__)
    scope = p.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant")
    scope.add_argument("--fleet", action="store_true")
    if not rightsize_only:
        p.add_argument("--format", choices=FORMATS, default="html")
        p.add_argument("--rightsize", action="store_true", help="add right-sizing (text, html)")
        p.add_argument("--by", choices=GROUPS, default="tenant")
        p.add_argument("--share-idle", action="store_true")
    p.add_argument("--price-book", default=os.environ.get("SEEDANCE_COST_LEDGER_PRICE_BOOK"))
    p.add_argument("--out", type=Path, default=None, help="file to write (default: stdout)")
    p.add_argument("--from", dest="start", default=None, help="ISO 8601 start, UTC (inclusive)")
    p.add_argument("--to", dest="end", default=None, help="ISO 8601 end, UTC (exclusive)")
    connection_args(p)  # the `seedance` CLI's: NATS_USER / NATS_PASSWORD log in here too
    return p


def prices(argv: list[str]) -> int:
    """``seedance-cost-ledger prices --gpu-model NAME [--gpu-model NAME ...] [--price-book FILE]``:
    one line per name, ``model=<canonical|unknown> on_demand=<usd/h> reserved=<..> spot=<..>
    on_prem=<..> assumed=<true|false> fallback=<true|false>``, for any name a system reports
    (NVML, GPU feature discovery, a cloud, a trace). The book is ``--price-book``, else
    ``SEEDANCE_COST_LEDGER_PRICE_BOOK``, else the bundled one. Exit 2 on a bad price book (named
    on stderr); a name no GPU can be (``... MIG 7g.10gb`` on an 80 GB A100) is ``unknown``."""
    p = argparse.ArgumentParser(prog="seedance-cost-ledger prices", description=prices.__doc__)
    p.add_argument("--gpu-model", action="append", required=True, metavar="NAME")
    p.add_argument("--price-book", default=os.environ.get("SEEDANCE_COST_LEDGER_PRICE_BOOK"))
    args = p.parse_args(argv)
    try:
        book = core.load_price_book(args.price_book) if args.price_book else None
    except (OSError, core.PriceBookError) as exc:
        sys.stderr.write(f"seedance-cost-ledger prices: {exc}\n")
        return 2
    book = book or core.default_price_book()
    for name in args.gpu_model:  # any name is priced: one no GPU can be at the fallback
        sys.stdout.write(core.price_summary(book.lookup(name)) + "\n")
    return 0


def main() -> int | None:
    if sys.argv[1:2] == ["prices"]:
        return prices(sys.argv[2:])
    if sys.argv[1:2] == ["report"]:
        return report(sys.argv[2:], logs=True)
    if sys.argv[1:2] == ["rightsize"]:
        return report(sys.argv[2:], rightsize_only=True, logs=True)
    settings, bus = start_service(
        NAME, LedgerSettings, summary=SUMMARY, argv=sys.argv[1:], commands=COMMANDS
    )
    book = core.load_price_book(settings.price_book) if settings.price_book else None
    replica = LedgerReplica(
        book or core.default_price_book(),
        settings.ledger_config(),
        budgets=load_budgets(settings.budgets),
        tenants=settings.tenant_set(),
        max_ahead_s=settings.max_ahead_s,
        telemetry_ahead_s=settings.telemetry_ahead_s,
    )
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    service = LedgerService.build(
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
    AllocationApi(
        runtime, replica=service.name, rightsizer=core.BookRightsizer(replica.book)
    )  # fmt: skip
    asyncio.run(serve(service))
    return None


if __name__ == "__main__":
    sys.exit(main())
