"""`seedance.core.durable.ReplicatedRuntime` against a real nats-server, under the ledger's shipped
user, reading the merged input stream from a replica consumer of its own, as the ledger does.

The core is a counter: each input it steps is answered by one `PauseRequest` whose id derives
from the input's sequence and whose reason is the running count, so an input stepped twice, one
skipped or a restore from the wrong place shows in what reaches the stream. Inputs are sample
batches published on node subjects (sourced into ``SEEDANCE_LEDGER_IN`` by the server); one
whose node is ``poison-*`` is refused by the step (dead-lettered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
from nats.aio.msg import Msg

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.durable import Checkpointing, Checkpoints, ReplicatedRuntime, Stepped
from seedance.core.kv import ensure_bucket
from seedance.events import Event, decode, new_event_id
from seedance.events.base import derived_event_id
from seedance.events.cost import PauseRequest
from seedance.events.dlq import DeadLetter
from seedance.events.subjects import Header, costs, dlq, replica_consumer, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch
from seedance.testing.identities import as_user
from seedance.testing.waits import eventually, stop_task
from seedance.testing.workloads import read_stream

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TENANT = "acme"


@dataclass(frozen=True)
class Out:
    subject: str
    event: Event


class _Saved(msgspec.Struct):
    seq: int
    count: int
    outbox: list[tuple[int, int]]  # (input sequence, count) not yet confirmed


class Counter:
    """A `ReplicatedCore`: deterministic in the input stream."""

    def __init__(self) -> None:
        self.seq = 0
        self.count = 0
        self._outbox: dict[str, tuple[int, int]] = {}

    def start_after(self, seq: int) -> None:
        self.seq = seq

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(_Saved(self.seq, self.count, list(self._outbox.values())))

    def restore(self, data: bytes) -> None:
        saved = msgspec.msgpack.decode(data, type=_Saved)
        self.seq, self.count = saved.seq, saved.count
        self._outbox = {}
        for seq, n in saved.outbox:
            self._out(seq, n)

    def pending(self) -> list[Out]:
        return [self._publication(seq, n) for seq, n in self._outbox.values()]

    def confirm_published(self, pubs: Sequence[Any]) -> None:
        for p in pubs:
            self._outbox.pop(p.event.id, None)

    def step(self, msg: Msg) -> list[Out]:
        self.seq = msg.metadata.sequence.stream
        self.count += 1
        return [self._out(self.seq, self.count)]

    def _out(self, seq: int, n: int) -> Out:
        out = self._publication(seq, n)
        self._outbox[out.event.id] = (seq, n)
        return out

    @staticmethod
    def _publication(seq: int, n: int) -> Out:
        at = T0 + timedelta(seconds=seq)
        ev = PauseRequest(
            id=derived_event_id(f"input/{seq}", "count", unix_ms=int(at.timestamp() * 1000)),
            at=at, tenant=TENANT, reason=str(n),
        )  # fmt: skip
        return Out(costs.subject(TENANT, "pause"), ev)


def stepper(core: Counter) -> Any:
    def step_batch(msgs: list[Msg]) -> Stepped:
        out = Stepped()
        for msg in msgs:
            if msg.metadata.sequence.stream <= core.seq:
                continue
            if decode(msg.data).node.startswith("poison-"):
                core.seq = msg.metadata.sequence.stream  # refused, and passed
                out.letters.append((msg, "invalid_input", "a poison node"))
                continue
            out.outputs.extend(core.step(msg))
        return out

    return step_batch


@contextlib.asynccontextmanager
async def replica(
    nats_url: str, name: str, *, close: bool = True
) -> AsyncIterator[tuple[ReplicatedRuntime, Counter]]:
    """A replica reading until the block ends; ``close=False``: killed (no final checkpoint)."""
    rt = ServiceRuntime("cost-ledger", BusSettings(url=nats_url, name=f"test-replicated-{name}"))
    core = Counter()
    durable = ReplicatedRuntime(
        rt, WallClock(), core,
        consumer=lambda start: replica_consumer("ledger-in", name, start_seq=start),
        checkpointing=Checkpointing(
            bucket="seedance-ledger", key="checkpoint.counter", writer=name,
            every_events=10**9, every_s=3600.0,  # only when the test says
        ),
        step_batch=stepper(core), on_acked=lambda outputs, acks: None,
    )  # fmt: skip
    await rt.start()
    task: asyncio.Task[None] | None = None
    try:
        await durable.start()
        task = asyncio.create_task(durable.consume())
        yield durable, core
    finally:
        if task is not None:
            await stop_task(task)  # it publishes and checkpoints: one cancel can be lost
        if close:
            await durable.close()
        await rt.close()


async def publish_inputs(bus: Bus, nodes: Sequence[str]) -> None:
    for i, node in enumerate(nodes):
        batch = GpuSampleBatch(
            id=derived_event_id(f"{node}/{i}", "sample", unix_ms=1_770_000_000_000 + i),
            at=T0 + timedelta(seconds=i), node=node, gpus=[GpuSample(index=0, sm_active=0.5)],
        )  # fmt: skip
        await bus.publish(telemetry.sample(node), batch)


async def stepped_to(bus: Bus, durable: ReplicatedRuntime, core: Counter, n: int) -> None:
    async def done() -> bool:
        last = (await bus.js.stream_info("SEEDANCE_LEDGER_IN")).state.last_seq
        return last >= n and core.seq >= last and durable.consistent

    await eventually(done, 30, what=f"stepped to {n}")
    await durable.settle_acks()


async def counts_on_stream(bus: Bus) -> list[str]:
    """The reasons (counts) of the pause requests in the stream, in order, duplicates shown:
    as many as the stream counts (`read_stream`), never a read to a quiet gap, which a stall
    of delivery on a loaded machine ended early."""
    msgs = await read_stream(bus, "SEEDANCE_COSTS", subject=costs.subject(TENANT, "pause"))
    return [decode(m.data).reason for m in msgs]


async def test_a_replica_killed_after_a_checkpoint_resumes_from_it_doubling_nothing(
    nats_url: str, bus: Bus
) -> None:
    await publish_inputs(bus, [f"n{i}" for i in range(5)])
    async with replica(nats_url, "a", close=False) as (durable, core):
        await stepped_to(bus, durable, core, 5)
        assert await durable.checkpoint()
        await publish_inputs(bus, [f"m{i}" for i in range(5)])
        await stepped_to(bus, durable, core, 10)
        # Killed here: the checkpoint says 5, the stream holds ten outputs.
    async with replica(nats_url, "b") as (durable, core):
        assert core.seq >= 5
        await stepped_to(bus, durable, core, 10)
        assert core.count == 10  # restored at 5 and stepped 6..10 again: the same state
    # The replayed outputs had the same ids: JetStream kept one of each.
    assert await counts_on_stream(bus) == [str(n) for n in range(1, 11)]


async def test_outputs_a_checkpoint_holds_unconfirmed_are_sent_at_start_once(
    nats_url: str, bus: Bus
) -> None:
    """A replica died with an output in its checkpointed outbox: whoever starts next sends it;
    a second start sends it again and JetStream keeps one (its id is the same)."""
    dead = Counter()
    dead.restore(msgspec.msgpack.encode(_Saved(seq=0, count=1, outbox=[(7, 1)])))
    kv = await ensure_bucket(bus, "seedance-ledger")
    assert await Checkpoints(kv, "checkpoint.counter", "dead").write(1, dead.to_bytes())
    for name in ("a", "b"):
        async with replica(nats_url, name) as (_, core):
            assert core.pending() == []  # sent and confirmed at start
            assert core.count == 1
    assert await counts_on_stream(bus) == ["1"]


async def test_two_replicas_step_alike_and_a_refused_input_is_one_dead_letter(
    nats_url: str, bus: Bus
) -> None:
    await publish_inputs(bus, ["n0", "poison-x", "n1"])
    async with (
        replica(nats_url, "a") as (durable_a, core_a),
        replica(nats_url, "b") as (durable_b, core_b),
    ):
        await stepped_to(bus, durable_a, core_a, 3)
        await stepped_to(bus, durable_b, core_b, 3)
        assert (core_a.count, core_b.count) == (2, 2)
    assert await counts_on_stream(bus) == ["1", "2"]
    letters = await bus.js.subscribe(dlq.subject("cost-ledger"), ordered_consumer=True)
    try:
        letter = decode((await letters.next_msg(timeout=5)).data)
        assert isinstance(letter, DeadLetter)
        assert (letter.error_kind, letter.reason) == ("invalid_input", "a poison node")
        info = await bus.js.stream_info("SEEDANCE_DLQ")
        assert info.state.messages == 1  # both replicas sent it; the derived id kept one
    finally:
        await letters.unsubscribe()


async def test_a_node_cannot_spend_the_dead_letter_id_of_its_own_bad_input(
    nats_url: str, bus: Bus
) -> None:
    """docs/security.md, "Nats-Msg-Id": ``SEEDANCE_DLQ`` takes the letters of the replicas and
    those of the nodes' own agents (one duplicate window). A node that published a bad input
    knows its ``Nats-Msg-Id``; with the letter's id derived from it unkeyed, the node spent it
    first on its own ``seedance.dlq.node-agent`` and the replica's letter was dropped (this
    failed so). Keyed with the secret in the replicas' bucket, the letter is stored."""
    poison = GpuSampleBatch(
        id=new_event_id(at=T0), at=T0, node="poison-n9", gpus=[GpuSample(index=0, sm_active=0.5)]
    )
    node = await Bus.connect(as_user(nats_url, "node-agent", name="node-poison-n9"))
    try:
        await node.publish(telemetry.sample("poison-n9"), poison)
        spent = derived_event_id(poison.id, "cost-ledger-dead-letter")  # the unkeyed letter id
        ack = await node.js.publish(
            dlq.subject("node-agent"), b"{}", headers={Header.MSG_ID.value: spent}
        )
        assert not ack.duplicate
        assert ack.stream == "SEEDANCE_DLQ"
    finally:
        await node.close()
    async with replica(nats_url, "a") as (durable, core):
        await stepped_to(bus, durable, core, 1)
    (msg,) = await read_stream(bus, "SEEDANCE_DLQ", subject=dlq.subject("cost-ledger"))
    letter = decode(msg.data)
    assert isinstance(letter, DeadLetter)
    assert (letter.subject, letter.error_kind) == (telemetry.sample("poison-n9"), "invalid_input")
    assert letter.id != spent
