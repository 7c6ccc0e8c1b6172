"""The telemetry-collector service: publishes inventory and per-node samples every tick.

With ``source=replay`` the fleet is simulated from a node list and follows the slicer's
placements and the jobs' ends, read from the bus; this closes the loop of the demo.
"""

from __future__ import annotations

from typing import Any

from seedance.core import Clock, Delivery, Lifecycle, ServiceRuntime
from seedance.core.logs import get_logger
from seedance.events.jobs import JobCancelled, JobFailed, JobFinished
from seedance.events.slicing import Placement, Preempted
from seedance.events.subjects import telemetry
from seedance.telemetry_collector.replay import ReplayFleet
from seedance.telemetry_collector.settings import CollectorSettings

__all__ = ["CollectorService"]

log = get_logger(__name__)


class CollectorService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        fleet: ReplayFleet,
        clock: Clock,
        settings: CollectorSettings,
    ) -> None:
        self._rt = runtime
        self._fleet = fleet
        self._clock = clock
        self._settings = settings
        runtime.consume("collector-placements", Placement | Preempted, self._on_slicing)
        runtime.consume("collector-jobs", JobFinished | JobFailed | JobCancelled, self._on_job_end)
        runtime.loop(self._tick_loop)

    async def start(self) -> None:
        await self._rt.start()
        inventories = self._fleet.inventories(self._clock.now())
        await self._rt.bus.publish_many([(telemetry.inventory(i.node), i) for i in inventories])
        log.info("inventory_published", nodes=len(inventories), gpus=self._fleet.gpu_count)

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        await self._rt.close()

    async def _on_slicing(self, d: Delivery[Any]) -> None:
        ev = d.event
        if isinstance(ev, Placement):
            self._fleet.apply(ev.job_id, ev.node, [(g.index, g.milli) for g in ev.gpus])
        else:
            self._fleet.release(ev.job_id)

    async def _on_job_end(self, d: Delivery[Any]) -> None:
        self._fleet.release(d.event.job_id)

    async def _tick_loop(self) -> None:
        while True:
            batches = self._fleet.samples(self._clock.now())
            await self._rt.bus.publish_many([(telemetry.sample(b.node), b) for b in batches])
            await self._clock.sleep(self._settings.tick_s)
