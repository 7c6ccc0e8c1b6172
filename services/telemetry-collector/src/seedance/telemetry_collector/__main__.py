"""``seedance-telemetry-collector`` / ``python -m seedance.telemetry_collector``: answer the
command line, load settings, wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.entry import start_service
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import build_source

NAME = "telemetry-collector"
SUMMARY = (
    "The telemetry collector: measures each GPU of its node through NVML (or replays a "
    "recorded fleet) and publishes samples and the node's inventory, with dcgm-exporter's "
    "metric names on /metrics. One per GPU node."
)


def main() -> None:
    settings, bus = start_service(NAME, CollectorSettings, summary=SUMMARY)
    clock = WallClock()
    try:
        source = build_source(settings, clock)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(serve(CollectorService(runtime, source, clock, settings)))


if __name__ == "__main__":
    main()
