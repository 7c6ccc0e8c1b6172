"""Waiting with a deadline: ``eventually`` (until a check holds), and on the bus, until a
durable consumer has handled what a driver published, until the slicer knows the inventory.

These poll because no local event exists to wait on (the state is the server's, a metric, a
callback's list); every loop is bounded by its timeout, and a timeout names what was awaited.
A test that can wait on an event or advance a virtual clock does that instead.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.errors import NotFoundError

from seedance.events.subjects import telemetry

__all__ = ["eventually", "wait_consumer_settled", "wait_inventory_known"]


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
    bound = asyncio.timeout(timeout_s)
    try:
        async with bound:
            while not await _holds(check):
                await asyncio.sleep(interval_s)
    except TimeoutError:
        if not bound.expired():
            raise
        name = what or getattr(check, "__qualname__", repr(check))
        raise TimeoutError(f"not true within {timeout_s} s: {name}") from None


async def _holds(check: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = check()
    if inspect.isawaitable(result):
        result = await result
    return bool(result)


async def wait_consumer_settled(
    bus: Any, stream: str, durable: str, seq: int = 0, timeout_s: float = 60.0
) -> None:
    """Wait until ``durable`` exists and has acknowledged everything up to stream ``seq``.

    With ``seq=0``: until it exists and has nothing pending. This is how a driver knows a
    service has handled what it published (the service acks only after its effects are durable).
    """
    info = None
    bound = asyncio.timeout(timeout_s)
    try:
        async with bound:
            while True:
                try:
                    info = await bus.js.consumer_info(stream, durable)
                except NotFoundError:
                    info = None
                if info is not None and (
                    (seq and info.ack_floor.stream_seq >= seq)
                    or (info.num_pending == 0 and info.num_ack_pending == 0)
                ):
                    return
                await asyncio.sleep(0.01)  # polls the server's consumer state; bounded
    except TimeoutError:
        if not bound.expired():
            raise
        raise TimeoutError(
            f"{stream}/{durable} has not handled up to seq {seq or 'the end'} within "
            f"{timeout_s} s: {_consumer_state(info)}"
        ) from None


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
    async with asyncio.timeout(timeout_s):
        while True:
            info = await bus.stream_info("SEEDANCE_TELEMETRY")
            if info is not None and info.state.messages:
                inv = await bus.js.stream_info(
                    "SEEDANCE_TELEMETRY", subjects_filter=telemetry.INVENTORY
                )
                if len(inv.state.subjects or {}) >= nodes:
                    break
            # polls the server, bounded by the timeout; a fleet's subject list is a large answer
            await asyncio.sleep(0.25 if nodes else 0.05)
    await wait_consumer_settled(
        bus, "SEEDANCE_TELEMETRY", "slicer-inventory", inv.state.last_seq, timeout_s
    )
