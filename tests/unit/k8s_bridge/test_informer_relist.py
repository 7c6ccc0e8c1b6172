"""The informer (`seedance.k8s_bridge.watch.Informer`) on a virtual clock: a watch's 410 lists
again at once, but a list that itself ends in 410 (its continue token kept expiring past
`kube.LIST_ATTEMPTS` restarts) backs off before listing again, rather than spinning."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from seedance.core import VirtualClock
from seedance.k8s_bridge.kube import ApiStatus
from seedance.k8s_bridge.watch import Informer

NODE = {"metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7"}}


class SleepWatchingClock(VirtualClock):
    """A virtual clock that tells when someone sleeps on it, and for how long."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self.slept = asyncio.Event()

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.slept.set()
        await super().sleep(seconds)


async def test_a_list_that_ends_in_410_backs_off_before_listing_again() -> None:
    clock = SleepWatchingClock()
    lists: list[str] = []
    seen: list[tuple[str, str]] = []

    async def lister(selector: str) -> dict[str, Any]:
        lists.append(selector)
        if len(lists) == 1:
            raise ApiStatus(410, "Expired", "the continue token kept expiring")
        return {"metadata": {"resourceVersion": "7"}, "items": [NODE]}

    async def watcher(selector: str, rv: str, timeout_s: int) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()  # a watch with nothing to say
        yield {}

    informer = Informer(
        "nodes", lister, watcher, lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        clock, backoff_initial_s=1.0,
    )  # fmt: skip
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(clock.slept.wait(), 5)
        assert clock.sleeps == [1.0]
        assert len(lists) == 1  # not listed again before the backoff
        assert not informer.synced.is_set()
        await clock.advance(1.0)
        await asyncio.wait_for(informer.synced.wait(), 5)
        assert len(lists) == 2
        assert seen == [("ADDED", "n1")]
        assert informer.resource_version == "7"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
