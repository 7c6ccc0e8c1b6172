"""Ending background tasks for certain.

nats-py swallows a ``CancelledError`` that lands inside its publish path
(``Client._flush_pending`` catches it and returns), so one ``task.cancel()`` may be lost: a
``while True`` loop that publishes (a lease refresh, a heartbeat, a KV put) then runs on, and
whatever awaits it (a ``TaskGroup``, a ``stop``) waits forever. ``cancel_until_done`` repeats
the request until each task has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_until_done", "cancel_until_done_shielded"]


async def cancel_until_done(
    tasks: Iterable[asyncio.Future[Any] | None], every_s: float = 0.5
) -> None:
    """Cancel ``tasks`` (None entries skipped) and wait until every one has ended, cancelling
    again every ``every_s`` those still running. Their results and errors stay on them (a
    ``TaskGroup`` still sees a child's error)."""
    pending = [t for t in tasks if t is not None and not t.done()]
    while pending:
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=every_s)
        pending = [t for t in pending if not t.done()]


async def cancel_until_done_shielded(
    tasks: Iterable[asyncio.Future[Any] | None], every_s: float = 0.5
) -> None:
    """`cancel_until_done`, which a cancel of the caller cannot interrupt: for a ``finally``
    that must not leave a task running when the caller is itself cancelled again and again
    (`cancel_until_done` re-cancels every ``every_s``). Every task has ended when it returns;
    a cancel that came meanwhile is raised then."""
    waited = list(tasks)
    cancelled = False
    while True:
        try:
            await cancel_until_done(waited, every_s)
        except asyncio.CancelledError:
            cancelled = True
            continue
        break
    if cancelled:
        raise asyncio.CancelledError
