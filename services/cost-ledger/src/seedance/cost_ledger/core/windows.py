"""Charge windows and the decision of when a running job's periodic entry is due.

Owns the arithmetic of aligned charge windows: window ``w`` covers ``[w·W, (w+1)·W)`` in epoch
milliseconds (UTC), so every replica and every recomputation cuts time at the same instants.
A window is closed, and its entries emitted, once ``now ≥ end + lateness``: the lateness lets
samples that travel slower than the clock arrive before the first emission. Must not read a
clock: ``now_ms`` is always passed in.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

__all__ = [
    "closable_until",
    "emission_due",
    "epoch_ms",
    "next_emission_ms",
    "window_bounds_ms",
    "window_of",
]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_ms(t: datetime) -> int:
    """A timezone-aware datetime as integer epoch milliseconds (naive datetimes are refused:
    the ledger is UTC throughout and a naive time has no defined instant)."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"datetime {t.isoformat()!r} is naive: give it a timezone (UTC)")
    # Integer arithmetic on the timedelta, not float timestamp(): exact to the microsecond.
    return (t - _EPOCH) // timedelta(milliseconds=1)


def window_of(t_ms: int, window_ms: int) -> int:
    """Index of the window that holds instant ``t_ms``."""
    return t_ms // window_ms


def window_bounds_ms(w: int, window_ms: int) -> tuple[int, int]:
    """``[start, end)`` of window ``w`` in epoch milliseconds."""
    return w * window_ms, (w + 1) * window_ms


def closable_until(now_ms: int, window_ms: int, lateness_ms: int) -> int:
    """First window index that may not be closed yet at ``now_ms`` (all below may)."""
    return max(0, (now_ms - lateness_ms) // window_ms)


def emission_due(closed_until: int | None, now_ms: int, window_ms: int, lateness_ms: int) -> bool:
    """Whether advancing the ledger at ``now_ms`` would close at least one new window."""
    if closed_until is None:
        return True
    return closable_until(now_ms, window_ms, lateness_ms) > closed_until


def next_emission_ms(closed_until: int | None, window_ms: int, lateness_ms: int) -> int | None:
    """The earliest ``now_ms`` at which the next window can be closed (None: nothing yet)."""
    if closed_until is None:
        return None
    return (closed_until + 1) * window_ms + lateness_ms
