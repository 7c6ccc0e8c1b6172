"""``python -m seedance.telemetry_collector``: load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.logs import configure_logging
from seedance.core.settings import bus_settings, load_settings
from seedance.core.tracing import configure_tracing
from seedance.telemetry_collector.replay import ReplayFleet
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings

NAME = "telemetry-collector"


def main() -> None:
    settings = load_settings(CollectorSettings, NAME)
    configure_logging()
    configure_tracing(NAME)
    if settings.source != "replay":
        raise SystemExit(
            f"SEEDANCE_TELEMETRY_COLLECTOR_SOURCE={settings.source!r}: only 'replay' "
            "is wired in this build"
        )
    if not settings.node_csv:
        raise SystemExit("SEEDANCE_TELEMETRY_COLLECTOR_NODE_CSV is required for source=replay")
    fleet = ReplayFleet.from_csv(settings.node_csv, settings.max_nodes)
    runtime = ServiceRuntime(NAME, bus_settings(NAME), http_port=settings.http_port)
    asyncio.run(serve(CollectorService(runtime, fleet, WallClock(), settings)))


if __name__ == "__main__":
    main()
