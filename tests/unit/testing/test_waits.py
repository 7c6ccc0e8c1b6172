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
