"""The lease keeper against a key-value store that answers as a cluster can (a direct get served
by a lagging follower) or not at all as expected (a defect's error): a refresh writes at most
twice, a keeper that dies takes the work it guards with it, loudly, and a keeper cancelled
again and again leaves no call of its running.

A single pinned nats-server cannot serve a stale read, so these use a stand-in store. On the
lease before the change, a read that kept answering the revision the write had just failed at
made the refresh recurse until ``RecursionError`` killed the keeper, and a keeper that died
left the replica on standby for good, silently."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import pytest
from nats.js.errors import KeyWrongLastSequenceError
from structlog.testing import capture_logs

from seedance.core import VirtualClock, cancel_until_done
from seedance.core.kv import Lease
from seedance.core.tasks import guarded
from seedance.testing.waits import eventually, stop_task


@dataclass
class Entry:
    value: bytes
    revision: int


class StaleReads:
    """Every update is refused (the key moved on); every read names us at ``read_revision``:
    1, the revision the lease knows (a lagging follower), or 2, newer, but never settling."""

    def __init__(self, read_revision: int) -> None:
        self.read_revision = read_revision
        self.updates: list[int] = []

    async def create(self, key: str, value: bytes) -> int:
        return 1

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self.updates.append(last or 0)
        raise KeyWrongLastSequenceError()

    async def get(self, key: str) -> Entry:
        return Entry(b"me", self.read_revision)

    async def delete(self, key: str, last: int | None = None) -> bool:
        return True


@pytest.mark.parametrize(("read_revision", "writes"), [(1, [1]), (2, [1, 2])])
async def test_a_refresh_writes_at_most_twice_whatever_the_reads(
    read_revision: int, writes: list[int]
) -> None:
    """A stale read (the revision the write failed at) is not adopted; a newer one is written
    at once, and only once: the next period tries again, the deadline where it was."""
    kv = StaleReads(read_revision)
    lease = Lease(kv, "slicer.p", "me", VirtualClock(), 10.0)  # type: ignore[arg-type]
    assert await lease.try_acquire()
    assert not await lease.try_acquire()
    assert kv.updates == writes
    assert lease.held  # not lost: its deadline has not passed


class Broken:
    """A store whose update fails with an error that is not the bus's (a defect)."""

    async def create(self, key: str, value: bytes) -> int:
        return 1

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        raise RuntimeError("a defect")

    async def delete(self, key: str, last: int | None = None) -> bool:
        return True


async def test_a_keeper_that_dies_ends_the_work_it_guards_with_its_error() -> None:
    lease = Lease(Broken(), "slicer.p", "me", VirtualClock(), 10.0)  # type: ignore[arg-type]
    assert await lease.try_acquire()
    forever = asyncio.Event()
    work = asyncio.ensure_future(forever.wait())
    with capture_logs() as logs, pytest.raises(RuntimeError, match="a defect"):
        await asyncio.wait_for(guarded(work, lease.keep()), timeout=5)
    assert work.cancelled()
    assert not lease.held
    (failed,) = [e for e in logs if e["event"] == "lease_keeper_failed"]
    assert failed["log_level"] == "error"


class SwallowsOneCancel:
    """An update that hangs and swallows the first cancel that lands in it (nats-py's publish
    path, `seedance.core.tasks`); the next cancel ends it."""

    def __init__(self) -> None:
        self.in_update = asyncio.Event()
        self.update_task: asyncio.Task[object] | None = None

    async def create(self, key: str, value: bytes) -> int:
        return 1

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self.update_task = asyncio.current_task()
        self.in_update.set()
        hung = asyncio.Event()
        with contextlib.suppress(asyncio.CancelledError):
            await hung.wait()
        await hung.wait()
        raise AssertionError("never set")

    async def delete(self, key: str, last: int | None = None) -> bool:
        return True


async def test_a_keeper_cancelled_again_and_again_leaves_no_refresh_running() -> None:
    """The runtime's stop cancels the keeper every 0.5 s until it ends (`cancel_until_done`):
    the refresh's cleanup, interrupted by the second cancel, once left the update running."""
    kv = SwallowsOneCancel()
    clock = VirtualClock()
    lease = Lease(kv, "slicer.p", "me", clock, 30.0)  # type: ignore[arg-type]
    assert await lease.try_acquire()
    keeper = asyncio.create_task(lease.keep())
    await clock.advance(10.0)  # the first refresh is due
    await asyncio.wait_for(kv.in_update.wait(), timeout=5)
    await asyncio.wait_for(cancel_until_done((keeper,), every_s=0.05), timeout=5)
    assert kv.update_task is not None
    assert kv.update_task.done(), "the refresh's update left running after its keeper ended"


