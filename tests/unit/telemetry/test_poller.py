"""Poller: cadences on a virtual clock, merge of slow fields, health changes, resilience."""

from __future__ import annotations

import asyncio

import msgspec
import pynvml
from constructed import h100_nvlink_xid

from seedance.core.clock import VirtualClock
from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.poller import Poller
from seedance.telemetry_collector.recording import ReplayNvmlApi
from seedance.telemetry_collector.sample import GpuSample, GpuSlowReading, NodeInventory


class CountingBackend:
    def __init__(self, fail_slow: bool = False) -> None:
        self.fast = 0
        self.slow = 0
        self.fail_slow = fail_slow
        self.closed = 0

    def inventory(self) -> NodeInventory:
        return NodeInventory(node="n", gpus=())

    def sample_fast(self, now_monotonic_s: float | None = None) -> tuple[GpuSample, ...]:
        self.fast += 1
        return (GpuSample(index=0, uuid="GPU-0", power_w=float(self.fast)),)

    def sample_slow(self, now: float) -> tuple[GpuSlowReading, ...]:
        self.slow += 1
        if self.fail_slow:
            raise RuntimeError("driver hiccup")
        return (GpuSlowReading(index=0, read_at_monotonic_s=now, energy_j=float(self.slow)),)

    def close(self) -> None:
        self.closed += 1


async def test_slow_fields_run_on_their_own_cadence() -> None:
    clock = VirtualClock()
    backend = CountingBackend()
    poller = Poller(backend, clock, node="n", slow_interval_s=5.0)
    await poller.start()
    energies = []
    for _ in range(11):
        result = await poller.tick()
        await poller.settle()
        energies.append(result.sample.gpus[0].energy_j)
        await clock.advance(1.0)
    assert backend.fast == 11
    assert backend.slow == 3  # t = 0, 5, 10
    # A slow read runs beside its tick's fast read and may land in that tick or the next;
    # every later tick carries the latest one.
    assert energies[0] in (None, 1.0)
    assert energies[1:5] == [1.0] * 4
    assert energies[5] in (1.0, 2.0)
    assert energies[6:10] == [2.0] * 4
    await poller.close()
    await poller.close()
    assert backend.closed == 1


async def test_slow_failure_does_not_stop_the_poller() -> None:
    clock = VirtualClock()
    backend = CountingBackend(fail_slow=True)
    poller = Poller(backend, clock, node="n", slow_interval_s=5.0)
    await poller.start()
    for _ in range(3):
        result = await poller.tick()
        await poller.settle()
        await clock.advance(1.0)
    assert result.sample.gpus[0].power_w == 3.0
    assert result.sample.gpus[0].energy_j is None
    assert backend.slow >= 2  # retried, not given up
    await poller.close()


async def test_xid_and_lost_gpu_become_health_changes() -> None:
    clock = VirtualClock()
    api = ReplayNvmlApi(h100_nvlink_xid())
    poller = Poller(NvmlBackend("node-1", api), clock, node="node-1", slow_interval_s=1.0)
    inv = await poller.start()
    assert len(inv.gpus) == 2
    first = await poller.tick()
    assert first.inventory == inv  # the inventory goes out with the first tick
    assert first.health_changes == ()
    changes = []
    for _ in range(4):
        await poller.settle()
        await clock.advance(1.0)
        result = await poller.tick()
        changes.extend(result.health_changes)
    assert [(c.index, c.healthy, c.reasons) for c in changes] == [(1, False, ("xid_79",))]
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], err=pynvml.NVML_ERROR_GPU_IS_LOST)
    await clock.advance(1.0)
    result = await poller.tick()
    assert [(c.index, c.healthy) for c in result.health_changes] == [(0, False)]
    assert "gpu_lost" in result.health_changes[0].reasons
    # The inventory was re-read and the GPU answered again, so the next tick is healthy.
    await clock.advance(1.0)
    result = await poller.tick()
    assert [(c.index, c.healthy) for c in result.health_changes] == [(0, True)]
    await poller.close()


async def test_ticks_do_not_block_the_event_loop() -> None:
    """NVML runs in a thread: another coroutine makes progress while a tick is in flight."""
    clock = VirtualClock()
    gate = asyncio.Event()

    class Slow(CountingBackend):
        def sample_fast(self, now_monotonic_s: float | None = None) -> tuple[GpuSample, ...]:
            fut = asyncio.run_coroutine_threadsafe(gate.wait(), loop)
            fut.result(timeout=5)
            return super().sample_fast(now_monotonic_s)

    loop = asyncio.get_running_loop()
    poller = Poller(Slow(), clock, node="n")
    await poller.start()
    tick = asyncio.create_task(poller.tick())
    await asyncio.sleep(0)
    assert not tick.done()
    gate.set()  # only possible because the loop is free while the backend works
    result = await asyncio.wait_for(tick, timeout=5)
    assert result.sample.gpus[0].power_w == 1.0
    await poller.close()


async def test_sample_encodes_as_an_event_payload() -> None:
    clock = VirtualClock()
    poller = Poller(NvmlBackend("node-1", ReplayNvmlApi(h100_nvlink_xid())), clock, node="node-1")
    await poller.start()
    result = await poller.tick()
    await poller.close()
    payload = msgspec.msgpack.encode(result.sample)
    assert msgspec.msgpack.decode(payload, type=type(result.sample)) == result.sample
    assert result.sample.sampled_at_unix_s == clock.now().timestamp()
