"""Where the collector's samples come from: a replayed fleet, or this node's GPUs through NVML.

Owns the two sources behind the service's tick. ``ReplaySource`` holds the ``FleetSim`` and
turns placements, preemptions and job ends (as decoded events) into its shares; ``NvmlSource``
holds the ``Poller`` over an ``NvmlBackend`` (real or recorded). Both answer ``start()`` with the
inventory and ``tick()`` with one ``TickOutput``. They must not publish or sleep: the service
publishes their output on its clock.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pynvml

from seedance.core import Clock
from seedance.core.errors import RetryableError
from seedance.core.logs import get_logger
from seedance.events.slicing import Placement
from seedance.events.tokens import InvalidToken, kube_node_token
from seedance.telemetry_collector.fleet import FleetSim, load_node_list
from seedance.telemetry_collector.mapping import placement_shares
from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.poller import Poller
from seedance.telemetry_collector.recording import ReplayNvmlApi, load_recording
from seedance.telemetry_collector.sample import HealthChange, NodeInventory, NodeSample
from seedance.telemetry_collector.settings import ENV_PREFIX, CollectorSettings

__all__ = [
    "HostedInventory",
    "NvmlSource",
    "PlacementOutcome",
    "ReplaySource",
    "Source",
    "TickOutput",
    "build_source",
]

log = get_logger(__name__)

#: Placement outcomes, a closed set (a metric label).
PlacementOutcome = str
APPLIED, DUPLICATE, FOREIGN_NODE, NO_GPUS = "applied", "duplicate", "foreign_node", "no_gpus"


@dataclass(frozen=True, slots=True)
class HostedInventory:
    """A node's GPUs with what the bus event also needs: the host's CPU, memory and pool."""

    inventory: NodeInventory
    cpu_milli: int
    memory_mib: int
    pool: str = "default"


@dataclass(frozen=True, slots=True)
class TickOutput:
    samples: Sequence[NodeSample]
    inventories: Sequence[HostedInventory] = ()
    health: Sequence[HealthChange] = ()
    #: NVML errors seen this tick (GPUs with an undocumented error, failed polls).
    nvml_errors: int = 0


class Source:
    """What the service needs of a source."""

    simulated: bool

    async def start(self) -> list[HostedInventory]:
        raise NotImplementedError

    def inventories(self) -> list[HostedInventory]:
        raise NotImplementedError

    async def tick(self) -> TickOutput:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


def _job_key(tenant: str, job_id: str) -> str:
    # Job ids are unique per tenant only.
    return f"{tenant}/{job_id}"


class ReplaySource(Source):
    """The simulated fleet; its GPUs follow the placements applied to it."""

    simulated = True

    def __init__(self, fleet: FleetSim, clock: Clock) -> None:
        self.fleet = fleet
        self._clock = clock
        self._held: dict[str, list[str]] = {}  # job key → its fleet placement ids

    async def start(self) -> list[HostedInventory]:
        return self.inventories()

    def inventories(self) -> list[HostedInventory]:
        return [
            HostedInventory(inv, node.cpu_milli, node.memory_mib)
            for inv, node in zip(self.fleet.inventory(), self.fleet.nodes, strict=True)
        ]

    async def tick(self) -> TickOutput:
        # Pure numpy work of a few ms for the 6,212-GPU fleet: cheaper inline than in a thread.
        return TickOutput(samples=self.fleet.sample(self._clock.now().timestamp()))

    async def close(self) -> None:
        return None

    def apply(self, p: Placement) -> PlacementOutcome:
        """Apply a placement on this fleet (idempotent per job).

        Raises ``RetryableError`` when the GPUs are still taken: the end of the job that held
        them travels on another stream and may not have been read yet.
        """
        if not self.fleet.has_node(p.node):
            return FOREIGN_NODE  # another collector's node (a real one, another fleet)
        if not p.gpus:
            return NO_GPUS
        key = _job_key(p.tenant, p.job_id)
        if key in self._held:
            return DUPLICATE
        shares = placement_shares(
            p.gpus,
            self.fleet.mem_total_mib(p.node),
            # The placement names no GPU memory and the collector reads no tenant job event
            # (trusted facts only): each share gets its part of the GPU's memory.
            self.fleet.free_mem_mib(p.node),
        )
        free = self.fleet.free_milli(p.node)
        if any(free[i] < s.gpu_milli for s in shares for i in s.gpu_indices):
            raise RetryableError(f"{p.node} GPUs {[g.index for g in p.gpus]} still held")
        ids = []
        for n, s in enumerate(shares):
            pid = f"{key}#{n}"
            self.fleet.apply_placement(pid, p.node, s.gpu_indices, s.gpu_milli, s.mem_mib_per_gpu)
            ids.append(pid)
        self._held[key] = ids
        return APPLIED

    def release(self, tenant: str, job_id: str) -> bool:
        """Release a job's GPUs (preempted or released); False if it held none here."""
        key = _job_key(tenant, job_id)
        ids = self._held.pop(key, None)
        for pid in ids or ():
            self.fleet.release(pid)
        return ids is not None


