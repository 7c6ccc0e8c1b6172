"""`seedance.core.durable` against a real nats-server, one duty per test, under the slicer's
shipped user (its state bucket, its leases, its ``slicer-pauses`` durable, its decisions' subjects).

The core is a tally: each tenant's pause requests counted, each answered by one `JobRejected`
numbered by the count (so a decision depends on the state, and a state applied twice or half would
show in what is published). Batches go straight to the runtime's handler (deliveries with the
sequences a consumer would give them), except in the leadership test, which consumes for real.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from seedance.core import (
    Bus,
    BusSettings,
    Delivery,
    InvalidMessage,
    RetryableError,
    ServiceRuntime,
    WallClock,
)
from seedance.core.durable import DurableRuntime, DurableSpec, DurableState, Outbox
from seedance.core.publisher import AckedBatch, PubAck
from seedance.core.state_store import StateStore
from seedance.events import Event, decode, new_event_id
from seedance.events.base import derived_event_id
from seedance.events.cost import PauseRequest
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import JobRejected, RejectionReason
from seedance.events.subjects import costs, dlq, slicing
from seedance.testing.waits import eventually
from seedance.testing.workloads import read_stream
from tests.integration.slicer.test_slicer_service import fast_forward

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
_int = msgspec.msgpack.Decoder(int)


class Tally(DurableState):
    """Pauses counted per tenant; entries ``t/<tenant>``."""

    def __init__(self, store: StateStore) -> None:
        super().__init__(store)
        self.counts: dict[str, int] = {}
        self._changed: set[str] = set()

    def core_changes(self) -> dict[str, bytes | None]:
        out = {f"t/{t}": msgspec.msgpack.encode(self.counts[t]) for t in self._changed}
        self._changed.clear()
        return dict(out)

    def core_entries(self) -> dict[str, bytes]:
        return {f"t/{t}": msgspec.msgpack.encode(n) for t, n in self.counts.items()}

    def restore_core(self, entries: Mapping[str, bytes]) -> None:
        self.counts = {k[2:]: _int.decode(v) for k, v in entries.items() if k.startswith("t/")}
        self._changed.clear()


class TallyCore:
    """Refuses a pause whose reason is ``refuse``; raises on ``boom`` after changing the state
    (a half-applied event the runtime must roll back), and in `check` on ``unreadable``; a
    batch's end raises while `after_batch_raises`."""

    def __init__(self) -> None:
        self.durable: DurableRuntime | None = None
        self.counted: list[int] = []
        self.after_batch_raises = False
        self._pending = 0

    @property
    def tally(self) -> Tally:
        assert self.durable is not None
        state = self.durable.state
        assert isinstance(state, Tally)
        return state

    def check(self, d: Delivery[Any]) -> InvalidMessage | None:
        if d.event.reason == "refuse":
            return InvalidMessage("refused by the test", kind="refused")
        if d.event.reason == "unreadable":
            raise KeyError("a bug in check")
        return None

    def trusted_time(self, d: Delivery[Any]) -> datetime:
        return d.event.at  # the test's own events: their time is the test's

    def apply(self, event: Any, at: datetime) -> Outbox:
        st = self.tally
        n = st.counts.get(event.tenant, 0) + 1
        st.counts[event.tenant] = n
        st._changed.add(event.tenant)
        if event.reason == "boom":
            raise ValueError("boom")
        self._pending += 1
        ev = JobRejected(
            id=derived_event_id(event.id, "tally"), at=at, tenant=event.tenant,
            job_id=f"pause-{n}", reason=RejectionReason.INVALID_REQUEST,
        )  # fmt: skip
        return [(slicing.subject(event.tenant, "rejected"), ev)]

    def after_batch(self, last: Event) -> Outbox:
        if self.after_batch_raises:
            raise RuntimeError("a bug at the batch's end")
        return []

    def settled(self, committed: bool) -> None:
        if committed:
            self.counted.append(self._pending)
        self._pending = 0


class Metrics:
    def __init__(self) -> None:
        self.leader = _Gauge()
        self.state_write_seconds = _Histogram()


