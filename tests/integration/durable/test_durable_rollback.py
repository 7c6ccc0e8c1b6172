"""`seedance.core.durable` rolls back whatever raises outside one event's application, against a
real nats-server under the slicer's shipped user (the tally of `test_durable_runtime`).

Before, only an event whose `apply` raised was rolled back: a batch whose `after_batch` (the
slicer's consolidation) or whose `check` raised kept its sequences in memory, so its
redelivery counted as applied and its effects were never committed nor published; a change
(`transact`) that raised left its half in the state for the next commit to save; and a
`between_batches` hook that raised left the consumers running for a runtime no longer leading.
"""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import Bus, InvalidMessage
from seedance.core.durable import Outbox
from seedance.events.cost import PauseRequest
from tests.integration.durable.test_durable_runtime import (
    deliveries,
    pause,
    rejections,
    restored,
    tally_runtime,
)


async def test_a_batch_whose_end_raises_is_rolled_back_and_decided_again_when_redelivered(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    batch = deliveries([pause(t), pause(t, minute=1)], 1)
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        core.after_batch_raises = True
        with pytest.raises(RuntimeError, match="a bug at the batch's end"):
            await durable.handler("slicer-pauses")(batch)
        assert core.tally.counts == {}  # nothing of the batch kept: neither counts nor sequences
        assert not durable.state.applied.is_applied("slicer-pauses", 1)
        assert core.counted == []
        core.after_batch_raises = False
        assert await durable.handler("slicer-pauses")(batch) == [None, None]  # the redelivery
        assert core.tally.counts == {t: 2}
        assert core.counted == [2]
    assert await restored(nats_url, unique) == {t: 2}  # committed
    assert await rejections(bus, t) == ["pause-1", "pause-2"]  # and published


async def test_an_event_whose_check_raises_is_dead_lettered_and_the_rest_applied_once(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    batch = [pause(t), pause(t, "unreadable", 1), pause(t, minute=2)]
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        outcomes = await durable.handler("slicer-pauses")(deliveries(batch, 1))
        assert outcomes[0] is None
        assert outcomes[2] is None
        assert isinstance(outcomes[1], InvalidMessage)
        assert outcomes[1].kind == "apply_error"
        assert "a bug in check" in str(outcomes[1])
        assert core.tally.counts == {t: 2}
        assert core.counted == [2]
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_a_change_that_raises_is_rolled_back_and_never_saved(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        await durable.handler("slicer-pauses")(deliveries([pause(t)], 1))

        def change() -> Outbox:
            core.tally.counts[t] += 5
            core.tally._changed.add(t)
            raise ValueError("a bug in the change")

        with pytest.raises(ValueError, match="a bug in the change"):
            await durable.transact(change)
        assert core.tally.counts == {t: 1}
        # The next batch commits its own change only, not the half of the one that raised.
        await durable.handler("slicer-pauses")(deliveries([pause(t, minute=1)], 2))
        assert core.tally.counts == {t: 2}
        assert core.counted == [1, 1]
    assert await restored(nats_url, unique) == {t: 2}
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_the_consumers_are_stopped_when_the_leaders_hook_raises(
    nats_url: str, bus: Bus, unique: str
) -> None:
    polls = 0

    async def between_batches() -> None:
        nonlocal polls
        polls += 1
        if polls == 2:  # the first poll while consuming (the first is before it)
            raise RuntimeError("a bug between batches")

    async with tally_runtime(nats_url, unique, between_batches=between_batches) as (
        durable,
        _,
        rt,
    ):
        c = rt.consume("slicer-pauses", PauseRequest, managed=False,
                       batch_handler=durable.handler("slicer-pauses"))  # fmt: skip
        ended = asyncio.Event()
        run_consumer = c.run

        async def run() -> None:
            try:
                await run_consumer()
            finally:
                ended.set()

        c.run = run  # type: ignore[method-assign]
        durable.consume([c])
        with pytest.raises(RuntimeError, match="a bug between batches"):
            await durable.run()
        assert ended.is_set(), "the consumer still runs after its leader's run() ended"
        assert not durable.leading
