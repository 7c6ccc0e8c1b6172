"""The node agent's reader of its MIG plans (`seedance.node_agent.plans.PlanFeed`) against a real
nats-server: what it does with a plan that raises, a replay whose plans go before they are
read, and a stream deleted (and created again) under it; and the replay of its placements'
reader (`PlacementFeed`) when its decisions go before they are read.

The applier is the one the agent wires on a node without mig-manager (`MigApplier` on a
constructed four-GPU NVML, tests/unit/node_agent/nvml_mig.py), or, where the node cannot tell a
plan done (``in_effect`` None, as under mig-manager), the same applier without that question.
Each test has its own node (its own plan subject and reader); those that delete the stream run
their own server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import nats.js.errors
import pytest
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings
from seedance.core.clock import WallClock
from seedance.core.reader import PullReader, ReaderInterrupted
from seedance.core.retry import RetryPolicy
from seedance.events.base import new_event_id
from seedance.events.slicing import GpuAssignment, MigInstanceChange, MigLayoutPlan, PlacementKind
from seedance.events.subjects import ledger, slicing
from seedance.node_agent import placements, plans
from seedance.node_agent.mig import MigApplier
from seedance.node_agent.placements import PlacementFeed
from seedance.node_agent.plans import PlanFeed
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually, stop_task
from tests.integration.node_agent.test_allocation import NODE, placement, publish
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 7, 23, 0, tzinfo=UTC)


def plan(node: str, gpu: int) -> MigLayoutPlan:
    return MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node=node,
        gpu_index=gpu,
        create=[MigInstanceChange(profile="3g.71gb", start_slot=0)],
    )


class Node:
    """A node's GPUs and what its reader handed over: ``outcomes`` as the agent counts them."""

    def __init__(self, *, tells_done: bool = True) -> None:
        self.name = f"feed-{uuid.uuid4().hex[:10]}"
        self.nvml = ConstructedNvmlMig(gpus=4)
        self.applier = MigApplier(self.nvml, allocated=lambda gpu: [])
        self.tells_done = tells_done
        self.outcomes: list[str] = []
        self.applied: list[int] = []

    async def apply(self, p: MigLayoutPlan) -> None:
        result = self.applier.apply(p)  # raises where NVML has no such GPU
        self.outcomes.append(result.outcome.value)
        self.applied.append(p.gpu_index)

    def feed(self, bus: Bus) -> PlanFeed:
        return PlanFeed(
            bus,
            self.name,
            apply=self.apply,
            in_effect=self.applier.in_effect if self.tells_done else None,
            skipped=self.outcomes.append,
        )

    def cut(self, gpu: int) -> bool:
        return len(self.nvml.gpu_instances(gpu)) == 1


async def read_until(feed: PlanFeed, check: Callable[[], bool], what: str) -> None:
    """Step the reader until ``check`` holds (each step reads for up to 0.1 s)."""

    async def stepped() -> bool:
        await feed.step(timeout_s=0.1)
        return check()

    await eventually(stepped, what=what)


@pytest.fixture
async def own_server() -> AsyncIterator[Bus]:
    """A server of the test's own (its plans' stream is deleted), and the operator's bus."""
    server = NatsServer()
    try:
        bus = await Bus.connect(BusSettings(url=server.url, name="test"))
        try:
            await bus.ensure_streams()
            yield bus
        finally:
            await bus.close()
    finally:
        server.stop()


