"""Ending background tasks for certain.

nats-py swallows a ``CancelledError`` that lands inside its publish path
(``Client._flush_pending`` catches it and returns), so one ``task.cancel()`` may be lost: a
``while True`` loop that publishes (a lease refresh, a heartbeat, a KV put) then runs on, and
whatever awaits it (a ``TaskGroup``, a ``stop``) waits forever. ``cancel_until_done`` repeats
the request until each task has ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")

__all__ = ["cancel_until_done", "cancel_until_done_shielded", "guarded"]


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


async def guarded(work: Awaitable[_T], guard: Awaitable[None]) -> _T:
    """``work``'s result, run while ``guard`` runs (a lease's keeper: it runs until cancelled,
    and both are ended, for certain, when this returns or raises). A guard that ends first
    ends ``work`` (cancelled) and its error is raised here: a replica whose lease keeper died
    once stood by silently for good, never trying the key again."""
    keeper = asyncio.ensure_future(guard)
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait((keeper, task), return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        await cancel_until_done_shielded((task,))
        keeper.result()  # its error
        raise RuntimeError("the guard of a task ended before it")
    finally:
        # A keeper publishes: a cancel can be lost; and the caller may be cancelled again.
        await cancel_until_done_shielded((task, keeper))