class NvmlSource(Source):
    """This node's GPUs through the ``Poller`` (NVML off the event loop, two cadences)."""

    simulated = False

    def __init__(
        self, poller: Poller, *, cpu_milli: int, memory_mib: int, pool: str = "default"
    ) -> None:
        self.poller = poller
        self.cpu_milli = cpu_milli
        self.memory_mib = memory_mib
        self.pool = pool
        self._hosted: list[HostedInventory] = []

    async def start(self) -> list[HostedInventory]:
        try:
            inventory = await self.poller.start()
        except pynvml.NVMLError as exc:
            raise RuntimeError(
                f"NVML could not be started ({exc}): is the NVIDIA driver installed and "
                "libnvidia-ml.so visible? Without a GPU, set "
                f"{ENV_PREFIX}NVML_RECORDING to a recording"
            ) from exc
        self._hosted = [self._host(inventory)]
        return self._hosted

    def inventories(self) -> list[HostedInventory]:
        return list(self._hosted)

    def _host(self, inv: NodeInventory) -> HostedInventory:
        return HostedInventory(inv, self.cpu_milli, self.memory_mib, self.pool)

    async def tick(self) -> TickOutput:
        try:
            result = await self.poller.tick()
        except pynvml.NVMLError as exc:
            # Re-reading the inventory after a loss can fail outright (driver trouble); the
            # node is still there, so the collector carries on and tries on the next tick.
            log.warning("nvml_poll_failed", error=str(exc))
            return TickOutput(samples=(), nvml_errors=1)
        gpus = result.sample.gpus
        errors = sum(1 for g in gpus if any(r.startswith("nvml_error_") for r in g.health_reasons))
        inventories: list[HostedInventory] = []
        if result.inventory is not None:
            self._hosted = inventories = [self._host(result.inventory)]
        return TickOutput(
            samples=(result.sample,),
            inventories=inventories,
            health=result.health_changes,
            nvml_errors=errors,
        )

    async def close(self) -> None:
        await self.poller.close()


def _host_resources() -> tuple[int, int]:
    """This host's CPUs (milli) and memory (MiB), for the inventory."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return (cpus or 0) * 1000, mem_bytes // (1024 * 1024)


def build_source(settings: CollectorSettings, clock: Clock) -> Source:
    """The source the settings ask for. Raises ``ValueError`` naming a file that is unusable."""
    prefix = ENV_PREFIX
    if settings.source == "replay":
        path = Path(settings.node_csv)
        if not path.is_file():
            raise ValueError(f"{prefix}NODE_CSV={settings.node_csv!r}: no such file")
        nodes = load_node_list(path, settings.max_nodes)
        if not nodes:
            raise ValueError(f"{prefix}NODE_CSV={settings.node_csv!r}: no GPU nodes in it")
        return ReplaySource(FleetSim(nodes), clock)
    node = settings.node_name or socket.gethostname().split(".")[0]
    try:
        node = kube_node_token(node)
    except InvalidToken as exc:
        raise ValueError(f"{exc}: set {prefix}NODE_NAME") from None
    api = None
    if settings.nvml_recording:
        path = Path(settings.nvml_recording)
        if not path.is_file():
            raise ValueError(f"{prefix}NVML_RECORDING={settings.nvml_recording!r}: no such file")
        api = ReplayNvmlApi(load_recording(path))
    poller = Poller(
        NvmlBackend(
            node,
            api,
            costly_interval_s=settings.costly_interval_s,
            power_interval_s=settings.power_interval_s,
        ),
        clock,
        node=node,
        slow_interval_s=settings.slow_interval_s,
        # Two NVML calls per GPU: on the loop's thread, not handed to the executor, which
        # cost the collector 11.1 against 5.4-6.1 ms of CPU per GPU-second on an H200 at 10 Hz.
        fast_inline=True,
    )
    cpu_milli, memory_mib = _host_resources()
    return NvmlSource(poller, cpu_milli=cpu_milli, memory_mib=memory_mib, pool=settings.pool)