async def test_a_plan_that_raises_fails_alone_and_the_others_are_applied(bus: Any) -> None:
    """A plan for GPU 9 on a four-GPU node: NVML raises asking whether it is done. It is
    counted ``failed``; the good plan beside it, read back at the start or read live, is
    applied. Before, the error left the reader (the agent's task group: the agent ended, and
    every start read the bad plan back and ended again), and held back the good plan."""
    node = Node()
    subject = slicing.mig_plan(node.name)
    await bus.publish(subject, plan(node.name, 9))
    await bus.publish(subject, plan(node.name, 0))
    feed = node.feed(bus)
    await feed.start()
    try:
        with capture_logs() as logs:
            await read_until(feed, lambda: node.cut(0), "the good plan of the replay applied")
            await bus.publish(subject, plan(node.name, 9))
            await bus.publish(subject, plan(node.name, 1))
            await read_until(feed, lambda: node.cut(1), "the good live plan applied")
    finally:
        await feed.close()
    assert node.outcomes == ["failed", "applied", "failed", "applied"]
    failed = [r for r in logs if r["event"] == "mig_plan_failed"]
    errors = [(r["gpu"], r["error"].split(":")[0]) for r in failed]
    assert errors == [(9, "NVMLError_InvalidArgument")] * 2


async def test_a_plan_whose_apply_raises_fails_alone(bus: Any) -> None:
    """Where the node cannot tell a plan done (mig-manager's), the bad plan raises applying:
    counted ``failed``, the next one applied."""
    node = Node(tells_done=False)
    subject = slicing.mig_plan(node.name)
    feed = node.feed(bus)
    await feed.start()
    try:
        await bus.publish(subject, plan(node.name, 9))
        await bus.publish(subject, plan(node.name, 2))
        await read_until(feed, lambda: node.cut(2), "the plan after the bad one applied")
    finally:
        await feed.close()
    assert node.outcomes == ["failed", "applied"]


@pytest.mark.parametrize("tells_done", [True, False], ids=["nvml", "mig-manager"])
async def test_the_replay_ends_though_its_plans_went_before_they_were_read(
    bus: Any, monkeypatch: pytest.MonkeyPatch, tells_done: bool
) -> None:
    """The node's plans purged (or expired) between the bind and the first read: the replay
    holds nothing, and ends. Before, it waited for as many deliveries as the consumer's
    pending count at the bind: never reached, every later plan was held (and, where the node
    cannot tell a plan done, would have been counted as read back, not applied)."""
    node = Node(tells_done=tells_done)
    subject = slicing.mig_plan(node.name)
    for _ in range(3):
        await bus.publish(subject, plan(node.name, 0))

    class PurgedFirst(PullReader):
        async def start(self) -> None:  # the consumer is bound: its plans go, then it reads
            await bus.js.purge_stream(slicing.PLAN_STREAM, subject=subject)
            await super().start()

    monkeypatch.setattr(plans, "PullReader", PurgedFirst)
    feed = node.feed(bus)
    await feed.start()
    try:
        await bus.publish(subject, plan(node.name, 1))  # published after the start returned
        await read_until(feed, lambda: node.cut(1), "the live plan applied")
    finally:
        await feed.close()
    assert node.applied == [1]
    assert node.outcomes == ["applied"]


async def test_a_stream_deleted_and_created_again_is_read_from_its_first(own_server: Bus) -> None:
    """Deleted, the stream is not there when the reader binds again: the bind is tried again
    (logged), never raised. Created again (its sequences from 1), it is read from its first
    message. Before, the rebind raised the stream's absence out of the reader, and once the
    stream was back it read on from the old stream's sequence, skipping the new one's plans
    until the agent restarted."""
    bus = own_server
    node = Node()
    subject = slicing.mig_plan(node.name)
    feed = node.feed(bus)
    await feed.start()
    try:
        for gpu in (0, 1):
            await bus.publish(subject, plan(node.name, gpu))
        await read_until(feed, lambda: node.cut(1), "the first stream's plans applied")
        await bus.js.delete_stream(slicing.PLAN_STREAM)
        with capture_logs() as logs:

            def retried() -> bool:
                return any(r["event"] == "node_agent_plans_rebind_failed" for r in logs)

            await read_until(feed, retried, "a rebind without the stream, to be tried again")
        await bus.ensure_streams()
        await bus.publish(subject, plan(node.name, 2))  # sequence 1 of the new stream
        await read_until(feed, lambda: node.cut(2), "the new stream's plan applied")
    finally:
        await feed.close()
    assert node.applied == [0, 1, 2]


