"""A new leader's restore keeps its lease: the slicer's state is rebuilt off the event loop.

At 50,000 running jobs the scheduler's rebuild is ~7 s of CPU work; run on the event loop it
stopped the lease's refresh for as long, and bench-scale's slicer lost its lease over it. Here
the rebuild is held open (a gate) until the server has acknowledged two refreshes of the lease
made while it runs: a restore that blocks the loop never lets them happen, and the gate gives
up (the test fails). Real nats-server, the slicer's shipped user, its state bucket and leases.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.state_store import StateStore
from seedance.slicer import durable as slicer_durable
from seedance.slicer.core import (
    GpuSpec,
    JobSpec,
    NodeSpec,
    Scheduler,
    SchedulerConfig,
    SchedulerSnapshot,
)
from seedance.slicer.durable import SlicerState
from seedance.testing.waits import stop_task
from tests.integration.conftest import shipped_password

#: How long the gated rebuild waits for the refreshes before it gives up.
GATE_S = 20.0


async def state(rt: ServiceRuntime, key: str) -> SlicerState:
    """The pool's state under `key`, as the slicer opens it."""
    store = await StateStore.open(rt.bus, "seedance-slicer-state", key)
    return SlicerState(store, legacy_key=key, config=SchedulerConfig(), parse_quota=lambda _: None)


async def an_earlier_leaders_pool(rt: ServiceRuntime, key: str) -> SchedulerSnapshot:
    """A pool committed under `key` (8 nodes, 40 jobs); its scheduler's snapshot."""
    first = await state(rt, key)
    await first.load()
    for n in range(8):
        gpus = tuple(GpuSpec(model="NVIDIA T4", mem_mib=16_384) for _ in range(4))
        first.scheduler.upsert_node(
            NodeSpec(name=f"n{n}", cpu_milli=64_000, memory_mib=256_000, gpus=gpus), 1.0
        )
    for j in range(40):
        job = JobSpec(job_id=f"j{j}", tenant="t", cause_id=f"c{j}", gpus=1, gpu_milli=1000)
        first.scheduler.submit(job, 2.0 + j)
    await first.commit()
    await first.store.close()
    return first.scheduler.snapshot()


class GatedScheduler(Scheduler):
    """A rebuild that lasts until `gate` opens (or `GATE_S` passes): a long restore."""

    gate = threading.Event()
    opened: ClassVar[list[bool]] = []

    @classmethod
    def from_entries(cls, entries: Mapping[str, bytes], *args: Any, **kw: Any) -> Any:
        cls.opened.append(cls.gate.wait(GATE_S))
        return super().from_entries(entries, *args, **kw)


async def test_a_long_restore_lets_the_lease_refresh_meanwhile(
    nats_url: str, unique: str, monkeypatch: Any
) -> None:
    rt = ServiceRuntime("slicer", BusSettings(url=nats_url, name="test-restore-lease"))
    await rt.start()
    keeper: asyncio.Task[None] | None = None
    try:
        key = f"pool.r{unique}"
        written = await an_earlier_leaders_pool(rt, key)

        leases = await ensure_bucket(rt.bus, "seedance-leases")
        lease_key = f"slicer.r{unique}"
        lease = Lease(leases, lease_key, "b", WallClock(), ttl_s=0.3)  # a refresh every 0.1 s
        keeper = asyncio.create_task(lease.keep())
        await lease.acquired.wait()
        before = (await leases.get(lease_key)).revision
        assert before is not None

        # The server's own record of the lease, watched as an operator: the slicer's user may
        # write and get its lease keys but not watch the leases bucket (review2 finding 7).
        admin = await Bus.connect(
            BusSettings(url=nats_url, user="admin", password=shipped_password("admin"))
        )
        admin_leases = await ensure_bucket(admin, "seedance-leases")

        async def open_after_two_refreshes() -> None:
            watcher = await admin_leases.watch(lease_key)
            try:
                async for entry in watcher:
                    if entry is not None and (entry.revision or 0) >= before + 2:
                        GatedScheduler.gate.set()
                        return
            finally:
                await watcher.stop()  # type: ignore[no-untyped-call]  # nats-py's own

        GatedScheduler.gate.clear()
        GatedScheduler.opened.clear()
        monkeypatch.setattr(slicer_durable, "Scheduler", GatedScheduler)
        second = await state(rt, key)
        opener = asyncio.create_task(open_after_two_refreshes())
        try:
            await second.load()
        finally:
            await stop_task(opener)  # a KV watch: one cancel can be lost
            GatedScheduler.gate.set()
            await admin.close()
        await second.store.close()

        assert GatedScheduler.opened == [True], "the lease was not refreshed during the restore"
        assert lease.held
        assert second.scheduler.snapshot() == written
    finally:
        if keeper is not None:
            await stop_task(keeper)  # the lease refresh: one cancel can be lost
        await rt.close()
