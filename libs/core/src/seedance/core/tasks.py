"""Ending background tasks for certain.

nats-py swallows a ``CancelledError`` that lands inside its publish path
(``Client._flush_pending`` catches it and returns), so one ``task.cancel()`` may be lost: a
``while True`` loop that publishes (a lease refresh, a heartbeat, a KV put) then runs on, and
whatever awaits it (a ``TaskGroup``, a ``stop``) waits forever. ``cancel_until_done`` repeats
the request until each task has ended. ``before_deadline`` bounds a call by a deadline on an
injected clock (a lease's: ``asyncio.wait_for`` runs on the loop's time, which a virtual clock,
or a stepped one, does not move), and ends it for certain when that passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Final, TypeVar

from seedance.core.clock import Clock

_T = TypeVar("_T")

__all__ = [
    "LATE",
    "Late",
    "before_deadline",
    "cancel_until_done",
    "cancel_until_done_shielded",
    "guarded",
]


class Late:
    """What `before_deadline` returns when the deadline passed first."""


LATE: Final = Late()


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


async def before_deadline(call: Awaitable[_T], clock: Clock, deadline_s: float) -> _T | Late:
    """``call``'s result, or `LATE` once ``clock.monotonic()`` reaches ``deadline_s`` first,
    the call then cancelled until it has ended (`cancel_until_done_shielded`: a cancel it
    swallows is repeated, and a cancel of the caller meanwhile cannot leave it running). The
    deadline is on the injected clock, so a virtual clock moves it as it moves what it guards.
    A reply in the deadline's very instant is late too (a lease may already be another's
    then); an error of a late call is dropped, of a timely one raised."""
    call_task = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep(max(0.0, deadline_s - clock.monotonic())))
    try:
        await asyncio.wait((call_task, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_until_done_shielded((timer, call_task))
    if call_task.cancelled() or clock.monotonic() >= deadline_s:
        if not call_task.cancelled():
            call_task.exception()  # read, so that no error is reported as never retrieved
        return LATE
    return call_task.result()
