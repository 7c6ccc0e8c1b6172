"""The allocation API as the SDK asks it: the request, and its refusals as exceptions.

Owns turning ``SeedanceClient.allocation``'s reply into an ``AllocationAnswer`` or an
exception that says what to fix (a parameter the ledger refused, no ledger answering, none in
time), and the plain-text table the CLI prints. Must not compute a figure: the ledger answers
(``seedance.reports.allocation``).

The ledger answers a request only under its scope's own inbox (``api.reply_prefix``): a
tenant's connection asks its own over its own inbox, an operator the fleet's over its
``_INBOX``; an operator asking a tenant's listens under that tenant's inbox (`ask`).
"""

from __future__ import annotations

import contextlib
import uuid
from decimal import Decimal

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

from seedance.core.errors import SeedanceError
from seedance.events import DecodeError, decode
from seedance.events.allocation import AllocationAnswer, AllocationRefusal, AllocationReply
from seedance.events.subjects import api
from seedance.reports.rightsizing import rightsizing_text

__all__ = ["AllocationRefused", "NoLedger", "allocation_text", "ask", "read_reply"]


class AllocationRefused(SeedanceError, ValueError):
    """The ledger refused the query; ``parameter`` names what is wrong (``window``,
    ``aggregate``, ``include_idle``), or ``ledger`` when it cannot answer yet."""

    def __init__(self, refusal: AllocationRefusal) -> None:
        super().__init__(f"allocation refused ({refusal.parameter}): {refusal.message}")
        self.parameter = refusal.parameter
        self.refusal = refusal


class NoLedger(SeedanceError):
    """No cost-ledger subscribed to the allocation subject (is one running?)."""


async def ask(
    nc: Client, subject: str, payload: bytes, tenant: str | None, timeout_s: float
) -> Msg:
    """One request on ``subject`` (``tenant``'s scope, the fleet's for None) whose answer comes
    under the scope's own inbox (``api.reply_prefix``, where alone the ledger answers): through
    the connection's own request inbox where that is it, else (an operator asking a tenant's)
    a one-message subscription there.

    Raises ``nats.errors.NoRespondersError`` and ``nats.errors.TimeoutError`` as ``request``."""
    reply_prefix = api.reply_prefix(api.FLEET if tenant is None else tenant)
    own_prefix = nc.new_inbox().rpartition(".")[0]  # the connection's inbox prefix, publicly
    if f"{own_prefix}." == reply_prefix:
        return await nc.request(subject, payload, timeout=timeout_s)
    inbox = f"{reply_prefix}{uuid.uuid4().hex}"
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, payload, reply=inbox)
        msg = await sub.next_msg(timeout=timeout_s)
    finally:
        with contextlib.suppress(nats.errors.Error):  # gone after its one message
            await sub.unsubscribe()
    if msg.headers and msg.headers.get("Status") == "503":
        raise nats.errors.NoRespondersError
    return msg


def read_reply(data: bytes) -> AllocationAnswer:
    """The answer in a reply; ``AllocationRefused`` for a refusal."""
    try:
        reply = decode(data, AllocationReply)
    except DecodeError as exc:
        raise SeedanceError(f"the ledger's reply is not an allocation answer: {exc}") from None
    if isinstance(reply, AllocationRefusal):
        raise AllocationRefused(reply)
    return reply


def _usd(micro: int) -> str:
    return f"${Decimal(micro).scaleb(-6).quantize(Decimal('0.01')):,}"


def allocation_text(a: AllocationAnswer) -> str:
    """The answer as a table for a terminal (``--json`` prints the answer itself)."""
    idle = a.include_idle or a.share_idle
    out = [
        f"allocation of {'the fleet' if a.scope == 'fleet' else 'tenant ' + a.scope} by "
        f"{a.aggregate}, window {a.window}, as of {a.stream} sequence {a.as_of_seq} "
        f"({a.lines} lines)",
        f"{'name':<40} {'GPU-h':>10} {'allocated':>14}" + (f" {'idle':>14}" if idle else "")
        + f" {'total':>14}",
    ]  # fmt: skip
    out.extend(
        f"{r.name:<40} {(r.gpu_hours_micro + r.idle_gpu_hours_micro) / 1e6:>10,.2f} "
        f"{_usd(r.cost_usd_micro + r.energy_usd_micro):>14}"
        + (f" {_usd(r.idle_usd_micro):>14}" if idle else "")
        + f" {_usd(r.total_usd_micro):>14}"
        for r in [*a.allocations, a.totals]
    )
    if not a.allocations:
        out.append(f"(no cost in the window {a.window})")
    text = "\n".join(out) + "\n"
    if a.rightsizing_rule:
        text += rightsizing_text(a.rightsizing, a.rightsizing_rule)
    return text
