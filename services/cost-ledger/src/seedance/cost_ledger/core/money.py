"""Exact money: integer micro-dollars and the one rounding rule.

Owns the conversion between exact rationals (``fractions.Fraction``) and the integer
micro-dollars every cost entry carries. Floats never hold money here: a total must be the same
bit for bit on every replica and in every recomputation, and float sums depend on order.

Rule: an amount is computed exactly as a Fraction and rounded once, half to even, to whole
micro-dollars (1 USD = 1,000,000 µUSD) at the level of one cost line. Sums of lines are
integer sums, so they are exact and order-independent.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

__all__ = [
    "MICRO_PER_USD",
    "format_usd",
    "micro_from_usd",
    "round_micro",
    "usd_from_micro",
]

MICRO_PER_USD = 1_000_000


def round_micro(amount_usd: Fraction) -> int:
    """Round an exact USD amount to integer micro-dollars, half to even."""
    # round() on a Fraction is exact and rounds half to even, unlike float rounding.
    return round(amount_usd * MICRO_PER_USD)


def micro_from_usd(value: str | int | Decimal | Fraction) -> int:
    """Parse a USD amount given as text or an exact number into micro-dollars."""
    return round_micro(Fraction(value))


def usd_from_micro(micro: int) -> Decimal:
    """Micro-dollars as an exact Decimal in USD (six decimal places)."""
    return Decimal(micro).scaleb(-6)


def format_usd(micro: int, places: int = 2) -> str:
    """Human text for reports, e.g. ``1234567`` → ``"1.23"``; never used for arithmetic."""
    quantum = Decimal(1).scaleb(-places)
    return str(usd_from_micro(micro).quantize(quantum))
