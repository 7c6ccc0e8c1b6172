"""A slicer whose leading work dies (its lease keeper's defect, raised through ``guarded``)
ends for certain and says so at once: its side tasks (the quota watch, the usage write: they
publish, and nats-py can drop one cancel) are cancelled until they end, and the runtime is
marked failed (/readyz 503) as the cancel unwinds it.

Before, the TaskGroup cancelled the side tasks once: one that lost that cancel kept ``run``
(and the process) up for good, not leading; and the runtime, cancelled rather than failed,
stayed ready."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from seedance.core import BusSettings, ServiceRuntime, WallClock
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.waits import eventually, stop_task


async def test_a_leader_whose_keeper_dies_ends_for_certain_and_is_not_ready(
    nats_url: str, unique: str
) -> None:
    settings = SlicerSettings(pool=f"p{unique}", replica="a", lease_ttl_s=1.5, batch=50)
    runtime = ServiceRuntime("slicer", BusSettings(url=nats_url, name="test-slicer-a"))
    svc = SlicerService.build(runtime, WallClock(), settings)
    await svc.start()
    assert svc.quota.kv is not None  # the usage write runs beside the leader
    cancels = 0

    async def deaf_usage_loop(stopping: asyncio.Event) -> None:
        """The usage write, losing the first cancel as a nats-py publish can."""
        nonlocal cancels
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancels += 1
        await asyncio.Event().wait()  # ends only at a second cancel

    async def dying() -> None:
        """The leading work, once serving: its lease keeper dies of a defect."""
        await eventually(runtime.ready, 10, what="the runtime serving")
        raise RuntimeError("lease keeper defect")

    svc.quota.usage_loop = deaf_usage_loop  # type: ignore[method-assign]
    svc.durable.run = dying  # type: ignore[method-assign]
    task = asyncio.create_task(svc.run())
    try:
        await eventually(task.done, 10, what="run ended after the keeper died")
        assert cancels == 1  # it did lose one cancel, and still ended
        assert not runtime.ready()  # /readyz 503 until the process has exited
        with pytest.raises(ExceptionGroup) as err:
            task.result()
        assert err.group_contains(RuntimeError, match="lease keeper defect")
    finally:
        if not task.done():  # (it hung: ended here, with whatever error it has)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await stop_task(task)
        await svc.close()
