"""Kubernetes resource quantities (``500m``, ``2``, ``1Gi``, ``1G``, ``1e3``), parsed exactly.

Owns the quantity grammar of ``k8s.io/apimachinery/pkg/api/resource`` (a signed decimal number
and one suffix: binary ``Ki Mi Gi Ti Pi Ei``, decimal ``n u m k M G T P E`` or an exponent
``e<int>``/``E<int>``) as exact rationals, and the conversions the k8s bridge and the node
agent need, rounding *up* as Kubernetes' own ``MilliValue`` / ``Value`` do, so a request is
never understated. Must not know about pods (``pod_requests`` does).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["InvalidQuantity", "parse_quantity", "to_count", "to_mib", "to_milli"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_MIB = 1 << 20


class InvalidQuantity(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """The exact value of a quantity. A JSON number (an int the API server echoed back) is
    taken as is; a float is refused, as the API server itself refuses one that is not exact."""
    if isinstance(text, bool):
        raise InvalidQuantity(f"quantity {text!r} is not a number")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        frac = Fraction(text)
        if frac.denominator != 1:
            raise InvalidQuantity(f"quantity {text!r}: write fractions as a string ('500m')")
        return frac
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise InvalidQuantity(
            f"{text!r} is not a Kubernetes quantity (a number and one suffix: "
            "Ki/Mi/Gi/Ti/Pi/Ei, n/u/m/k/M/G/T/P/E or e<exponent>)"
        )
    value = Fraction(str(m["num"]))
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        return value * (1 << (10 * _BINARY[suffix]))
    if suffix in _DECIMAL:
        return value * _pow10(_DECIMAL[suffix])
    exponent = int(suffix[1:])
    if abs(exponent) > 30:  # beyond any resource; refused before it makes a huge number
        raise InvalidQuantity(f"quantity {text!r}: exponent {exponent} is out of range")
    return value * _pow10(exponent)


def _pow10(exponent: int) -> Fraction:
    return Fraction(10**exponent) if exponent >= 0 else Fraction(1, 10**-exponent)


def to_milli(q: Fraction) -> int:
    """Thousandths, rounded up (``cpu: 1.0001`` is 1001 milli-CPUs, as Kubernetes counts it)."""
    return math.ceil(q * 1000)


def to_mib(q: Fraction) -> int:
    """Bytes to MiB, rounded up (``1G`` = 953.67 MiB is 954: a request is never understated)."""
    return math.ceil(q / _MIB)


def to_count(q: Fraction, what: str) -> int:
    """A whole count (GPUs, MIG instances); a fraction is refused naming the resource."""
    if q.denominator != 1:
        raise InvalidQuantity(f"{what}: {float(q):g} is not a whole number")
    return int(q)
