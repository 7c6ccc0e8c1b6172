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
from tests.unit.core.test_lease_keeper import KeeperSleeps


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
    try:
        kv = await ensure_bucket(bus, "seedance-leases")
        lease = Lease(kv, f"test.{uuid.uuid4().hex[:8]}", "a", WallClock(), ttl_s=3.0)
        assert await lease.try_acquire()
    finally:  # a failed acquire too: its socket left to the GC failed the next test
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


class Periods(KeeperSleeps):
    """A virtual clock that counts the keeper's sleeps: it sleeps once a period, so a test that
    advances one period and waits for the next sleep has seen exactly one refresh attempt (a
    call's deadline, slept in a task of its own, is not counted)."""

    async def period(self) -> None:
        """One refresh period (1 s) on; returns once the keeper is asleep again."""
        n = self.sleeps + 1
        await self.advance(1.0)
        await eventually(lambda: self.sleeps >= n, 10, what=f"the keeper's sleep {n}")


class Hangs:
    """The real leases bucket; while ``hanging``, a refresh never returns until it is cancelled
    (a stalled server, a half-open connection: nothing fails, nothing answers)."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self.hanging = False
        self.entered = 0
        self.cancelled = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        if self.hanging:
            self.entered += 1
            try:
                await asyncio.get_running_loop().create_future()  # no answer, ever
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        rev: int = await self._kv.update(key, value, last=last)
        return rev


async def _kept(flaky: TimesOut | Hangs, clock: Periods) -> tuple[Lease, asyncio.Task[None]]:
    """A lease (ttl 3 s: a refresh each virtual second) acquired by its running keeper, which
    is asleep until the first period."""
    lease = Lease(flaky, f"test.{uuid.uuid4().hex[:8]}", "a", clock, ttl_s=3.0)  # type: ignore[arg-type]
    keeper = clock.keeper = asyncio.create_task(lease.keep())
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
        # (ours, one revision on) and written again at once (when it landed is unknown, and
        # the lease's deadline counts from a write whose sending time is known); one lost
        # never happened.
        await clock.period()
        await clock.period()
        assert lease.held
        assert not keeper.done()
        entry = await kv.get(lease._key)
        assert entry.value == b"a"
        assert entry.revision == flaky.written[-1]
        assert len(flaky.written) == (3 if lands else 2)
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
        # Lost by the clock at 3 s, before a third refresh is sent; then, the key still naming
        # us, the keeper tries to take it back at once (`Lease._take_back`): a write that
        # fails too, so the lease stays lost.
        assert flaky.failed == 3
        assert not lease.held
        assert not lease.acquired.is_set()
        assert not keeper.done()  # and go on trying to win the key back
    finally:
        await stop_task(keeper)


async def test_a_refresh_that_hangs_loses_the_lease_at_its_ttl(bus: Bus) -> None:
    # A refresh that neither fails nor returns kept `held` True until the call came back: a
    # leader went on acting as one while the key expired and a standby took it.
    kv = await ensure_bucket(bus, "seedance-leases")
    hung, clock = Hangs(kv), Periods()
    lease, keeper = await _kept(hung, clock)
    try:
        hung.hanging = True
        await clock.advance(1.0)  # the refresh at 1 s hangs
        await eventually(lambda: hung.entered == 1, 10, what="the refresh in flight")
        await clock.advance(1.0)
        assert lease.held  # 2 s after the last write that succeeded: still ours
        await clock.advance(1.0)
        # 3 s: the key may have expired and be another's; the call is still in flight.
        assert not lease.held
        assert not lease.acquired.is_set()
        # The call is bounded by the lease's time: cancelled, the keeper goes on (standby).
        await eventually(lambda: hung.cancelled == 1, 10, what="the hung refresh cancelled")
        await eventually(lambda: clock.sleeps == 2, 10, what="the keeper asleep again")
        assert not lease.held
        assert not keeper.done()
    finally:
        await stop_task(keeper)


async def test_a_lease_lost_by_the_clock_takes_its_own_key_back_at_once(bus: Bus) -> None:
    """Lost by the clock (a refresh's reply came too late) while its last write landed: the
    key still names us, and nobody else can hold it. `create` finds it there; one
    compare-and-set at its revision takes it back at once, rather than refusing our own key
    until the bucket's TTL expires it (the pool leaderless meanwhile)."""
    kv = await ensure_bucket(bus, "seedance-leases")
    clock = VirtualClock()
    lease = Lease(kv, f"test.{uuid.uuid4().hex[:8]}", "a", clock, ttl_s=3.0)
    assert await lease.try_acquire()
    before = await kv.get(lease._key)
    await clock.advance(3.0)
    assert not lease.held
    assert await lease.try_acquire()
    assert lease.held
    after = await kv.get(lease._key)
    assert after.value == b"a"
    assert after.revision is not None
    assert before.revision is not None
    assert after.revision > before.revision  # written again: its deadline counts from there
    # Another holder's key is never taken.
    other = Lease(kv, lease._key, "b", clock, ttl_s=3.0)
    assert not await other.try_acquire()
    assert (await kv.get(lease._key)).value == b"a"


async def test_a_live_lease_of_the_same_holder_name_is_never_taken(bus: Bus) -> None:
    """Two processes whose holder names coincide (the default holder is the host's name: two
    replicas on one host): the second finds the key naming "them" but at a revision it never
    wrote, so it does not take it; the first keeps it, one leader. Before, the second took the
    key back as its own, the first's refresh then found it "ours" and wrote again: both held."""
    kv = await ensure_bucket(bus, "seedance-leases")
    key = f"test.{uuid.uuid4().hex[:8]}"
    first = Lease(kv, key, "host-1", WallClock(), ttl_s=30.0)
    second = Lease(kv, key, "host-1", WallClock(), ttl_s=30.0)
    assert await first.try_acquire()
    assert not await second.try_acquire()
    assert await first.try_acquire()  # its refresh
    assert first.held
    assert not second.held
    assert not second.acquired.is_set()
