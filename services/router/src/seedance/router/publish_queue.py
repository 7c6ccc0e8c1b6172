"""A bounded buffer of events waiting to be published, so the request path never waits on NATS.

Owns: `PublishQueue`. The gateway's observer offers each decision (never blocking); a loop drains
it every ~100 ms into one `Bus.publish_many`. When the queue is full the newest event is dropped
and counted: losing a few decision records under overload is better than slowing requests or
growing memory without bound. Must not publish itself or read a clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["PublishQueue"]

T = TypeVar("T")


class PublishQueue(Generic[T]):
    def __init__(self, max_items: int, *, on_drop: Callable[[], None] | None = None) -> None:
        if max_items < 1:
            raise ValueError(f"max_items={max_items} must be >= 1")
        self._items: deque[T] = deque()
        self._max = max_items
        self._on_drop = on_drop
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def offer(self, item: T) -> bool:
        """Append `item`; False (and counted) if the queue is full."""
        if len(self._items) >= self._max:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            return False
        self._items.append(item)
        return True

    def drain(self, max_items: int | None = None) -> list[T]:
        """Take up to `max_items` (default all) from the head, oldest first."""
        n = len(self._items) if max_items is None else min(max_items, len(self._items))
        return [self._items.popleft() for _ in range(n)]
