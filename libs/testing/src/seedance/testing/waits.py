"""Waiting with a deadline: ``eventually`` (until a check holds), and on the bus, until
durables are bound, until a durable consumer has handled what a driver published, until a
stream the server fills by sourcing holds what was published to its origins (a count, or all
they hold), until the slicer knows the inventory, until a subscription delivers a message a
test looks for, until a background task that a test cancels has ended.

These poll because no local event exists to wait on (the state is the server's, a metric, a
callback's list); every loop is bounded by its timeout, and a timeout names what was awaited.
A test that can wait on an event or advance a virtual clock does that instead.

Every loop here checks the clock itself as well as running under ``asyncio.timeout``: the
timeout cancels the task once, and on Python 3.11 a nats request (``asyncio.wait_for`` inside
nats-py) whose reply lands in the same loop turn as that cancel returns the reply and drops the
cancel (CPython gh-86296, fixed in 3.12). A loop bounded by the cancel alone then polls forever:
a wait that should have failed in 0.2 s hung a test until pytest's 120 s limit. The same holds
for a loop reading a subscription whose publisher keeps sending messages that do not match (a
periodic report): ``next_matching`` bounds each read by what is left of the deadline instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.js.errors import NotFoundError

from seedance.core.tasks import cancel_until_done
from seedance.events.subjects import telemetry

__all__ = [
    "eventually",
    "last_stored",
    "next_matching",
    "stop_task",
    "wait_consumer_settled",
    "wait_consumers_bound",
    "wait_copied",
    "wait_inventory_known",
    "wait_sourced",
]


async def eventually(
    check: Callable[[], bool | Awaitable[bool]],
    timeout_s: float = 10.0,
    *,
    what: str | None = None,
    interval_s: float = 0.02,
) -> None:
    """Return once ``check()`` (plain or awaitable) is true; raise ``TimeoutError`` naming
    ``what`` (default: the check's name) if it is still false after ``timeout_s``.

    The deadline bounds the checks too: one that hangs (a request to a stopped server) times
    out like one that keeps answering false. A ``TimeoutError`` of the check's own, before the
    deadline, propagates as it is.
    """
    if not await _poll(lambda: _holds(check), timeout_s, interval_s):
        name = what or getattr(check, "__qualname__", repr(check))
        raise TimeoutError(f"not true within {timeout_s} s: {name}")


async def _holds(check: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = check()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


async def _poll(step: Callable[[], Awaitable[bool]], timeout_s: float, interval_s: float) -> bool:
    """True once ``step()`` is true; False once ``timeout_s`` has passed, whether the timeout's
    cancel interrupted a step (one that hangs) or a step dropped it (see the module's note), in
    which case the clock check ends the loop after that step. A ``TimeoutError`` of a step's
    own, before the deadline, propagates."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    bound = asyncio.timeout_at(deadline)
    try:
        async with bound:
            while not await step():
                if loop.time() >= deadline:
                    return False
                await asyncio.sleep(interval_s)
            return True
    except TimeoutError:
        if not bound.expired():
            raise
        return False


async def _poll_then_read(
    step: Callable[[], Awaitable[bool]], timeout_s: float, interval_s: float
) -> bool:
    """`_poll`, then, where it ran out, one more ``step()`` (a nats request: nats-py's own
    request timeout bounds it) so that what a wait's error says is the server's state. The
    deadline's cancel can cut off every read: a machine that stalled a short wait's only
    request (0.2 s) left the message built from none ("the durable does not exist", "holds 0",
    the bound durables named as missing), and a test matching the message failed. True where
    that read finds the state reached."""
    return await _poll(step, timeout_s, interval_s) or await step()


async def stop_task(task: asyncio.Future[Any], timeout_s: float = 10.0) -> None:
    """Cancel a test's background task and return once it has ended; raise its own error if
    it failed. The cancel is repeated (``cancel_until_done``): a task that talks to nats (a
    lease keeper, a KV writer, a consumer loop) can lose one cancel, then runs on, and a test
    awaiting it after a single ``cancel()`` waits until pytest's limit. One that outlives
    every cancel for ``timeout_s`` (it swallows them: a defect of its own) is named in a
    ``TimeoutError`` rather than holding the test until that limit."""
    stopping = asyncio.ensure_future(cancel_until_done([task], every_s=0.1))
    done, _ = await asyncio.wait({stopping}, timeout=timeout_s)
    if not done:
        stopping.cancel()
        raise TimeoutError(f"{task!r} still runs {timeout_s} s after it was first cancelled")
    if not task.cancelled():
        task.result()


async def last_stored(js: Any, stream: str, subject: str) -> Any | None:
    """The last message ``stream`` stores on ``subject``; None while it stores none yet.

    For a check polled by ``eventually`` on a stream that fills later (a mirror, a sourcing
    stream, a consumer's output): the server answers "no message found" (404) until the first
    one arrives, and a check that let it raise failed the wait on its first poll instead of
    waiting."""
    try:
        return await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None


async def wait_sourced(
    js: Any, stream: str, count: int, *, since_seq: int = 0, timeout_s: float = 30.0
) -> int:
    """Wait until ``stream``, which the server fills by sourcing others (the ledger's merged
    input), holds ``count`` messages after ``since_seq``; its last sequence then.

    Every publish to an origin acknowledged is not every message copied: the moment
    ``publish_many`` returned, the merged input was measured up to 920 messages short. A
    sequence read then and waited for ("the replica stepped up to it") let a test go on while
    the replica still stepped the rest, and compare answers and streams that were moving.
    ``count`` is what the origins took (``PubAck.duplicate`` false), all of it sourced."""
    last = since_seq

    async def copied() -> bool:
        nonlocal last
        try:
            last = (await js.stream_info(stream)).state.last_seq
        except NotFoundError:  # not created yet (its service creates it as it starts)
            return False
        return bool(last >= since_seq + count)

    if not await _poll_then_read(copied, timeout_s, 0.02):  # the server copies: no event
        raise TimeoutError(
            f"{stream} holds {last - since_seq} of the {count} messages sourced after seq "
            f"{since_seq} within {timeout_s} s"
        )
    return last


async def wait_copied(js: Any, stream: str, *, timeout_s: float = 30.0) -> None:
    """Wait until ``stream``, which the server fills by sourcing others, holds a copy of the
    last message each origin holds under its source's filter: what they acknowledged is copied
    (a source copies in its origin's order, so the last copy's origin sequence, which its
    ``Nats-Stream-Source`` header names, is how far that source got).

    For a driver that does not know how many its publishes stored (a flooder's, partly
    refused), before it waits for a reader of ``stream`` to settle (the slicer's
    ``SEEDANCE_JOBS``: its ``slicer-jobs`` has nothing pending while the copies are on the
    way). Per source, so that one origin's copies do not stand in for another's still on the
    way, and an eviction in ``stream`` does not hide one (the count it compared before
    returned at once where the merged stream held more than its origins: review L6). Its
    limits: the sources' filters must not overlap (each copy is told apart by its subject); a
    last message whose copy ``stream`` dropped (its ``Nats-Msg-Id`` another origin's copy already
    had) or evicted never gets there: the timeout names each source's progress."""
    progress: dict[str, tuple[int, int]] = {}

    async def copied() -> bool:
        info = await js.stream_info(stream)
        for src in info.config.sources or ():
            filt = src.filter_subject or ">"
            try:
                last = (await js.get_last_msg(src.name, filt)).seq
            except NotFoundError:
                last = 0
            got = 0
            if last:
                with contextlib.suppress(NotFoundError):
                    copy = await js.get_last_msg(stream, filt)
                    source = (copy.headers or {}).get("Nats-Stream-Source", "- 0")
                    origin, seq = source.split()[:2]
                    got = int(seq) if origin == src.name else 0
            progress[src.name] = (got, last)
        return all(got >= last for got, last in progress.values())

    if not await _poll_then_read(copied, timeout_s, 0.02):  # the server copies: no event
        raise TimeoutError(
            f"{stream}'s copies (origin: copied, its last sequence) {progress} after {timeout_s} s"
        )


async def wait_consumers_bound(
    bus: Any, *durables: tuple[str, str], timeout_s: float = 30.0
) -> None:
    """Wait until each ``(stream, durable)`` exists (the services bind them as they start)."""
    missing = list(durables)

    async def bound() -> bool:
        while missing:
            try:
                await bus.js.consumer_info(*missing[0])
            except NotFoundError:
                return False
            missing.pop(0)
        return True

    if not await _poll_then_read(bound, timeout_s, 0.05):  # the server's: no event to wait on
        names = ", ".join(f"{stream}/{durable}" for stream, durable in missing)
        raise TimeoutError(f"not bound within {timeout_s} s: {names}")


async def next_matching(
    sub: Any, accept: Callable[[Any], bool], timeout_s: float, *, what: str
) -> Any:
    """The first message of ``sub`` (a nats-py subscription read with ``next_msg``) that
    ``accept`` takes; ``TimeoutError`` naming ``what`` once ``timeout_s`` has passed.

    Each read waits at most what is left of the deadline, and the clock is read after every
    message, so no cancel has to land (see the module's note): a publisher that keeps sending
    messages that do not match cannot keep the loop reading past the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    seen = 0
    while (left := deadline - loop.time()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except nats.errors.TimeoutError:
            break
        if accept(msg):
            return msg
        seen += 1
    raise TimeoutError(f"no message {what} within {timeout_s} s ({seen} others read)")


async def wait_consumer_settled(
    bus: Any, stream: str, durable: str, seq: int = 0, timeout_s: float = 60.0
) -> None:
    """Wait until ``durable`` exists and has acknowledged everything up to stream ``seq``.

    With ``seq=0``: until it exists and has nothing pending. This is how a driver knows a
    service has handled what it published (the service acks only after its effects are durable).
    """
    info = None

    async def handled() -> bool:
        nonlocal info
        try:
            info = await bus.js.consumer_info(stream, durable)
        except NotFoundError:
            info = None
        return info is not None and (
            (seq and info.ack_floor.stream_seq >= seq)
            or (info.num_pending == 0 and info.num_ack_pending == 0)
        )

    if not await _poll_then_read(handled, timeout_s, 0.01):  # the server's consumer state
        raise TimeoutError(
            f"{stream}/{durable} has not handled up to seq {seq or 'the end'} within "
            f"{timeout_s} s: {_consumer_state(info)}"
        )


def _consumer_state(info: Any) -> str:
    """What the consumer was doing when a wait for it ran out (for the next person)."""
    if info is None:
        return "the durable does not exist"
    return (
        f"ack floor {info.ack_floor.stream_seq}, delivered {info.delivered.stream_seq}, "
        f"pending {info.num_pending}, awaiting ack {info.num_ack_pending}, "
        f"redelivered {info.num_redelivered}"
    )


async def wait_inventory_known(bus: Any, timeout_s: float = 60.0, *, nodes: int = 0) -> None:
    """Wait until the collector published inventory (of at least ``nodes`` nodes: a publisher
    such as the k8s-bridge may send a large fleet's in several batches) and the slicer handled
    all of it."""
    last_seq = 0

    async def published() -> bool:
        nonlocal last_seq
        info = await bus.stream_info("SEEDANCE_TELEMETRY")
        if info is None or not info.state.messages:
            return False
        inv = await bus.js.stream_info("SEEDANCE_TELEMETRY", subjects_filter=telemetry.INVENTORY)
        last_seq = inv.state.last_seq
        return len(inv.state.subjects or {}) >= nodes

    # a fleet's subject list is a large answer: polled less often
    if not await _poll(published, timeout_s, 0.25 if nodes else 0.05):
        raise TimeoutError(f"no inventory of {nodes or 'any'} nodes within {timeout_s} s")
    await wait_consumer_settled(bus, "SEEDANCE_TELEMETRY", "slicer-inventory", last_seq, timeout_s)
