"""``python -m seedance.telemetry_collector``: load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import SettingsError, bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import build_source

NAME = "telemetry-collector"


def main() -> None:
    try:
        settings = load_settings(CollectorSettings, NAME)
        bus = bus_settings(NAME)
    except SettingsError as exc:
        raise SystemExit(str(exc)) from None
    configure_logging()
    configure_tracing(NAME)
    clock = WallClock()
    try:
        source = build_source(settings, clock)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(serve(CollectorService(runtime, source, clock, settings)))


if __name__ == "__main__":
    main()