class _Gauge:
    value = 0.0

    def set(self, v: float) -> None:
        self.value = v


class _Histogram:
    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, v: float) -> None:
        self.seen.append(v)


@contextlib.asynccontextmanager
async def tally_runtime(
    nats_url: str, unique: str, replica: str = "a", *, loaded: bool = False, **hooks: Any
) -> AsyncIterator[tuple[DurableRuntime, TallyCore, ServiceRuntime]]:
    """A tally's runtime under the slicer's user (`hooks`: `DurableRuntime`'s), started;
    `loaded`: its state read from the store too, as a test that hands batches to the handler
    itself (no `run`, which reads it as a leader) needs."""
    rt = ServiceRuntime("slicer", BusSettings(url=nats_url, name=f"test-durable-{replica}"))
    core = TallyCore()
    spec = DurableSpec(
        bucket="seedance-slicer-state", key=f"pool.d{unique}", lease_key=f"slicer.d{unique}",
        holder=replica, lease_ttl_s=1.5,
    )  # fmt: skip
    durable = DurableRuntime(
        rt, WallClock(), spec, state=Tally, core=core, metrics=Metrics(), **hooks
    )
    core.durable = durable
    await rt.start()
    try:
        await durable.start()
        if loaded:
            await durable.state.load()
        yield durable, core, rt
    finally:
        durable.stop()
        await durable.close()
        await rt.close()


async def restored(nats_url: str, unique: str) -> dict[str, int]:
    """The tally another process restores from the store: what was committed."""
    async with tally_runtime(nats_url, unique, loaded=True) as (_, core, _):
        return dict(core.tally.counts)


@contextlib.asynccontextmanager
async def running(durable: DurableRuntime) -> AsyncIterator[None]:
    """``durable.run()`` (leading when it can) for the block; stopped and awaited after it."""
    task = asyncio.create_task(durable.run())
    try:
        yield
    finally:
        durable.stop()
        await task


def pause(tenant: str, reason: str = "", minute: int = 0) -> PauseRequest:
    return PauseRequest(
        id=new_event_id(), at=T0 + timedelta(minutes=minute), tenant=tenant, reason=reason
    )


def deliveries(events: Sequence[PauseRequest], first_seq: int) -> list[Delivery[Any]]:
    return [
        Delivery(
            event=e,
            subject=costs.subject(e.tenant, "pause"),
            stream_seq=first_seq + i,
            num_delivered=1,
        )
        for i, e in enumerate(events)
    ]


async def rejections(bus: Bus, tenant: str) -> list[str]:
    """The job ids of the tenant's rejections in the stream, in order (duplicates shown): as
    many as the stream counts (`read_stream`), never a read to a quiet gap, which a stall of
    delivery on a loaded machine ended early."""
    msgs = await read_stream(bus, "SEEDANCE_SLICING", subject=slicing.subject(tenant, "rejected"))
    return [decode(m.data).job_id for m in msgs]


