"""Exact money: integer micro-dollars and the one rounding rule.

Owns the conversion between exact rationals (``fractions.Fraction``) and the integer
micro-dollars every cost entry carries. Floats never hold money here: a total must be the same
bit for bit on every replica and in every recomputation, and float sums depend on order.

Rule: an amount is computed exactly as a Fraction and rounded once, half to even, to whole
micro-dollars (1 USD = 1,000,000 µUSD) at the level of one cost line. Sums of lines are
integer sums, so they are exact and order-independent.

Also owns the exact-rational arithmetic the attribution runs on (``Rational``, ``RatioSum``,
``round_ratio``, ``round_product``): the same rounding rule, kept cheap on whole numbers.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

__all__ = [
    "MICRO_PER_USD",
    "RatioSum",
    "Rational",
    "format_usd",
    "micro_from_usd",
    "round_micro",
    "round_product",
    "round_ratio",
    "usd_from_micro",
]

MICRO_PER_USD = 1_000_000

# An exact rational: a Fraction, or an int where the value is whole. Whole-GPU time in integer
# milliseconds is most of a fleet's, and int arithmetic is ~10x cheaper than Fraction's, so the
# core keeps ints until a fraction enters (Python's int/Fraction arithmetic is exact; only ``/``
# between two ints would give a float, so no ``/`` in the core has two int operands).
Rational = int | Fraction


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


def round_ratio(num: int, den: int) -> int:
    """``round(num / den)`` exactly, half to even (as ``round`` of a Fraction), for ``den > 0``."""
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q % 2):
        q += 1
    return q


def round_product(x: Rational, f: Fraction) -> int:
    """``round(x · f)`` exactly, half to even, without building a Fraction when ``x`` is whole."""
    if type(x) is int:
        return round_ratio(x * f.numerator, f.denominator)
    return round(x * f)


class RatioSum:
    """An exact sum of terms ``num / den``, kept as integer numerators per denominator.

    The terms of one line (a GPU's activity, its share of delivered TFLOPs) mostly share one
    denominator (the number of samples in the window, the window's length), so summing them is
    integer addition; Fractions are formed only when the sum is read, once per denominator.
    """

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: dict[int, int] = {}

    def add(self, num: int, den: int) -> None:
        self.parts[den] = self.parts.get(den, 0) + num

    def add_rational(self, x: Rational) -> None:
        if isinstance(x, int):
            self.add(x, 1)
        else:
            self.add(x.numerator, x.denominator)

    def round_scaled(self, scale: int, divisor: int = 1) -> int:
        """``round(Σ · scale / divisor)`` exactly, half to even (0 for an empty sum)."""
        if not self.parts:
            return 0
        if len(self.parts) == 1:
            ((den, num),) = self.parts.items()
            return round_ratio(num * scale, den * divisor)
        total = sum((Fraction(num, den) for den, num in self.parts.items()), Fraction(0))
        return round(total * scale / divisor)
