"""`eventually`: returns once the check holds, plain or awaitable; a timeout names what it
waited on; the deadline bounds a check that hangs; a check's own TimeoutError is its own."""

from __future__ import annotations

import asyncio

import pytest

from seedance.testing.waits import eventually


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
