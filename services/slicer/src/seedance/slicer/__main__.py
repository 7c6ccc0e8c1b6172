"""``seedance-slicer`` / ``python -m seedance.slicer``: answer the command line, load settings,
wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.entry import start_service
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings

NAME = "slicer"
SUMMARY = (
    "The slicer: decides where each job runs (whole GPUs, MIG instances, shared GPUs) under "
    "tenant quotas, keeping fragmentation low, and which running work to move so that idle "
    "nodes can be released. One leader per pool; standbys take over."
)


def main() -> None:
    settings, bus = start_service(NAME, SlicerSettings, summary=SUMMARY)
    runtime = ServiceRuntime(NAME, bus, http_host=settings.http_host, http_port=settings.http_port)
    asyncio.run(serve(SlicerService(runtime, WallClock(), settings)))


if __name__ == "__main__":
    main()
