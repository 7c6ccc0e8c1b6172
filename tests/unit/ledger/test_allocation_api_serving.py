"""The allocation API's subscription is confirmed (a flush answered) before it says it serves,
and a flush the server does not answer (away longer than nats-py's 10 s: a fail-over) is
retried: one loop's error would end the whole cost-ledger, billing too (review of stop 45,
p2: `_serve` raised `FlushTimeoutError` out of the service's task group)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
from prometheus_client import CollectorRegistry

from seedance.core.errors import ConsumerRefused
from seedance.cost_ledger.allocation_api import AllocationApi


class _Nc:
    is_connected = True  # a connection up: its flushes are answered or time out

    def __init__(self, unanswered: int) -> None:
        self.unanswered, self.flushes = unanswered, 0

    async def subscribe(self, *_: Any, **__: Any) -> Any:
        class _Sub:
            async def unsubscribe(self) -> None:
                pass

        return _Sub()

    async def flush(self, **_: Any) -> None:
        self.flushes += 1
        if self.flushes <= self.unanswered:
            raise nats.errors.FlushTimeoutError


class _Clock:
    def __init__(self) -> None:
        self.slept: list[float] = []

    async def sleep(self, s: float) -> None:
        self.slept.append(s)


class _Runtime:
    def __init__(self, nc: _Nc) -> None:
        self.registry = CollectorRegistry()
        self.bus = type("Bus", (), {"nc": nc, "clock": _Clock()})()
        self.loops: list[Any] = []

    def loop(self, fn: Any) -> None:
        self.loops.append(fn)


async def test_an_unanswered_flush_is_retried_and_serving_is_set_once_one_is_answered() -> None:
    nc = _Nc(unanswered=2)
    rt = _Runtime(nc)
    api = AllocationApi(rt, replica="r")  # type: ignore[arg-type]

    async def bound() -> None:
        pass

    serving_seen: list[bool] = []

    async def followed() -> None:  # the loop's work after subscribing: stop it here
        serving_seen.append(api.serving.is_set())
        raise asyncio.CancelledError

    api._bind_retrying = bound  # type: ignore[method-assign]
    api._unbind = bound  # type: ignore[method-assign]
    api._follow = followed  # type: ignore[method-assign]
    with contextlib.suppress(asyncio.CancelledError):
        await rt.loops[0]()
    assert nc.flushes == 2 + 2  # two unanswered, then the barrier's two (`flushed`)
    assert len(rt.bus.clock.slept) == 2
    assert serving_seen == [True]
    assert not api.serving.is_set()  # cleared when serving ended


async def test_a_refused_reader_is_retried_as_a_time_out_was() -> None:
    """Its reader's create refused (``ConsumerRefused``, at once since the server's refusal is
    read: permissions not yet re-rendered) is retried like the time-out that refusal was before,
    and the bind ends once one succeeds; it never ends the ledger's loops."""
    rt = _Runtime(_Nc(unanswered=0))
    api = AllocationApi(rt, replica="r")  # type: ignore[arg-type]
    tries: list[int] = []

    async def bind() -> None:
        tries.append(1)
        if len(tries) <= 2:
            raise ConsumerRefused("user cost-ledger", "SEEDANCE_COSTS", "r", "$JS.API.CONSUMER")

    api._bind = bind  # type: ignore[method-assign]
    await api._bind_retrying()
    assert len(tries) == 3
    assert len(rt.bus.clock.slept) == 2
