"""`Bus.create_or_await`'s wait for the operator's provision, against a scripted JetStream.

What a stream lookup answers while JetStream passes through a bad moment (503 during a meta-leader
election, a request timing out) keeps the wait going, counted in its line; a refusal of the
lookup itself ends the start with `StartRefused` naming the stream; the bus says what it awaits
for as long as it waits (``ServiceRuntime.ready`` reads it). The refused create is told by the
server's error text, whatever case it comes in. The real server's side is in
tests/integration/deploy/test_stream_create.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest
from nats.js.errors import NotFoundError, ServiceUnavailableError
from structlog.testing import capture_logs

from seedance.core.bus import Bus, BusSettings
from seedance.core.connect_watch import ConnectWatch
from seedance.core.errors import StartRefused

STREAM = "KV_seedance-router-weights"


class SteppingClock:
    """Time moves only by the wait's own sleeps (each poll is one second later)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> Any:
        raise AssertionError("the wait reads monotonic time only")

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)  # let the test's task look in between polls


class ScriptedJs:
    """``stream_info`` answers from a script (an exception to raise, or None for "exists");
    ``on_lookup`` runs first (to report a refusal by the error callback, as a server does)."""

    def __init__(self, script: list[BaseException | None]) -> None:
        self.script = script
        self.lookups = 0
        self.on_lookup: Callable[[], Any] | None = None

    async def stream_info(self, name: str) -> object:
        assert name == STREAM
        self.lookups += 1
        if self.on_lookup is not None:
            await self.on_lookup()
        outcome = self.script.pop(0)
        if outcome is not None:
            raise outcome
        return SimpleNamespace(config=SimpleNamespace(name=name))


def _bus(js: ScriptedJs, clock: SteppingClock) -> tuple[Bus, ConnectWatch]:
    settings = BusSettings(user="router", name="router")
    nc: Any = SimpleNamespace(jetstream=lambda: js)
    bus = Bus(nc, settings, clock)  # type: ignore[arg-type]
    watch = ConnectWatch(settings, clock)  # type: ignore[arg-type]
    watch.connected = True
    bus._watch = watch
    return bus, watch


def _denial(subject: str) -> nats.errors.Error:
    """A refusal of ``subject`` as nats-server words it, cased as the server writes it (nats-py
    lower-cases the text today; a release that did not must still be heard)."""
    return nats.errors.Error(f'nats: Permissions Violation for Publish to "{subject}"')


def _refused(watch: ConnectWatch, subject: str) -> Callable[[], Any]:
    """A create refused so: the error callback hears it, the request gets no reply."""

    async def create() -> object:
        await watch.error(_denial(subject))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return create


async def test_passing_errors_keep_the_wait_and_the_bus_says_what_it_awaits() -> None:
    js = ScriptedJs(
        [
            ServiceUnavailableError(),  # a meta-leader election
            nats.errors.TimeoutError(),  # a slow request
            NotFoundError(),
            None,  # provisioned
        ]
    )
    clock = SteppingClock()
    bus, watch = _bus(js, clock)
    seen: list[frozenset[str]] = []

    async def look() -> None:
        seen.append(bus.awaiting)

    js.on_lookup = look
    with capture_logs() as logs:
        got = await asyncio.wait_for(
            bus.create_or_await(STREAM, _refused(watch, f"$JS.API.STREAM.CREATE.{STREAM}")), 10.0
        )
    assert got is None
    assert js.lookups == 4
    assert seen == [frozenset({STREAM})] * 4
    assert bus.awaiting == frozenset()
    assert watch.denials == []
    assert [e["event"] for e in logs] == ["stream_not_provisioned", "stream_provisioned"]


async def test_the_minute_line_counts_the_lookups_that_failed() -> None:
    js = ScriptedJs([NotFoundError()] + [ServiceUnavailableError()] * 61 + [None])
    bus, watch = _bus(js, SteppingClock())
    with capture_logs() as logs:
        await asyncio.wait_for(
            bus.create_or_await(STREAM, _refused(watch, f"$JS.API.STREAM.CREATE.{STREAM}")), 10.0
        )
    lines = [e for e in logs if e["event"] == "stream_not_provisioned"]
    assert [(e["lookup_errors"], e["waited_s"]) for e in lines] == [(0, 0.0), (60, 60.0)]
    assert "ServiceUnavailableError" in lines[1]["last_lookup_error"]


async def test_a_refused_lookup_ends_the_start_naming_the_stream() -> None:
    js = ScriptedJs([NotFoundError(), nats.errors.TimeoutError()])
    bus, watch = _bus(js, SteppingClock())

    async def second_refused() -> None:
        if js.lookups == 2:  # the callback hears it before the lookup times out, as live
            await watch.error(_denial(f"$JS.API.STREAM.INFO.{STREAM}"))

    js.on_lookup = second_refused
    with pytest.raises(StartRefused, match=f"user .router. .*STREAM.INFO.{STREAM}"):
        await asyncio.wait_for(
            bus.create_or_await(STREAM, _refused(watch, f"$JS.API.STREAM.CREATE.{STREAM}")), 10.0
        )
    assert bus.awaiting == frozenset()


async def test_any_other_error_ends_the_wait_as_itself() -> None:
    js = ScriptedJs([ValueError("bad reply")])
    bus, watch = _bus(js, SteppingClock())
    with pytest.raises(ValueError, match="bad reply"):
        await asyncio.wait_for(
            bus.create_or_await(STREAM, _refused(watch, f"$JS.API.STREAM.CREATE.{STREAM}")), 10.0
        )
    assert bus.awaiting == frozenset()


async def test_a_wait_that_leaves_readiness_alone_is_not_awaited() -> None:
    """The router's planner leader waiting at run time for its mirror keeps the replica in
    service: its wait is not in ``awaiting``."""
    js = ScriptedJs([NotFoundError(), None])
    bus, watch = _bus(js, SteppingClock())
    seen: list[frozenset[str]] = []

    async def look() -> None:
        seen.append(bus.awaiting)

    js.on_lookup = look
    await asyncio.wait_for(
        bus.create_or_await(
            STREAM,
            _refused(watch, f"$JS.API.STREAM.CREATE.{STREAM}"),
            unready_while_awaited=False,
        ),
        10.0,
    )
    assert seen == [frozenset()] * 2


async def test_a_cancel_of_the_caller_while_the_refused_create_ends_is_raised() -> None:
    """A cancel of the caller (a service's SIGTERM) that lands while the refused create is being
    ended is raised. Before: asyncio handed it on to the create the bus awaited, and it was
    swallowed with the create's own cancel; the start went on to wait for the provision."""
    bus, watch = _bus(ScriptedJs([]), SteppingClock())
    subject = f"$JS.API.STREAM.CREATE.{STREAM}"
    caller: asyncio.Future[Any] | None = None

    async def create() -> object:
        await watch.error(_denial(subject))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            assert caller is not None
            caller.cancel()  # the caller's own cancel, just as the bus ends the create
            raise
        raise AssertionError("unreachable")

    caller = asyncio.ensure_future(bus.unless_refused(subject, create))
    await asyncio.wait([caller])
    assert caller.cancelled()
