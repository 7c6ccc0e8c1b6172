"""`eventually`: returns once the check holds, plain or awaitable; a timeout names what it
waited on; the deadline bounds a check that hangs; a check's own TimeoutError is its own.
`next_matching`: the first message accepted, or a timeout at the deadline however many others
keep coming. `stop_task`: a task ends though it loses a cancel, and its own error is raised.
`wait_sourced`: the last sequence once a sourcing stream holds what its origins took, not the
one it had when first asked; a timeout says how much it held."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.errors
import pytest
from nats.js.errors import NotFoundError

from seedance.testing.waits import eventually, next_matching, stop_task, wait_sourced


async def test_returns_once_the_check_holds() -> None:
    calls = []

    def third_time() -> bool:
        calls.append(1)
        return len(calls) >= 3

    await eventually(third_time, timeout_s=5, interval_s=0.001)
    assert len(calls) == 3


async def test_awaits_an_async_check() -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_soon(flag.set)

    async def is_set() -> bool:
        return flag.is_set()

    await eventually(is_set, timeout_s=5, interval_s=0.001)
    assert flag.is_set()


async def test_timeout_names_what_was_awaited() -> None:
    with pytest.raises(TimeoutError, match=r"within 0.05 s: the ledger checkpointed"):
        await eventually(lambda: False, 0.05, what="the ledger checkpointed")


async def test_timeout_names_the_check_by_default() -> None:
    def replica_elected() -> bool:
        return False

    with pytest.raises(TimeoutError, match="replica_elected"):
        await eventually(replica_elected, 0.05)


async def test_the_deadline_bounds_a_check_that_hangs() -> None:
    async def hangs() -> bool:
        await asyncio.Event().wait()  # never set
        return True

    with pytest.raises(TimeoutError, match="hangs"):
        await eventually(hangs, 0.05)


async def test_a_checks_own_timeout_propagates_unchanged() -> None:
    async def times_out() -> bool:
        raise TimeoutError("the check's own")

    with pytest.raises(TimeoutError, match=r"^the check's own$"):
        await eventually(times_out, 5)


async def test_the_deadline_holds_when_a_check_drops_the_cancel() -> None:
    # What a nats request does on Python 3.11 when its reply and the timeout's cancel land in
    # the same loop turn (asyncio.wait_for returns the reply): the cancel is lost, and a loop
    # bounded by it alone would poll until pytest's own limit.
    dropped = []

    async def drops_the_cancel() -> bool:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            if dropped:
                raise  # only the first: the old loop ends at the outer bound below
            dropped.append(1)  # as wait_for does: the reply is returned, the cancel is gone
        return False

    async with asyncio.timeout(5):  # the old loop polled on until this, with no message
        with pytest.raises(TimeoutError, match=r"not true within 0\.05 s: .*drops_the_cancel"):
            await eventually(drops_the_cancel, 0.05)
    assert dropped


class Chatty:
    """A subscription whose publisher keeps sending (a periodic report): a message every
    millisecond, none of them the one looked for; it drops the first cancel as nats-py's
    ``next_msg`` (``asyncio.wait_for`` inside) does on Python 3.11 when a message lands in the
    same turn."""

    def __init__(self, wanted_after: int | None = None) -> None:
        self.read, self.dropped, self.wanted_after = 0, 0, wanted_after

    async def next_msg(self, timeout: float | None = 1.0) -> str:  # noqa: ASYNC109  # nats-py's
        try:
            await asyncio.sleep(0.001)
        except asyncio.CancelledError:
            if self.dropped:
                raise
            self.dropped += 1  # the message is returned, the cancel is gone
        self.read += 1
        return "wanted" if self.read == self.wanted_after else "report"


async def test_next_matching_returns_the_first_message_it_accepts() -> None:
    sub = Chatty(wanted_after=3)
    assert await next_matching(sub, lambda m: m == "wanted", 5, what="wanted") == "wanted"
    assert sub.read == 3


async def test_next_matching_ends_at_its_deadline_while_others_keep_coming() -> None:
    # A loop bounded by one asyncio.timeout around the reads would have lost that cancel and
    # read reports until the outer bound below.
    sub = Chatty()
    async with asyncio.timeout(5):
        with pytest.raises(TimeoutError, match=r"no message the plan within 0\.05 s \(\d+ others"):
            await next_matching(sub, lambda m: m == "wanted", 0.05, what="the plan")
    assert sub.read > 0


class Quiet:
    async def next_msg(self, timeout: float | None = 1.0) -> str:  # noqa: ASYNC109  # nats-py's
        await asyncio.sleep(timeout or 0)
        raise nats.errors.TimeoutError


async def test_next_matching_names_what_it_waited_for_when_nothing_comes() -> None:
    with pytest.raises(TimeoutError, match=r"no message the plan within 0\.05 s \(0 others"):
        await next_matching(Quiet(), lambda m: True, 0.05, what="the plan")


async def test_stop_task_ends_a_task_that_loses_a_cancel() -> None:
    # A lease keeper's loop: its refresh (a nats request) drops the first cancel and it sleeps
    # on; one cancel() and an await would wait for ever (here, the outer bound).
    lost = []

    async def keeper() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    raise
                lost.append(1)

    task = asyncio.create_task(keeper())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await stop_task(task)
    assert lost
    assert task.cancelled()


async def test_stop_task_raises_the_tasks_own_error() -> None:
    async def fails() -> None:
        raise ValueError("its own")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="its own"):
        await stop_task(task)


async def test_stop_task_names_a_task_that_outlives_every_cancel() -> None:
    stubborn = True

    async def swallows_cancels() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if not stubborn:
                    raise

    task = asyncio.ensure_future(swallows_cancels(), loop=asyncio.get_running_loop())
    task.set_name("swallows-cancels")
    await asyncio.sleep(0)
    async with asyncio.timeout(5):  # the unbounded version waited here until pytest's limit
        with pytest.raises(TimeoutError, match=r"swallows-cancels.* still runs 0\.3 s after"):
            await stop_task(task, timeout_s=0.3)
    stubborn = False
    await stop_task(task)
    assert task.cancelled()


class _Sourcing:
    """A stream the server fills by sourcing: each look finds ``step`` more, up to ``full``."""

    def __init__(self, start: int, full: int, step: int) -> None:
        self.last, self.full, self.step, self.looks = start, full, step, 0

    async def stream_info(self, name: str) -> object:
        self.looks += 1
        seen = self.last
        self.last = min(self.full, self.last + self.step)
        return SimpleNamespace(state=SimpleNamespace(last_seq=seen))


async def test_wait_sourced_returns_the_sequence_once_everything_is_copied() -> None:
    # 100 before the test, 50 published: the first look sees 110 (what a read taken at once
    # used), the wait returns only at 150.
    js = _Sourcing(start=110, full=150, step=10)
    assert await wait_sourced(js, "IN", 50, since_seq=100, timeout_s=5) == 150
    assert js.looks == 5


async def test_wait_sourced_says_how_much_the_stream_holds_when_it_runs_out() -> None:
    js = _Sourcing(start=120, full=130, step=10)
    with pytest.raises(TimeoutError, match=r"IN holds 30 of the 50 messages sourced after seq 100"):
        await wait_sourced(js, "IN", 50, since_seq=100, timeout_s=0.1)


class _NotYetCreated(_Sourcing):
    """A sourcing stream its service has not created yet on the first ``missing`` looks."""

    def __init__(self, missing: int, **kw: int) -> None:
        super().__init__(**kw)
        self.missing = missing

    async def stream_info(self, name: str) -> object:
        if self.missing:
            self.missing -= 1
            raise NotFoundError
        return await super().stream_info(name)


async def test_wait_sourced_waits_for_a_stream_not_created_yet() -> None:
    js = _NotYetCreated(2, start=0, full=5, step=5)
    assert await wait_sourced(js, "IN", 5, timeout_s=5) == 5
