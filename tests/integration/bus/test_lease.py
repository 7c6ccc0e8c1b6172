"""The leader lease on a real JetStream bucket: a holder that lets go frees the key at once;
a refresh that fails on the bus is tried again, and the lease lost only by the key or its TTL."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats.errors
import pytest
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from seedance.core import Bus, BusSettings, VirtualClock, WallClock
from seedance.core.kv import Lease, ensure_bucket
from seedance.testing.waits import eventually, stop_task


@pytest.mark.parametrize("moved_by", ["own refresh", "another holder"])
async def test_release_after_a_refresh_that_landed_unseen(bus: Bus, moved_by: str) -> None:
    # A refresh cancelled in flight can land on the server after the lease stopped waiting
    # for it: the key is then one revision ahead of the one the lease knows. Releasing must
    # neither raise (that used to crash the slicer's shutdown) nor delete someone else's key.
    kv = await ensure_bucket(bus, "seedance-leases")
    key = f"test.{uuid.uuid4().hex[:8]}"
    lease = Lease(kv, key, "a", WallClock(), ttl_s=3.0)
    assert await lease.try_acquire()
    holder = b"a" if moved_by == "own refresh" else b"b"
    entry = await kv.get(key)
    await kv.update(key, holder, last=entry.revision)

    await lease.release()

    assert not lease.held
    if moved_by == "own refresh":
        with pytest.raises(KeyNotFoundError):
            await kv.get(key)
    else:
        assert (await kv.get(key)).value == b"b"


async def test_release_without_a_server_leaves_the_key_to_its_ttl(nats_url: str) -> None:
    # A service stopping after its server went away must stop cleanly (the lease task's
    # `finally` releases): the error is logged, not raised over the service's own shutdown.
    bus = await Bus.connect(BusSettings(url=nats_url, name="lease-test"))
    kv = await ensure_bucket(bus, "seedance-leases")
    lease = Lease(kv, f"test.{uuid.uuid4().hex[:8]}", "a", WallClock(), ttl_s=3.0)
    assert await lease.try_acquire()
    await bus.close()

    await lease.release()

    assert not lease.held


class TimesOut:
    """The real leases bucket; while ``failing`` > 0 each refresh raises a timeout, as a reply
    lost on a flaky link does: before it reaches the server, or after it ``lands``."""

    def __init__(self, kv: KeyValue, *, lands: bool = False) -> None:
        self._kv = kv
        self.lands = lands
        self.failing = 0
        self.failed = 0
        #: The revisions refreshes wrote (one that landed and then timed out included).
        self.written: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.failing and not self.lands:
            self.failing -= 1
            self.failed += 1
            raise nats.errors.TimeoutError
        rev: int = await self._kv.update(key, value, last=last)
        self.written.append(rev)
        if self.failing:
            self.failing -= 1
            self.failed += 1
            raise nats.errors.TimeoutError
        return rev


class Periods(VirtualClock):
    """A virtual clock that counts its sleeps: the keeper sleeps once a period, so a test that
    advances one period and waits for the next sleep has seen exactly one refresh attempt."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1  # in the same step as the wake time is taken: no advance is missed
        await super().sleep(seconds)

    async def period(self) -> None:
        """One refresh period (1 s) on; returns once the keeper is asleep again."""
        n = self.sleeps + 1
        await self.advance(1.0)
        await eventually(lambda: self.sleeps >= n, 10, what=f"the keeper's sleep {n}")


async def _kept(flaky: TimesOut, clock: Periods) -> tuple[Lease, asyncio.Task[None]]:
    """A lease (ttl 3 s: a refresh each virtual second) acquired by its running keeper, which
    is asleep until the first period."""
    lease = Lease(flaky, f"test.{uuid.uuid4().hex[:8]}", "a", clock, ttl_s=3.0)  # type: ignore[arg-type]
    keeper = asyncio.create_task(lease.keep())
    await eventually(lambda: clock.sleeps == 1, 10, what="the keeper acquired the lease")
    assert lease.held
    return lease, keeper


@pytest.mark.parametrize("lands", [False, True], ids=["lost", "landed"])
async def test_a_refresh_that_times_out_once_keeps_the_lease(bus: Bus, lands: bool) -> None:
    # A keeper that ended on the first timeout released the key and stopped: the runtime's
    # leader stepped down, and with no keeper left it stayed on standby for good.
    kv = await ensure_bucket(bus, "seedance-leases")
    flaky, clock = TimesOut(kv, lands=lands), Periods()
    lease, keeper = await _kept(flaky, clock)
    try:
        flaky.failing = 1
        await clock.period()
        assert flaky.failed == 1
        assert lease.held
        assert not keeper.done()
        # Tried again at the next period: a refresh that landed unseen is found in the key
        # (ours, one revision on) and the one after it writes again; one lost never happened.
        await clock.period()
        await clock.period()
        assert lease.held
        assert not keeper.done()
        entry = await kv.get(lease._key)
        assert entry.value == b"a"
        assert entry.revision == flaky.written[-1]
        assert len(flaky.written) == 2
    finally:
        await stop_task(keeper)


async def test_a_lease_whose_refreshes_fail_for_its_ttl_is_lost(bus: Bus) -> None:
    kv = await ensure_bucket(bus, "seedance-leases")
    flaky, clock = TimesOut(kv), Periods()
    lease, keeper = await _kept(flaky, clock)
    try:
        flaky.failing = 10
        for _ in range(2):  # 1 s and 2 s after the last write that succeeded: kept
            await clock.period()
            assert lease.held
        await clock.period()  # 3 s: the key may have expired; we stop leading
        assert flaky.failed == 3
        assert not lease.held
        assert not lease.acquired.is_set()
        assert not keeper.done()  # and go on trying to win the key back
    finally:
        await stop_task(keeper)
