"""``python -m seedance.router`` / ``seedance-router``: load settings, wire the objects, serve.

SIGTERM drains: the gateway stops taking requests and gives in-flight ones a grace period, the
loops stop, the queued decisions are published, then the bus connection drains.
"""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.entry import start_service
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings

NAME = "router"
SUMMARY = (
    "The router: an inference gateway (Open Inference Protocol over gRPC and REST) that picks "
    "the replica serving each request from a forecast of each replica's load, so that SLAs "
    "hold while replicas run hot. Stateless: run any number behind a Service."
)


def main() -> None:
    settings, bus = start_service(NAME, RouterSettings, summary=SUMMARY)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    service = RouterService(runtime, settings, WallClock())
    asyncio.run(serve(service))


if __name__ == "__main__":
    main()
