"""cancel_until_done: a task that loses a cancel (as nats-py's publish path does) still ends;
before_deadline: a call is bounded by a deadline on the injected clock, and ended for certain."""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import VirtualClock, cancel_until_done
from seedance.core.tasks import LATE, before_deadline


async def _loses_the_first_cancel(rounds: list[int]) -> None:
    """A ``while True`` loop whose await swallows one CancelledError, like a KV put through
    nats-py's ``Client._flush_pending``."""
    swallowed = False
    while True:
        rounds.append(1)
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True


async def test_a_task_that_swallows_one_cancel_still_ends() -> None:
    rounds: list[int] = []
    task = asyncio.create_task(_loses_the_first_cancel(rounds))
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.sleep(0.05)
    assert not task.done()  # one cancel was not enough
    await asyncio.wait_for(cancel_until_done([task], every_s=0.05), timeout=5)
    assert task.cancelled()


async def test_none_entries_and_finished_tasks_are_skipped_and_errors_stay_on_the_task() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    sleeper = asyncio.create_task(asyncio.sleep(30))
    await asyncio.wait_for(cancel_until_done([None, failed, sleeper]), timeout=5)
    assert sleeper.cancelled()
    with pytest.raises(ValueError, match="boom"):
        failed.result()


async def _hangs_and_swallows_one_cancel(started: asyncio.Event, ended: asyncio.Event) -> str:
    """A call that never answers and swallows the first cancel (an API client's, nats-py's)."""
    started.set()
    try:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.Event().wait()  # one cancel lost: waits on
        return "never"
    finally:
        ended.set()


async def test_before_deadline_is_late_at_the_clock_s_deadline_and_ends_the_call() -> None:
    """The deadline is the injected clock's (a virtual one here: the loop's time does not
    move it), and a call that swallows a cancel is ended all the same."""
    clock = VirtualClock()
    started, ended = asyncio.Event(), asyncio.Event()
    bounded = asyncio.ensure_future(
        before_deadline(_hangs_and_swallows_one_cancel(started, ended), clock, 10.0)
    )
    async with asyncio.timeout(10):
        await started.wait()
    await clock.advance(9.5)
    assert not bounded.done()
    await clock.advance(0.5)
    async with asyncio.timeout(10):
        assert await bounded is LATE
    assert ended.is_set()


async def test_before_deadline_gives_a_timely_answer_and_a_reply_at_the_deadline_is_late() -> None:
    clock = VirtualClock()

    async def answers(value: str) -> str:
        return value

    async def fails() -> str:
        raise ValueError("boom")

    assert await before_deadline(answers("ok"), clock, 1.0) == "ok"
    with pytest.raises(ValueError, match="boom"):
        await before_deadline(fails(), clock, 1.0)
    await clock.advance(1.0)
    assert await before_deadline(answers("too late"), clock, 1.0) is LATE
    assert await before_deadline(fails(), clock, 1.0) is LATE  # a late error is dropped
