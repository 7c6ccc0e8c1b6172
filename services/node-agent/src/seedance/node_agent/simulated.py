"""The telemetry of a node's simulated GPUs (development clusters), published on the bus.

Owns the loop that, where the agent serves simulated GPUs (``SEEDANCE_NODE_AGENT_SIMULATED_GPUS``),
publishes what a telemetry collector would for the node: its inventory (at start, then every
``inventory_interval_s``, so a slicer started later finds it: the telemetry stream keeps an
hour) with the Node's own allocatable CPU and memory read from the API server, and a sample
every ``sample_interval_s`` that follows the slicer's placements on the node
(``core.simulated``). An inventory whose publish failed is re-sent on the next tick as the same
event, with its id (random: only that event can be dropped as its duplicate, should the first
send have been stored after all), while this process runs (a restarted agent builds a new
one); a lost sample is not re-sent. Only this node's: the subjects
carry its token, as every publisher that is not a tenant speaks only for what it observes. It
must not publish for any other node, nor decide anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.core.bus import TRANSIENT_BUS_ERRORS, Bus
from seedance.core.clock import Clock
from seedance.core.logs import get_logger
from seedance.events.slicing import Placement
from seedance.events.subjects import telemetry
from seedance.events.telemetry import NodeInventory
from seedance.events.tokens import kube_node_token
from seedance.node_agent.core.simulated import SimulatedGpus
from seedance.node_agent.kube import ThisNode, node_cpu_memory
from seedance.node_agent.metrics import NodeAgentMetrics

__all__ = ["SimulatedTelemetry"]

log = get_logger(__name__)

#: What a tick may meet and survive: the bus or the API server (the inventory reads the Node)
#: down or slow.
_TRANSIENT: tuple[type[BaseException], ...] = (
    *TRANSIENT_BUS_ERRORS,
    ApiException,
    aiohttp.ClientError,
)


class SimulatedTelemetry:
    def __init__(
        self,
        bus: Bus,
        gpus: SimulatedGpus,
        node: ThisNode,
        placements: Callable[[], Iterable[Placement]],
        *,
        clock: Clock,
        metrics: NodeAgentMetrics,
        sample_interval_s: float,
        inventory_interval_s: float = 900.0,
    ) -> None:
        self._bus = bus
        self._gpus = gpus
        self._node = node
        self._placements = placements
        self._clock = clock
        self._metrics = metrics
        self._sample_s = sample_interval_s
        self._inventory_s = inventory_interval_s
        token = kube_node_token(gpus.node)
        self._inventory_subject = telemetry.inventory(token)
        self._sample_subject = telemetry.sample(token)
        #: The inventory built and not yet acknowledged: a retry re-sends it, with its id.
        self._unsent: NodeInventory | None = None

    async def publish_inventory(self) -> None:
        event = self._unsent
        if event is None:
            cpu, memory = node_cpu_memory(await self._node.get())
            event = self._gpus.inventory(self._clock.now(), cpu_milli=cpu, memory_mib=memory)
            self._unsent = event
        await self._bus.publish(self._inventory_subject, event)
        self._unsent = None
        self._metrics.simulated_events_total.labels("inventory").inc()
        log.info(
            "simulated_inventory_published",
            node=event.node,
            gpus=len(event.gpus),
            model=self._gpus.model,
            cpu_milli=event.cpu_milli,
            memory_mib=event.memory_mib,
        )

    async def publish_sample(self) -> None:
        event = self._gpus.samples(self._clock.now(), self._placements())
        await self._bus.publish(self._sample_subject, event)
        self._metrics.simulated_events_total.labels("sample").inc()

    async def run(self) -> None:
        """Samples every ``sample_interval_s``, the inventory again every
        ``inventory_interval_s`` (the first is the caller's, at start)."""
        next_inventory = self._clock.monotonic() + self._inventory_s
        while True:
            try:
                await self.publish_sample()
                if self._clock.monotonic() >= next_inventory:
                    await self.publish_inventory()
                    next_inventory += self._inventory_s
            except _TRANSIENT as exc:
                # A sample is worth anything only fresh: a lost one is not re-sent, the next
                # tick publishes anew (an inventory that failed is tried again on it: the same
                # event where the bus failed, a new one where the API server's read did).
                log.warning("simulated_publish_failed", error=repr(exc))
            await self._clock.sleep(self._sample_s)
