"""Time, injected: the wall clock for services, a virtual twin for tests and trace replay.

The only module allowed to read the wall clock; everything else gets a ``Clock``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Protocol

__all__ = ["WALL_CLOCK", "Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; never goes back."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


#: The real clock, for the defaults of constructors whose callers may leave time uninjected
#: (``Bus.connect(settings)``); tests and replays pass a ``VirtualClock`` instead.
WALL_CLOCK: Clock = WallClock()


class VirtualClock:
    """A clock that moves only when told to. ``sleep`` returns once time has been advanced."""

    def __init__(self, start: datetime | None = None) -> None:
        self._t0 = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed_s = 0.0
        self._changed = asyncio.Condition()

    def now(self) -> datetime:
        from datetime import timedelta

        return self._t0 + timedelta(seconds=self._elapsed_s)

    def monotonic(self) -> float:
        return self._elapsed_s

    async def advance(self, seconds: float) -> None:
        async with self._changed:
            self._elapsed_s += seconds
            self._changed.notify_all()

    async def sleep(self, seconds: float) -> None:
        wake_at = self._elapsed_s + seconds
        async with self._changed:
            await self._changed.wait_for(lambda: self._elapsed_s >= wake_at)
