"""The service runtime: lifecycle, consumers and loops, health, and signal-driven drain.

Every Seedance service is a class with ``async start()``, ``async run()`` and an idempotent
``async stop()``, usable with ``async with``. ``ServiceRuntime`` is the part they all share: the
bus connection, the metrics registry and health endpoint, and a task group running the service's
consumers and periodic loops. ``serve()`` is what a ``main()`` calls: it wires SIGTERM/SIGINT to a
clean drain (consumers settle the batch in hand, then the connection drains) in every state: a
signal that lands while the service is still connecting cancels the start. A first connection
that fails within its bound ends the process with one log line saying what to check.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Protocol, Self

from prometheus_client import CollectorRegistry

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus, BusSettings
from seedance.core.consumer import BatchHandler, Delivery, PullConsumer
from seedance.core.errors import BusUnavailable, ServerTooOld, StartRefused
from seedance.core.http import HealthServer
from seedance.core.logs import get_logger
from seedance.core.metrics import BusMetrics
from seedance.core.tasks import cancel_until_done_shielded
from seedance.events.subjects import consumer

__all__ = [
    "EXIT_BUS_REFUSED",
    "EXIT_BUS_UNAVAILABLE",
    "EXIT_START_REFUSED",
    "Lifecycle",
    "Service",
    "ServiceRuntime",
    "serve",
]

#: Exit statuses of a service whose first connection failed (sysexits.h: EX_UNAVAILABLE, EX_NOPERM),
#: so that a supervisor or a script can tell "nothing there" from "wrong credentials".
EXIT_BUS_UNAVAILABLE = os.EX_UNAVAILABLE
EXIT_BUS_REFUSED = os.EX_NOPERM
#: A service that refused to start as things stand (``StartRefused``: e.g. another device plugin
#: serves the node agent's resource): sysexits.h's EX_CONFIG, the operator's to fix.
EXIT_START_REFUSED = os.EX_CONFIG

log = get_logger(__name__)


class Service(Protocol):
    async def start(self) -> None: ...
    async def run(self) -> None: ...
    async def stop(self) -> None: ...


class Lifecycle:
    """``async with`` support for any class with start/stop."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Release connections and resources after ``run`` returned (override as needed)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        await self.close()