async def test_the_placements_replay_ends_though_its_decisions_went_before_they_were_read(
    own_server: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The placements' feed counted its replay the same way: the decisions the node agents'
    mirror held at the bind, gone (a week old, or purged) before they were read, left the
    count unreached, and the agent never registered its plugins. Its replay now ends when
    nothing is left for it."""
    bus = own_server
    for i in range(3):
        await publish(bus, placement(f"job-{i}", PlacementKind.WHOLE, [GpuAssignment(index=i)]))

    async def mirrored() -> bool:
        return (await bus.js.stream_info(ledger.NODE_STREAM)).state.messages == 3

    await eventually(mirrored, what="the decisions in the node agents' mirror")

    class PurgedFirst(PullReader):
        async def start(self) -> None:  # the consumer is bound: its decisions go, then it reads
            await bus.js.purge_stream(ledger.NODE_STREAM)
            await super().start()

    monkeypatch.setattr(placements, "PullReader", PurgedFirst)
    feed = PlacementFeed(bus, NODE)
    await feed.start()
    replay = asyncio.create_task(feed.catch_up())
    try:
        await eventually(replay.done, what="the replay ended")
        await replay
    finally:
        await stop_task(replay)
        await feed.close()
    assert feed.caught_up
    assert len(feed.book) == 0


async def test_a_plan_published_while_the_reader_waited_is_live_after_a_rebind(
    bus: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bound, then not read (the plans wait for the kubelet): the server drops the idle
    consumer, and the next read binds again. A plan published after the start is live, and
    applied where the node cannot tell a plan done. Before, the rebind took the stream's last
    sequence then as the replay's end: the plan counted as read back, ``not_replayed``."""
    spec = plans.node_plan_reader
    monkeypatch.setattr(plans, "node_plan_reader", lambda n: replace(spec(n), inactive_s=0.5))
    node = Node(tells_done=False)
    feed = node.feed(bus)
    await feed.start()
    reader = plans.node_plan_reader(node.name)

    async def dropped() -> bool:
        try:
            await bus.js.consumer_info(reader.stream, reader.durable)
        except nats.js.errors.NotFoundError:
            return True
        return False

    try:
        await eventually(dropped, what="the idle reader's consumer dropped by the server")
        await bus.publish(slicing.mig_plan(node.name), plan(node.name, 3))
        await read_until(feed, lambda: bool(node.outcomes), "the plan handed over")
    finally:
        await feed.close()
    assert node.outcomes == ["applied"]


async def test_a_pull_refused_for_good_is_bound_again_after_a_growing_delay(
    bus: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bind succeeds and each read is refused: the first refusal binds again at once, the
    next ones after the retry policy's growing delay. Before, a bind that succeeded reset the
    backoff, and the reader bound again in a loop with no delay."""

    class Refused(PullReader):
        async def next_batch(self, timeout_s: float) -> list[Any]:
            raise ReaderInterrupted("pull request refused: 409 Consumer Deleted")

    class Slept(WallClock):
        def __init__(self) -> None:
            self.slept: list[float] = []

        async def sleep(self, seconds: float) -> None:
            self.slept.append(seconds)

    monkeypatch.setattr(plans, "PullReader", Refused)
    node = Node()
    clock = Slept()
    feed = PlanFeed(
        bus,
        node.name,
        apply=node.apply,
        in_effect=None,
        skipped=node.outcomes.append,
        clock=clock,
        retry=RetryPolicy(jitter=0.0),
    )
    await feed.start()
    try:
        for _ in range(4):
            await feed.step(timeout_s=0.1)
    finally:
        await feed.close()
    assert clock.slept == [0.2, 0.4, 0.8]
