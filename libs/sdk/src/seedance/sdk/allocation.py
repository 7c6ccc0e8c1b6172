"""The allocation API as the SDK asks it: the request, and its refusals as exceptions.

Owns turning ``SeedanceClient.allocation``'s reply into an ``AllocationAnswer`` or an
exception that says what to fix (a parameter the ledger refused, no ledger answering, none in
time), and the plain-text table the CLI prints. Must not compute a figure: the ledger answers
(``seedance.reports.allocation``).
"""

from __future__ import annotations

from decimal import Decimal

from seedance.core.errors import SeedanceError
from seedance.events import DecodeError, decode
from seedance.events.allocation import AllocationAnswer, AllocationRefusal, AllocationReply

__all__ = ["AllocationRefused", "NoLedger", "allocation_text", "read_reply"]


class AllocationRefused(SeedanceError, ValueError):
    """The ledger refused the query; ``parameter`` names what is wrong (``window``,
    ``aggregate``, ``include_idle``), or ``ledger`` when it cannot answer yet."""

    def __init__(self, refusal: AllocationRefusal) -> None:
        super().__init__(f"allocation refused ({refusal.parameter}): {refusal.message}")
        self.parameter = refusal.parameter
        self.refusal = refusal


class NoLedger(SeedanceError):
    """No cost-ledger subscribed to the allocation subject (is one running?)."""


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
    return "\n".join(out) + "\n"