class ServiceRuntime(Lifecycle):
    def __init__(
        self,
        name: str,
        bus_settings: BusSettings,
        *,
        registry: CollectorRegistry | None = None,
        http_host: str = "127.0.0.1",
        http_port: int | None = None,
    ) -> None:
        self.name = name
        self.registry = registry or CollectorRegistry()
        self.bus_metrics = BusMetrics(self.registry, name)
        self._bus_settings = bus_settings
        self._bus: Bus | None = None
        self._http = (
            HealthServer(
                self.registry, self.ready, http_host, http_port, waiting_for=self._waiting_for
            )
            if http_port is not None
            else None
        )
        self._consumers: list[PullConsumer] = []
        self._loops: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._stopped = asyncio.Event()
        self._started = False
        #: What the service's own start still waits for after the runtime's (a replay, a
        #: mirror's copy): ``ready`` is False while it is set. The service sets and clears it.
        self.waiting_on: str | None = None
        self._failed = False  # run() ended with an error: the process is on its way out

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise RuntimeError(f"{self.name}: start() the runtime before using the bus")
        return self._bus

    @property
    def http_port(self) -> int | None:
        return self._http.port if self._http else None

    def http_url(self, path: str = "/metrics") -> str | None:
        """Where the endpoint serves ``path`` (the bound port once started); None without one."""
        return self._http.url(path) if self._http else None

    def ready(self) -> bool:
        """Started, connected, waiting for nothing the operator's provision has yet to create
        (a service binds its buckets and stores after the runtime started: their waits count
        too) nor on what the service set ``waiting_on`` for, and no consumer or loop has
        failed."""
        bus = self._bus
        return (
            self._started
            and not self._failed
            and self.waiting_on is None
            and bus is not None
            and bus.nc.is_connected
            and not bus.awaiting
        )

    def _waiting_for(self) -> str | None:
        """What ``/healthz`` reports until the first connection (then: alive, ``None``)."""
        if self._bus is None:
            return f"connecting to NATS at {self._bus_settings.url}"
        return None

    def consume(
        self,
        durable: str,
        types: Any,
        handler: Callable[[Delivery[Any]], Awaitable[None]] | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        batch: int = 100,
        managed: bool = True,
    ) -> PullConsumer:
        """Build a durable pull consumer from the catalogue.

        A managed one is bound at ``start()`` and run by ``run()``; an unmanaged one is the
        caller's to ``start(bus)`` and run (the slicer binds only once it leads its pool).
        """
        c = PullConsumer(
            consumer(durable),
            service=self.name,
            types=types,
            handler=handler,
            batch_handler=batch_handler,
            metrics=self.bus_metrics,
            batch=batch,
        )
        if managed:
            self._consumers.append(c)
        return c

    def loop(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Register a coroutine that runs until stop (cancelled then)."""
        self._loops.append(fn)

    async def start(self) -> None:
        if self._started:
            return
        # The endpoint is up first, so that a probe sees "connecting" rather than nothing.
        if self._http:
            await self._http.start()
            # Where it listens, said once (port 0 took any free port: this is the only place
            # that names it). Console rendering makes it a plain line at a terminal.
            log.info("http_listening", service=self.name, metrics_url=self.http_url())
        try:
            self._bus = await Bus.connect(self._bus_settings, service=self.name)
            await self._bus.ensure_streams()
            for c in self._consumers:
                await c.start(self._bus)
        except BaseException:
            # A failed start leaves nothing open, and a second start() connects afresh.
            if self._bus is not None:
                await self._bus.close()
                self._bus = None
            if self._http:
                await self._http.stop()
            raise
        self._started = True
        log.info("service_started", service=self.name, http_port=self.http_port)

    async def run(self) -> None:
        await self.start()
        try:
            async with asyncio.TaskGroup() as tg:
                for c in self._consumers:
                    tg.create_task(c.run())
                loops = [tg.create_task(fn()) for fn in self._loops]
                try:
                    await self._stopped.wait()
                finally:  # also when cancelled (a sibling's error): the group cancels once
                    for c in self._consumers:
                        c.stop()
                    await cancel_until_done_shielded(loops)  # a loop can miss one (nats-py)
        except BaseException as exc:
            # An error, or a cancel without stop() (what runs beside it failed: a lease keeper
            # that died): the process is on its way out. /readyz 503 at once, before it exits.
            if isinstance(exc, Exception) or not self._stopped.is_set():
                self._failed = True
            raise

    async def stop(self) -> None:
        """Idempotent; safe before ``start``."""
        self._stopped.set()
        for c in self._consumers:
            c.stop()

    async def close(self) -> None:
        """Release the connection and the endpoint (after ``run`` returned)."""
        await self.stop()
        for c in self._consumers:
            await c.close()
        if self._http:
            await self._http.stop()
        undrained = None
        if self._bus is not None:
            await self._bus.close()
            undrained = self._bus.undrained
            self._bus = None
        self._started = False
        self._failed = False
        if undrained is not None:  # closed while reconnecting: `serve` exits 69 on it
            raise undrained


async def serve(service: Service) -> None:
    """Run ``service`` until SIGTERM or SIGINT, then stop it cleanly.

    A signal during ``start()`` (still connecting, provisioning) cancels it and the process
    exits 0, as after a drain. A first connection that fails raises ``SystemExit`` with
    ``EXIT_BUS_UNAVAILABLE`` or ``EXIT_BUS_REFUSED`` after one ``nats_unavailable`` log line.
    ``StartRefused``, from ``start()`` or found once running (a state that does not decode),
    ends it with ``EXIT_START_REFUSED`` after one ``service_refused`` line. Any other failure
    ends the process with status 1 after one ``service_failed`` line.
    """
    loop = asyncio.get_running_loop()
    starting = asyncio.ensure_future(service.start())
    stops: list[asyncio.Future[None]] = []  # held: a task nobody references may be collected

    def on_signal() -> None:
        if not starting.done():
            starting.cancel()
        stops.append(asyncio.ensure_future(service.stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        try:
            await starting
        except asyncio.CancelledError:
            if not stops:
                raise
            log.info("service_stopped_while_starting")
            return
        except BusUnavailable as exc:
            log.error("nats_unavailable", reason=str(exc))
            raise SystemExit(EXIT_BUS_REFUSED if exc.refused else EXIT_BUS_UNAVAILABLE) from None
        except ServerTooOld as exc:
            log.error("nats_refused", reason=str(exc))
            raise SystemExit(EXIT_BUS_UNAVAILABLE) from None
        except StartRefused as exc:
            log.error("service_refused", reason=str(exc))
            raise SystemExit(EXIT_START_REFUSED) from None
        await service.run()
    except Exception as exc:
        raise _ended(exc) from None
    finally:
        await _stop_and_close(service)


def _ended(exc: Exception) -> SystemExit:
    """How a failed service ends (called while handling ``exc``): a refusal found once
    running (the state a new leader restores) as a refused start; anything else not carried
    on from, but with one structured line (the traceback inside it) rather than the
    interpreter's multi-line dump."""
    refused = _refusal(exc)
    if refused is not None:
        log.error("service_refused", reason=str(refused))
        return SystemExit(EXIT_START_REFUSED)
    log.error("service_failed", exc_info=exc)
    return SystemExit(1)


def _refusal(exc: Exception) -> StartRefused | None:
    """The `StartRefused` that ``exc`` is, or that all of a task group's failures are."""
    if isinstance(exc, ExceptionGroup):
        refused, rest = exc.split(StartRefused)
        if refused is None or rest is not None:
            return None
        inner: BaseException = refused
        while isinstance(inner, BaseExceptionGroup):
            inner = inner.exceptions[0]
        exc = inner  # type: ignore[assignment]
    return exc if isinstance(exc, StartRefused) else None


async def _stop_and_close(service: Service) -> None:
    """Stop and release; a bus that went away meanwhile ends the process with one line.

    Stopping while NATS is unreachable (a SIGTERM during a reconnect) cannot settle or release
    what needs the server (a lease, the drain); what was not settled is redelivered to another
    replica, a lease lapses after its TTL. The exit status says the stop was not clean.
    """
    incomplete: BaseException | None = None
    try:
        await service.stop()
    except TRANSIENT_BUS_ERRORS as exc:
        incomplete = exc
    # Closed even when the stop could not finish: a connection left open keeps nats-py's
    # reconnect loop running, which swallows the cancel that ends the process (asyncio.run
    # then waited on it for ever: a slicer whose leader start met a vanished server logged
    # that it stopped and never exited).
    closer = getattr(service, "close", None)
    if closer is not None:
        try:
            await closer()
        except TRANSIENT_BUS_ERRORS as exc:
            incomplete = incomplete or exc
    if incomplete is not None:
        log.error(
            "service_stop_incomplete",
            error=f"{type(incomplete).__name__}: {incomplete}",
            reason="NATS was unreachable while stopping; unsettled messages are redelivered",
        )
        raise SystemExit(EXIT_BUS_UNAVAILABLE) from None
