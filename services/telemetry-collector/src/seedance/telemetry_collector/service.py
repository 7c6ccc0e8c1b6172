"""The telemetry-collector service: publishes inventory, per-node samples and GPU health.

Owns the bus side: at start it publishes every node's inventory; on each tick of its clock it
asks the source for samples and publishes one ``GpuSampleBatch`` per node (``publish_many``
pipelines the acks: 1,213 node events per tick for the replayed fleet), inventory when it
changed (and again every ``inventory_interval_s``, so that late slicers find every node), and a
``GpuHealth`` for each health flip. The dcgm-exporter collector on ``/metrics`` is updated on
every tick. With the replayed fleet it also follows the slicer's decisions (placements,
preemptions, releases: trusted facts, never a tenant's own job events), keyed by (tenant, job),
and applies them to the fleet, which closes the loop of the demo. It reads them from the ledger's
input's mirror (``SEEDANCE_NODE_DECISIONS``), after the input holds them, under a replaying
collector's user (``fleet-replayer``, compose's ``telemetry-replayer``); under one without that
read (the shipped ``telemetry-collector``, a real node's) a replay refuses to start, saying why.
A real node's collector (NVML) follows no decision.

It must not compute samples itself (the sources and ``mapping`` do) or read the wall clock
(the clock is injected).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import nats.errors

from seedance.core import Clock, Delivery, Lifecycle, ServiceRuntime
from seedance.core.errors import ConsumerRefused, NoStream, StartRefused
from seedance.core.logs import get_logger
from seedance.events import Event
from seedance.events.slicing import JobReleased, Placement, Preempted
from seedance.events.subjects import telemetry
from seedance.telemetry_collector.mapping import (
    gpu_health_event,
    inventory_event,
    sample_batch_event,
)
from seedance.telemetry_collector.metrics import CollectorMetrics
from seedance.telemetry_collector.prometheus import DcgmExporterCollector
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import HostedInventory, ReplaySource, Source

__all__ = ["CollectorService"]

log = get_logger(__name__)

#: Failures of one tick's publishing that the next tick retries by itself (a sample is only
#: worth anything fresh, so a lost tick is not re-sent).
_TRANSIENT = (TimeoutError, nats.errors.Error, NoStream)
#: Why a replay will not start under a user without the decisions' read (the shipped
#: `telemetry-collector`, on every node, has none: a real node's collector follows no decision).
_NO_DECISIONS = (
    "a replayed fleet follows the slicer's decisions through consumer {durable}, which this "
    "NATS user may not create: run a replay as `fleet-replayer` (or compose's "
    "`telemetry-replayer`); the node-side `telemetry-collector` user reads no decision "
    "(docs/telemetry.md). {why}"
)


class CollectorService(Lifecycle):
    def __init__(
        self,
        runtime: ServiceRuntime,
        source: Source,
        clock: Clock,
        settings: CollectorSettings,
    ) -> None:
        self._rt = runtime
        self._source = source
        self._clock = clock
        self._settings = settings
        self.metrics = CollectorMetrics(runtime.registry)
        self.dcgm = DcgmExporterCollector(runtime.registry)
        self._pending_health: list[tuple[str, Event]] = []
        self._subjects: dict[str, str] = {}
        self._source_started = False
        if isinstance(source, ReplaySource):
            self._consume(
                "collector-placements", Placement | Preempted | JobReleased, self._on_slicing
            )
        runtime.loop(self._tick_loop)

    def _consume(self, durable: str, types: Any, handler: Any) -> None:
        c = self._rt.consume(durable, types, handler)
        if self._settings.instance:
            # The catalogue's durable, renamed for this instance before it is bound: collectors
            # that replay side by side each need every placement.
            c.spec = dataclasses.replace(c.spec, durable=f"{durable}-{self._settings.instance}")

    @property
    def source(self) -> Source:
        return self._source

    async def start(self) -> None:
        # The source first: a node without a usable NVML fails before touching the bus.
        if not self._source_started:
            inventories = await self._source.start()
            self._source_started = True
            try:
                await self._rt.start()
            except ConsumerRefused as exc:
                raise StartRefused(_NO_DECISIONS.format(durable=exc.durable, why=exc)) from exc
            await self._publish_inventories(inventories)
            log.info(
                "collector_started",
                source=self._settings.source,
                nodes=len(inventories),
                gpus=sum(len(h.inventory.gpus) for h in inventories),
            )

    async def run(self) -> None:
        await self._rt.run()

    async def stop(self) -> None:
        await self._rt.stop()

    async def close(self) -> None:
        try:
            await self._rt.close()  # raises after closing when NATS was unreachable
        finally:
            await self._source.close()

    # --- the replayed fleet follows the slicer ------------------------------------------------

    async def _on_slicing(self, d: Delivery[Any]) -> None:
        # The consumer has checked the subject's tenant against the payload's (a placement on
        # acme's subject naming globex is dead-lettered before it gets here).
        assert isinstance(self._source, ReplaySource)
        ev = d.event
        if isinstance(ev, Placement):
            outcome = self._source.apply(ev)
            self.metrics.placements_total.labels(outcome).inc()
            if outcome == "applied":
                log.info("fleet_placement_applied", job_id=ev.job_id, node=ev.node)
        elif self._source.release(ev.tenant, ev.job_id):  # preempted, or ended (JobReleased)
            self.metrics.placements_total.labels("released").inc()

    # --- the tick -------------------------------------------------------------------------------

    def _subject(self, node: str, kind: str) -> str:
        # Subjects validate their node token; the fleet's 1,213 are built once, not per tick.
        key = f"{kind}/{node}"
        subject = self._subjects.get(key)
        if subject is None:
            subject = self._subjects[key] = getattr(telemetry, kind)(node)
        return subject

    async def _publish_inventories(self, inventories: list[HostedInventory]) -> None:
        at = self._clock.now()
        items: list[tuple[str, Event]] = []
        for h in inventories:
            self.dcgm.update_inventory(h.inventory)
            event = inventory_event(
                h.inventory, at, cpu_milli=h.cpu_milli, memory_mib=h.memory_mib, pool=h.pool
            )
            items.append((self._subject(event.node, "inventory"), event))
        await self._rt.bus.publish_many(items)
        self.metrics.node_events_total.labels("inventory").inc(len(items))

    async def tick(self) -> None:
        """Sample once and publish; one call of the loop (tests may call it directly)."""
        started = time.perf_counter()
        out = await self._source.tick()
        if out.nvml_errors:
            self.metrics.nvml_errors_total.inc(out.nvml_errors)
        if out.inventories:
            await self._publish_inventories(list(out.inventories))
        at = self._clock.now()
        items: list[tuple[str, Event]] = []
        gpus = 0
        for sample in out.samples:
            self.dcgm.update(sample)
            items.append((self._subject(sample.node, "sample"), sample_batch_event(sample, at)))
            gpus += len(sample.gpus)
        # Health changes are reported once by the poller: one that a failed tick did not publish
        # stays pending (with its id, so a partial publish repeats as a duplicate) until one does.
        self._pending_health += [
            (self._subject(c.node, "health"), gpu_health_event(c, at)) for c in out.health
        ]
        health = list(self._pending_health)
        for c in out.health:
            log.warning(
                "gpu_health_changed",
                node=c.node,
                gpu_index=c.index,
                healthy=c.healthy,
                reasons=list(c.reasons),
            )
        await self._rt.bus.publish_many(health + items)
        self._pending_health.clear()
        self.metrics.gpu_samples_total.inc(gpus)
        self.metrics.node_events_total.labels("sample").inc(len(items))
        self.metrics.node_events_total.labels("health").inc(len(health))
        self.metrics.tick_seconds.observe(time.perf_counter() - started)

    async def _tick_loop(self) -> None:
        tick_s = self._settings.tick_s
        next_at = self._clock.monotonic()
        next_inventory_at = next_at + self._settings.inventory_interval_s
        while True:
            try:
                if self._clock.monotonic() >= next_inventory_at:
                    next_inventory_at += self._settings.inventory_interval_s
                    await self._publish_inventories(self._source.inventories())
                await self.tick()
                self.metrics.ticks_total.labels("ok").inc()
            except _TRANSIENT as exc:
                self.metrics.ticks_total.labels("publish_failed").inc()
                log.warning("tick_publish_failed", error=repr(exc))
            next_at += tick_s
            now = self._clock.monotonic()
            if now > next_at:
                # Late: start the next tick now and keep the cadence from here, rather than
                # bursting to catch up with ticks whose moment has passed.
                self.metrics.tick_overruns_total.inc()
                next_at = now
            await self._clock.sleep(next_at - now)
