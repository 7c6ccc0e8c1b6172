"""cancel_until_done: a task that loses a cancel (as nats-py's publish path does) still ends."""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import cancel_until_done


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
