"""The poller: runs a ``GpuBackend`` off the event loop on two cadences and tracks health.

Owns the tick: cheap fields every tick, expensive fields (energy, ECC, XID, GPM) when their
slower cadence is due, merged into one ``NodeSample``; health changes between ticks; and
re-reading the inventory when a GPU is lost. Backend calls run in a thread executor, because an
NVML energy or field-value read takes ~3 ms median and 15 ms p99 on an H200, which must never
stall the event loop. Time comes from an injected ``seedance.core.clock.Clock`` (the service's
own). It must not publish, sleep or decide the tick rate: the service calls ``tick()`` when its
clock says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Executor, ThreadPoolExecutor

import msgspec

from seedance.core.clock import Clock
from seedance.telemetry_collector.backend import GpuBackend
from seedance.telemetry_collector.sample import (
    GpuSlowReading,
    HealthChange,
    NodeInventory,
    NodeSample,
    merge_slow,
    slow_updates,
)

__all__ = ["PollResult", "Poller"]


class PollResult(msgspec.Struct, frozen=True, kw_only=True):
    """One tick's output: the sample, any health flips, and the inventory if it is new."""

    sample: NodeSample
    health_changes: tuple[HealthChange, ...] = ()
    inventory: NodeInventory | None = None


class Poller:
    """Poll a backend: ``await start()`` once, then ``await tick()`` on each tick.

    ``slow_interval_s`` is the cadence of the expensive reads. A slow read runs in the
    background and its result is merged into the ticks after it lands, so a tick never waits
    for it; ``settle()`` waits for one in flight (shutdown, tests).

    ``fast_inline=True`` makes the fast read on the event loop's own thread instead of the
    executor: it is two NVML calls per GPU (about 0.1 ms), and handing it to a thread wakes
    two more threads every tick, each wake-up costing CPU of its own. The slow read always
    runs in the executor (milliseconds).
    """

    def __init__(
        self,
        backend: GpuBackend,
        clock: Clock,
        *,
        node: str,
        slow_interval_s: float = 10.0,
        executor: Executor | None = None,
        simulated: bool = False,
        fast_inline: bool = False,
    ) -> None:
        if slow_interval_s <= 0:
            raise ValueError(f"slow_interval_s must be > 0, got {slow_interval_s!r}")
        self._backend = backend
        self._closed = False  # the backend's close() has been called
        self._clock = clock
        self._node = node
        self._slow_interval_s = slow_interval_s
        self._own_executor = executor is None
        # Two workers: a slow read (milliseconds) must not hold up the next fast read.
        self._executor = executor or ThreadPoolExecutor(2, thread_name_prefix="nvml")
        self._simulated = simulated
        self._fast_inline = fast_inline
        self._slow: dict[int, GpuSlowReading] = {}
        self._slow_updates: dict[int, dict[str, object]] = {}  # merge_slow's, per reading
        self._slow_task: asyncio.Future[tuple[GpuSlowReading, ...]] | None = None
        self._next_slow_s: float | None = None
        self._healthy: dict[int, tuple[str, bool]] = {}
        self._inventory: NodeInventory | None = None
        self._inventory_pending: NodeInventory | None = None

    @property
    def inventory(self) -> NodeInventory | None:
        return self._inventory

    async def start(self) -> NodeInventory:
        loop = asyncio.get_running_loop()
        inv = await loop.run_in_executor(self._executor, self._backend.inventory)
        self._inventory = self._inventory_pending = inv
        return inv

    async def tick(self) -> PollResult:
        loop = asyncio.get_running_loop()
        now = self._clock.monotonic()
        self._collect_slow()
        if self._slow_task is None and (self._next_slow_s is None or now >= self._next_slow_s):
            self._next_slow_s = now + self._slow_interval_s
            self._slow_task = loop.run_in_executor(self._executor, self._backend.sample_slow, now)
        if self._fast_inline:
            fast = self._backend.sample_fast(now)
        else:
            fast = await loop.run_in_executor(self._executor, self._backend.sample_fast, now)
        self._collect_slow()
        now = self._clock.monotonic()
        slow, updates = self._slow, self._slow_updates
        gpus = tuple(merge_slow(g, slow.get(g.index), now, updates.get(g.index)) for g in fast)
        at = self._clock.now().timestamp()
        sample = NodeSample(
            node=self._node, sampled_at_unix_s=at, gpus=gpus, simulated=self._simulated
        )
        changes = self._health_changes(sample)
        if any(not c.healthy and "gpu_lost" in c.reasons for c in changes):
            await self._refresh_inventory()
        inv, self._inventory_pending = self._inventory_pending, None
        return PollResult(sample=sample, health_changes=changes, inventory=inv)

    def _collect_slow(self) -> None:
        task = self._slow_task
        if task is None or not task.done():
            return
        self._slow_task = None
        if task.exception() is not None:
            # An unexpected NVML failure in the slow path: keep the last good slow reading
            # and let the next cadence try again; the fast path carries health on its own.
            self._next_slow_s = self._clock.monotonic()
            return
        for reading in task.result():
            self._slow[reading.index] = reading
            self._slow_updates[reading.index] = slow_updates(reading)

    def _health_changes(self, sample: NodeSample) -> tuple[HealthChange, ...]:
        changes = []
        for g in sample.gpus:
            before = self._healthy.get(g.index)
            self._healthy[g.index] = (g.uuid, g.healthy)
            if before is None:
                if g.healthy:
                    continue  # a healthy first sight is not a change
            elif before == (g.uuid, g.healthy):
                continue
            changes.append(
                HealthChange(
                    node=self._node,
                    index=g.index,
                    uuid=g.uuid,
                    healthy=g.healthy,
                    reasons=g.health_reasons,
                    at_unix_s=sample.sampled_at_unix_s,
                )
            )
        return tuple(changes)

    async def _refresh_inventory(self) -> None:
        loop = asyncio.get_running_loop()
        inv = await loop.run_in_executor(self._executor, self._backend.inventory)
        if inv != self._inventory:
            self._inventory = self._inventory_pending = inv

    async def settle(self) -> None:
        """Wait for a slow read in flight and merge it."""
        if self._slow_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._slow_task)
            self._collect_slow()

    async def close(self) -> None:
        """Idempotent: wait for work in flight, close the backend, stop owned threads."""
        await self.settle()
        loop = asyncio.get_running_loop()
        if not self._closed:
            self._closed = True
            await loop.run_in_executor(self._executor, self._backend.close)
        if self._own_executor:
            self._executor.shutdown(wait=True)
            self._own_executor = False
