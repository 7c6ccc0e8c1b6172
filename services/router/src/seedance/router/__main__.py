"""``python -m seedance.router`` / ``seedance-router``: load settings, wire the objects, serve.

SIGTERM drains: the gateway stops taking requests and gives in-flight ones a grace period, the
loops stop, the queued decisions are published, then the bus connection drains.
"""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import SettingsError, bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings

NAME = "router"


def main() -> None:
    try:
        settings = load_settings(RouterSettings, NAME)
        bus = bus_settings(NAME)
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None  # one line naming the variable; exit status 1
    configure_logging()
    configure_tracing(NAME)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    service = RouterService(runtime, settings, WallClock())
    asyncio.run(serve(service))


if __name__ == "__main__":
    main()
