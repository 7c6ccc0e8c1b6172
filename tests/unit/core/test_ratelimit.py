"""The token bucket behind the k8s-bridge's API request rate (`seedance.core.ratelimit`), on a
virtual clock: a burst goes at once, the rest at ``qps``, in arrival order."""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import VirtualClock
from seedance.core.ratelimit import TokenBucket


async def test_a_burst_goes_at_once_and_the_rest_one_per_interval_in_arrival_order() -> None:
    clock = VirtualClock()
    bucket = TokenBucket(qps=2.0, burst=3, clock=clock)
    done: list[int] = []

    async def request(i: int) -> None:
        await bucket.take()
        done.append(i)

    tasks = [asyncio.create_task(request(i)) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*tasks[:3]), 5)
    assert done == [0, 1, 2]
    assert not tasks[3].done()
    assert not tasks[4].done()
    await clock.advance(0.5)
    await asyncio.wait_for(tasks[3], 5)
    assert done == [0, 1, 2, 3]
    assert not tasks[4].done()
    await clock.advance(0.5)
    await asyncio.wait_for(tasks[4], 5)
    assert done == [0, 1, 2, 3, 4]
    assert bucket.waited == 2
    assert bucket.waited_s == pytest.approx(1.5)


async def test_idle_time_refills_the_bucket_up_to_the_burst_only() -> None:
    clock = VirtualClock()
    bucket = TokenBucket(qps=10.0, burst=2, clock=clock)
    for _ in range(2):
        await bucket.take()
    await clock.advance(60.0)  # a minute idle: still only `burst` at once
    await asyncio.wait_for(bucket.take(), 5)
    await asyncio.wait_for(bucket.take(), 5)
    third = asyncio.create_task(bucket.take())
    await asyncio.wait([third], timeout=0)
    assert not third.done()
    await clock.advance(0.1)
    await asyncio.wait_for(third, 5)


async def test_no_limit_when_qps_is_not_positive_and_a_limit_needs_a_burst() -> None:
    bucket = TokenBucket(qps=0, burst=0, clock=VirtualClock())
    for _ in range(1000):
        await bucket.take()
    assert bucket.waited == 0
    with pytest.raises(ValueError, match="burst of at least 1"):
        TokenBucket(qps=5, burst=0)
