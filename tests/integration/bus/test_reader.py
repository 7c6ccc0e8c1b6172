"""PullReader against a real nats-server: order, batches, an ended consumer, a lost delivery;
and the runtime stopping a loop that missed its first cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings, PullReader, ReaderInterrupted, ServiceRuntime
from seedance.core.reader import nothing_left
from seedance.events.subjects import ConsumerSpec, jobs


def unacked(unique: str, start_seq: int = 0) -> ConsumerSpec:
    return ConsumerSpec(
        durable=f"reader-{unique}",
        stream=jobs.STREAM,
        filter_subjects=(jobs.tenant_wildcard(f"t{unique}"),),
        acked=False,
        start_seq=start_seq,
        inactive_s=60.0,
    )


async def publish(bus: Bus, unique: str, n: int) -> None:
    for i in range(n):
        await bus.js.publish(jobs.subject(f"t{unique}", "submitted"), f"{i}".encode())


@contextlib.asynccontextmanager
async def reader_after(
    bus: Bus, unique: str, published: int, **kw: Any
) -> AsyncIterator[PullReader]:
    """``published`` messages on the test's subject, then a started reader of its consumer."""
    await publish(bus, unique, published)
    spec = unacked(unique)
    await bus.ensure_consumer(spec)
    reader = PullReader(bus.nc, spec.stream, spec.durable, **kw)
    await reader.start()
    try:
        yield reader
    finally:
        await reader.close()


async def read_until_interrupted(
    reader: PullReader, handed_out: list[Any] | None = None, timeout_s: float = 10.0
) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            msgs = await reader.next_batch(timeout_s=0.5)
            if handed_out is not None:
                handed_out += msgs


async def read(reader: PullReader, n: int, timeout_s: float = 10.0) -> list[Any]:
    got: list[Any] = []
    async with asyncio.timeout(timeout_s):
        while len(got) < n:
            got += await reader.next_batch(timeout_s=0.5)
    return got


async def test_reads_every_message_in_order_in_batches(bus: Bus, unique: str) -> None:
    async with reader_after(bus, unique, 250, batch=40, depth=2) as reader:
        first = await reader.next_batch(timeout_s=5.0)
        assert 0 < len(first) <= 40  # never more than a batch at once
        rest = await read(reader, 250 - len(first))
        assert [m.data for m in first + rest] == [f"{i}".encode() for i in range(250)]
        # Published later, still delivered: the reader keeps asking.
        await publish(bus, unique, 3)
        more = await read(reader, 3)
        assert [m.data for m in more] == [b"0", b"1", b"2"]
        assert await reader.next_batch(timeout_s=0.2) == []


async def test_a_deleted_consumer_interrupts_the_reader(bus: Bus, unique: str) -> None:
    async with reader_after(bus, unique, 5, batch=10, depth=2, expires_s=1.0) as reader:
        assert len(await read(reader, 5)) == 5
        spec = unacked(unique)
        await bus.js.delete_consumer(spec.stream, spec.durable)
        with pytest.raises(ReaderInterrupted):
            await read_until_interrupted(reader)


async def test_a_delivery_that_never_arrived_interrupts_the_reader(bus: Bus, unique: str) -> None:
    async with reader_after(bus, unique, 6, batch=3, depth=1, expires_s=1.0) as reader:
        assert len(await read(reader, 3)) == 3
        # The same consumer re-created behind the reader's back (as after a lost connection):
        # its deliveries restart at 1, which is not the reader's next (4). The server may also
        # end the waiting request with "Consumer Deleted"; either way the reader must stop.
        await bus.ensure_consumer(unacked(unique, start_seq=1))
        handed_out: list[Any] = []
        with pytest.raises(ReaderInterrupted, match=r"never arrived|Consumer Deleted"):
            await read_until_interrupted(reader, handed_out)
        # What the old consumer delivered before it went (3, 4, 5) may come out; nothing from
        # the re-created one (which starts again at 0): the order never steps back.
        data = [m.data for m in handed_out]
        assert data == [b"3", b"4", b"5"][: len(data)]


async def test_a_consumer_info_that_keeps_failing_is_logged_once_by_name(
    bus: Bus, unique: str
) -> None:
    """``nothing_left`` cannot tell while the consumer's info fails (here: no such consumer):
    the first failure is logged, naming the consumer, the next ones not until it answered.
    Before, a failure that persisted held a replay without a word."""
    spec = unacked(unique)
    with capture_logs() as logs:
        for _ in range(3):
            assert not await nothing_left(bus.js, spec.stream, spec.durable, 0)
        await bus.ensure_consumer(spec)
        assert await nothing_left(bus.js, spec.stream, spec.durable, 0)
        await bus.js.delete_consumer(spec.stream, spec.durable)
        assert not await nothing_left(bus.js, spec.stream, spec.durable, 0)
    failed = [r for r in logs if r["event"] == "reader_consumer_info_failed"]
    assert [(r["stream"], r["consumer"]) for r in failed] == [(spec.stream, spec.durable)] * 2
    assert failed[0]["error"].startswith("NotFoundError")


async def test_a_loop_that_swallows_a_cancellation_still_stops(nats_url: str) -> None:
    # nats-py's publish path swallows a CancelledError; the runtime must ask again.
    runtime = ServiceRuntime("loop-test", BusSettings(url=nats_url))
    swallowed, running = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        running.set()
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if swallowed.is_set():
                    raise
                swallowed.set()  # the first cancellation is lost, as in nats-py

    runtime.loop(stubborn)
    await runtime.start()
    task = asyncio.create_task(runtime.run())
    try:
        async with asyncio.timeout(5):
            await running.wait()  # the loop runs: the stop cancels it, not its start
        await runtime.stop()
        async with asyncio.timeout(5):
            await swallowed.wait()
        async with asyncio.timeout(10):
            await task  # returns: the loop was cancelled a second time
    finally:
        await runtime.close()
