"""A tenant's or the fleet's cost report, read from the cost stream and rendered.

Owns what a report reads: a tenant's own stream (its own credentials suffice), or the fleet's
(idle included) with an operator's, and the refusal to share idle without them. The rendering
is the reports library's (``seedance.reports``), the same code the ledger's own ``report`` runs,
so the figures match the ledger's to the cent. Must not compute a figure itself.
"""

from __future__ import annotations

from seedance.core.clock import Clock, WallClock
from seedance.reports import (
    FORMATS,
    IdleNeedsOperator,
    ReportLine,
    ReportWindow,
    Rightsizer,
    lines_from_events,
    render_lines,
)
from seedance.sdk.client import PermissionRefused, SeedanceClient

__all__ = ["render_report", "report_lines"]


async def render_report(
    client: SeedanceClient,
    *,
    tenant: str | None,
    fmt: str = "html",
    start: str | None = None,
    end: str | None = None,
    by: str = "tenant",
    share_idle: bool = False,
    clock: Clock | None = None,
    rightsizer: Rightsizer | None = None,
) -> tuple[str, int]:
    """A report from what the cost stream holds, and the number of lines it covers.

    ``tenant=None`` is the fleet report (all tenants and the idle lines: operator credentials).
    A tenant's report reads the tenant's own stream and has no idle; with ``share_idle`` it
    reads the fleet instead, since the share depends on the idle lines and on the other
    tenants' allocations beside it, which a tenant may not read: with a tenant's credentials
    that is refused with ``IdleNeedsOperator``. ``start`` / ``end`` are ISO 8601 (UTC);
    ``clock`` stamps the report's "generated at". With a ``rightsizer`` (the ledger's, which
    holds the price book) the text and HTML reports end with right-sizing recommendations.

    Raises:
        EmptyReport: no cost line in the window.
        IdleNeedsOperator: ``share_idle`` without operator credentials.
        ValueError: a bad format, grouping or time.
    """
    if fmt not in FORMATS:
        raise ValueError(f"report format {fmt!r}: choose one of {', '.join(FORMATS)}")
    window = ReportWindow.parse(start, end)
    lines = await report_lines(client, tenant=tenant, share_idle=share_idle)
    now = (clock or WallClock()).now()
    return render_lines(
        lines,
        fmt=fmt,
        tenant=tenant,
        window=window,
        by=by,
        share=share_idle,
        generated_at_ms=int(now.timestamp() * 1000),
        rightsizer=rightsizer,
    )


async def report_lines(
    client: SeedanceClient, *, tenant: str | None, share_idle: bool = False
) -> list[ReportLine]:
    """The cost lines a report of ``tenant`` (None: the fleet) reads; see ``render_report``.

    Raises:
        IdleNeedsOperator: the fleet, or ``share_idle``, without operator credentials.
    """
    if tenant is None or share_idle:
        try:
            events = await client.fleet_cost_history()
        except PermissionRefused as exc:
            what = "the fleet report" if tenant is None else f"tenant {tenant}'s share of idle"
            raise IdleNeedsOperator(
                f"{what} needs operator credentials: idle lines (seedance.ledger.idle.<node>) "
                "and the allocations they are shared by are not readable with these "
                f"({exc.server_text or exc}); without --share-idle a tenant's report has its "
                "own costs and no idle"
            ) from None
    else:
        events = await client.cost_history(tenant)
    return lines_from_events(events)