class SlowCreate:
    """A create whose reply comes once the lease's TTL has passed since it was sent."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    async def create(self, key: str, value: bytes) -> int:
        await self.clock.advance(11.0)
        return 1


async def test_a_create_answered_after_the_ttl_holds_nothing() -> None:
    """The key may have expired meanwhile and be another's: not held, not acquired."""
    clock = VirtualClock()
    lease = Lease(SlowCreate(clock), "slicer.p", "me", clock, 10.0)  # type: ignore[arg-type]
    assert not await lease.try_acquire()
    assert not lease.acquired.is_set()
    assert not lease.held


class HangingCreate:
    """A store whose ``create`` never answers while ``hanging`` (a stalled server, a half-open
    connection) until it is cancelled; then it answers at once."""

    def __init__(self) -> None:
        self.hanging = True
        self.entered = 0
        self.cancelled = 0

    async def create(self, key: str, value: bytes) -> int:
        self.entered += 1
        if self.hanging:
            try:
                await asyncio.get_running_loop().create_future()  # no answer, ever
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return 1

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        return (last or 0) + 1

    async def delete(self, key: str, last: int | None = None) -> bool:
        return True


class KeeperSleeps(VirtualClock):
    """A virtual clock counting the keeper's own sleeps (one a period; a call's deadline,
    slept in a task of its own, is not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps = 0
        self.keeper: asyncio.Task[None] | None = None

    async def sleep(self, seconds: float) -> None:
        if asyncio.current_task() is self.keeper:
            self.sleeps += 1  # in the same step as the wake time is taken: none is missed
        await super().sleep(seconds)


async def test_a_hung_create_is_cancelled_at_the_ttl_and_the_keeper_tries_again() -> None:
    """A create that never answers (not leading meanwhile) is bounded by the lease's time from
    when it was sent, as a refresh is: cancelled once ``ttl_s`` has passed (a reply after that
    holds nothing anyway), the keeper sleeps to its next period and wins the key then. Before,
    the create was awaited for as long as it hung: the keeper never reached another period."""
    kv, clock = HangingCreate(), KeeperSleeps()
    lease = Lease(kv, "slicer.p", "me", clock, 3.0)  # type: ignore[arg-type]
    keeper = clock.keeper = asyncio.create_task(lease.keep())
    try:
        await eventually(lambda: kv.entered == 1, 5, what="the create in flight")
        kv.hanging = False  # the next create is answered
        await clock.advance(2.9)
        assert kv.cancelled == 0  # before its deadline: still waited for
        await clock.advance(0.1)  # 3 s after it was sent
        await eventually(lambda: kv.cancelled == 1, 5, what="the hung create cancelled")
        await eventually(lambda: clock.sleeps == 1, 5, what="the keeper asleep to its period")
        assert not lease.held
        await clock.advance(1.0)  # its next period (ttl_s / 3)
        await eventually(lambda: lease.held, 5, what="the lease won by the next create")
        assert kv.entered == 2
    finally:
        await stop_task(keeper)


class HangingTakeBack(HangingCreate):
    """The key exists (the create is refused) and reading it back never answers."""

    async def create(self, key: str, value: bytes) -> int:
        raise KeyWrongLastSequenceError()

    async def get(self, key: str) -> Entry:
        return Entry(b"me", await HangingCreate.create(self, key, b""))


async def test_a_take_back_that_hangs_is_cancelled_at_the_creates_deadline_and_says_so() -> None:
    """The create found the key; the take-back's read never answers: cancelled once ``ttl_s``
    has passed since the create was sent, not leading, and logged (``lease_create_unanswered``
    with its step). Before, it was cancelled in silence: nothing told why no replica led."""
    kv, clock = HangingTakeBack(), VirtualClock()
    lease = Lease(kv, "slicer.p", "me", clock, 3.0)  # type: ignore[arg-type]
    with capture_logs() as logs:
        attempt = asyncio.create_task(lease.try_acquire())
        await eventually(lambda: kv.entered == 1, 5, what="the take-back's read in flight")
        await clock.advance(3.0)
        assert not await attempt
    assert kv.cancelled == 1
    assert not lease.held
    unanswered = [e for e in logs if e["event"] == "lease_create_unanswered"]
    assert [(e["key"], e["step"]) for e in unanswered] == [("slicer.p", "take_back_read")]
