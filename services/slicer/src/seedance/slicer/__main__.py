"""``python -m seedance.slicer``: load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import SettingsError, bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings

NAME = "slicer"


def main() -> None:
    try:
        settings = load_settings(SlicerSettings, NAME)
        bus = bus_settings(NAME)
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None  # one line naming the variable; exit status 1
    configure_logging()
    configure_tracing(NAME)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(serve(SlicerService(runtime, WallClock(), settings)))


if __name__ == "__main__":
    main()
