"""``seedance-slicer`` / ``python -m seedance.slicer``: answer the command line, load settings,
wire the objects, serve."""

from __future__ import annotations

import asyncio

from seedance.core import ServiceRuntime, WallClock, serve
from seedance.core.entry import start_service
from seedance.core.heap import freeze_survivors
from seedance.core.holder import default_holder
from seedance.core.logs import get_logger
from seedance.slicer.autosize import autosize_service, with_autosize
from seedance.slicer.config import short_hold
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
    clock = WallClock()
    if (why := short_hold(settings)) is not None:
        get_logger(__name__).warning("slicer_consolidate_hold_short", reason=why)
    # The fleet and the running jobs are long-lived: full collections walk only what changed
    # since the last one (seedance.core.heap), so they do not stall decisions as the state grows.
    freeze_survivors()
    slicer = SlicerService.build(runtime, clock, settings)
    # The right-sizing loop runs beside the slicer when a tenant opted in (docs/slicer.md).
    autosize = autosize_service(runtime, clock, settings, settings.replica or default_holder())
    asyncio.run(serve(with_autosize(slicer, autosize)))


if __name__ == "__main__":
    main()