async def test_a_redelivered_sequence_is_acknowledged_without_being_applied_again(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    first, second, third = pause(t), pause(t, minute=1), pause(t, minute=2)
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        outcomes = await durable.handler("slicer-pauses")(deliveries([first, second], 1))
        assert outcomes == [None, None]
        assert core.tally.counts == {t: 2}
    # Another process: the same two sequences again (the acks were lost), then a new one.
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        assert core.tally.counts == {t: 2}
        outcomes = await durable.handler("slicer-pauses")(deliveries([first, second, third], 1))
        assert outcomes == [None, None, None]
        assert core.tally.counts == {t: 3}
        assert core.counted == [1]  # one event applied, one decision counted
        # Another durable's sequences are its own: the same numbers there are fresh.
        await durable.handler("other")(deliveries([pause(t, minute=3)], 1))
        assert core.tally.counts == {t: 4}
    assert await rejections(bus, t) == ["pause-1", "pause-2", "pause-3", "pause-4"]


async def test_a_crash_between_snapshot_and_publish_loses_nothing_and_doubles_nothing(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    batch = [pause(t), pause(t, minute=1)]
    async with tally_runtime(nats_url, unique, replica="a", loaded=True) as (durable, core, rt):

        async def died(*args: Any, **kw: Any) -> None:
            raise ConnectionError("the process died before publishing")

        rt.bus.send_many = died  # type: ignore[method-assign]
        with pytest.raises(RetryableError):
            await durable.handler("slicer-pauses")(deliveries(batch, 1))
        # Committed before publishing: the state and its decisions are durable, none is out.
        assert core.tally.counts == {t: 2}
        assert [ev.job_id for _, ev in durable.state.outbox] == ["pause-1", "pause-2"]  # type: ignore[attr-defined]
    assert await rejections(bus, t) == []
    # The next leader restores the outbox and publishes it; the redelivered batch is skipped.
    async with (
        tally_runtime(nats_url, unique, replica="b") as (durable, core, _),
        running(durable),
    ):
        await eventually(lambda: durable.leading, 15, what="b leads")
        await eventually(lambda: not durable.state.outbox, 15, what="outbox published")
        assert await durable.handler("slicer-pauses")(deliveries(batch, 1)) == [None, None]
        assert core.tally.counts == {t: 2}
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_effects_published_again_after_a_crash_are_dropped_by_their_ids(
    nats_url: str, bus: Bus, unique: str
) -> None:
    """Published, then died before the next commit emptied the durable outbox: the next leader
    publishes it again with the same ``Nats-Msg-Id``s and JetStream keeps one of each."""
    t = f"t{unique}"
    async with tally_runtime(nats_url, unique, replica="a", loaded=True) as (durable, _, _):
        await durable.handler("slicer-pauses")(deliveries([pause(t), pause(t, minute=1)], 1))
        # Sent with the inputs' acks; emptied in memory once the stream acknowledged them.
        await eventually(lambda: not durable.state.outbox, 15, what="effects acknowledged")
    assert await rejections(bus, t) == ["pause-1", "pause-2"]
    async with tally_runtime(nats_url, unique, replica="b", loaded=True) as (durable, _, _):
        assert len(durable.state.outbox) == 2  # the durable copy still holds them
        async with running(durable):
            await eventually(lambda: durable.leading and not durable.state.outbox, 15)
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_effects_whose_acks_fail_after_their_inputs_were_acked_go_out_before_the_next_batch(
    nats_url: str, bus: Bus, unique: str
) -> None:
    """The inputs are acknowledged once their effects are committed and sent, before the
    stream acknowledged the effects. If those acks fail, the effects are sent again before the
    next batch is decided; nothing is lost, nothing doubled."""
    t = f"t{unique}"
    async with tally_runtime(nats_url, unique) as (durable, _, rt):
        await durable.state.load()
        real = rt.bus.send_many

        async def lost(items: Sequence[tuple[str, Event]], **kw: Any) -> AckedBatch:
            done: asyncio.Future[list[PubAck]] = asyncio.get_running_loop().create_future()
            done.set_exception(ConnectionError("the acks were lost"))
            return AckedBatch(
                messages=[], acks=[None] * len(items), done=done, publisher=rt.bus.publisher
            )

        rt.bus.send_many = lost  # type: ignore[method-assign]
        handle = durable.handler("slicer-pauses")
        assert await handle(deliveries([pause(t), pause(t, minute=1)], 1)) == [None, None]
        rt.bus.send_many = real  # type: ignore[method-assign]
        assert await rejections(bus, t) == []
        assert len(durable.state.outbox) == 2
        assert await handle(deliveries([pause(t, minute=2)], 3)) == [None]
        await eventually(lambda: not durable.state.outbox, 15, what="effects acknowledged")
    assert await rejections(bus, t) == ["pause-1", "pause-2", "pause-3"]


async def test_a_bad_event_is_dead_lettered_and_the_rest_of_its_batch_applied_once(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    batch = [pause(t), pause(t, "boom", 1), pause(t, "refuse", 2), pause(t, minute=3)]
    async with tally_runtime(nats_url, unique, loaded=True) as (durable, core, _):
        outcomes = await durable.handler("slicer-pauses")(deliveries(batch, 1))
        assert outcomes[0] is None
        assert outcomes[3] is None
        assert isinstance(outcomes[1], InvalidMessage)
        assert outcomes[1].kind == "apply_error"
        assert "ValueError('boom')" in str(outcomes[1])
        assert isinstance(outcomes[2], InvalidMessage)
        assert outcomes[2].kind == "refused"
        # The half-applied event was rolled back: two counted, in the state and in the store.
        assert core.tally.counts == {t: 2}
        assert core.counted == [2]
    assert await restored(nats_url, unique) == {t: 2}
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_a_deposed_writer_reloads_the_others_state_and_its_batch_is_retried(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    async with (
        tally_runtime(nats_url, unique, replica="a", loaded=True) as (a, core_a, _),
        tally_runtime(nats_url, unique, replica="b", loaded=True) as (b, core_b, _),
    ):
        await a.handler("slicer-pauses")(deliveries([pause(t)], 1))
        with pytest.raises(RetryableError, match="not made durable"):
            await b.handler("slicer-pauses")(deliveries([pause(t, minute=1)], 2))
        assert core_b.tally.counts == {t: 1}  # a's state, reloaded; its own batch not counted
        assert core_b.counted == []
        assert await b.handler("slicer-pauses")(deliveries([pause(t, minute=1)], 2)) == [None]
        assert core_b.tally.counts == {t: 2}
        assert core_a.tally.counts == {t: 1}
    assert await rejections(bus, t) == ["pause-1", "pause-2"]


async def test_one_leader_consumes_dead_letters_and_a_standby_takes_over_with_its_state(
    nats_url: str, bus: Bus, unique: str
) -> None:
    t = f"t{unique}"
    await fast_forward(bus, "")  # the catalogue's durable itself, past anything before
    async with (
        tally_runtime(nats_url, unique, replica="a") as (a, core_a, rt_a),
        tally_runtime(nats_url, unique, replica="b") as (b, core_b, rt_b),
    ):
        for durable, rt in ((a, rt_a), (b, rt_b)):
            c = rt.consume("slicer-pauses", PauseRequest, managed=False,
                           batch_handler=durable.handler("slicer-pauses"))  # fmt: skip
            durable.consume([c])
        task_a = asyncio.create_task(a.run())
        await eventually(lambda: a.leading, 15, what="a leads")
        task_b = asyncio.create_task(b.run())
        try:
            for e in (pause(t), pause(t, "boom", 1), pause(t, minute=2)):
                await bus.publish(costs.subject(t, "pause"), e)
            await eventually(lambda: core_a.tally.counts == {t: 2}, 15, what="a applied two")
            assert not b.leading
            a.stop()
            await task_a
            await a.close()  # releases the lease
            await eventually(lambda: b.leading, 15, what="b took over")
            assert core_b.tally.counts == {t: 2}
            await bus.publish(costs.subject(t, "pause"), pause(t, minute=3))
            await eventually(lambda: core_b.tally.counts == {t: 3}, 15, what="b applied it")
        finally:
            b.stop()
            await task_b
    assert await rejections(bus, t) == ["pause-1", "pause-2", "pause-3"]
    letters = await dead_letters(bus, t)
    assert [(d.error_kind, decode(d.payload).reason) for d in letters] == [("apply_error", "boom")]


async def dead_letters(bus: Bus, tenant: str) -> list[DeadLetter]:
    """The slicer's dead letters of the tenant's pauses, in order (a server another test also
    uses holds theirs too)."""
    subject = dlq.subject("slicer")
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    try:
        info = await bus.js.stream_info("SEEDANCE_DLQ", subjects_filter=subject)
        out: list[DeadLetter] = []
        for _ in range((info.state.subjects or {}).get(subject, 0)):  # every letter there is
            letter = decode((await sub.next_msg(timeout=5)).data)
            assert isinstance(letter, DeadLetter)
            if letter.subject == costs.subject(tenant, "pause"):
                out.append(letter)
        return out
    finally:
        await sub.unsubscribe()
