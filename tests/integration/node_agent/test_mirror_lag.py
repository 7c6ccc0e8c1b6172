"""The node agent's replay ends once its mirror has copied the origin, not when its consumer has
nothing more pending (the gap docs/node-agent.md described: an agent bound while a fresh mirror
was still copying counted a short replay and refused placements not copied yet).

Against the pinned nats-server with the shipped users: the operator (``admin``) provisions, the
node agent reads as the shipped ``node-agent`` user. The mirror's copy is held back
deterministically: the node agents' mirror is created again while its origin, the ledger's
input, is gone (as when both are provisioned anew), so it has nothing to copy from until the
test provisions the origin, sourcing the slicer's history of decisions. (The origin sources
them in milliseconds, the mirror's settle takes two looks half a second apart: the book is whole
once the replay ends.)
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.core.mirror import mirror_behind
from seedance.events.base import new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import STREAMS, ledger, slicing
from seedance.node_agent.placements import PlacementFeed
from seedance.testing.waits import eventually, stop_task
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.integration

NODE = "gpu-7.example"
TOKEN = "gpu-7:example"
T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
# Enough decisions that a short replay shows; the origin sources them in milliseconds.
DECISIONS = 300
_SPEC = {s.name: s for s in STREAMS}
# The server retries a mirror's failed setup 10 s after its first failure (nats-server's
# retry back-off), so the copy starts that long after the mirror was created.
_COPIED_S = 60.0


async def _bus(url: str, user: str) -> Bus:
    return await Bus.connect(BusSettings(url=url, user=user, password=shipped_password(user)))


def _placement(i: int) -> Placement:
    return Placement(
        id=new_event_id(),
        at=T0,
        job_id=f"job-{i}",
        tenant="acme",
        node=TOKEN,
        kind=PlacementKind.WHOLE,
        gpus=[GpuAssignment(index=i % 8)],
    )


async def test_the_replay_waits_until_the_mirror_has_copied_the_origin(
    admin: Bus, auth_url: str
) -> None:
    # The slicer's history: the origin will source it from here.
    await admin.publish_many(
        [(slicing.subject("acme", "placement"), _placement(i)) for i in range(DECISIONS)]
    )
    # Both provisioned anew, the mirror first: until its origin exists it copies nothing.
    await admin.js.delete_stream(ledger.NODE_STREAM)
    await admin.js.delete_stream(ledger.IN_STREAM)
    await admin.ensure_streams([_SPEC[ledger.NODE_STREAM]])

    node = await _bus(auth_url, "node-agent")
    feed = PlacementFeed(node, NODE)
    start = asyncio.create_task(feed.start())
    try:
        await eventually(
            lambda: start.done() or feed.mirror_behind is not None,
            what="the feed binding, or finding its mirror behind",
        )
        assert not start.done(), "the feed bound a mirror that had copied nothing of its origin"
        assert "not heard from its origin" in (feed.mirror_behind or "") or "failed" in (
            feed.mirror_behind or ""
        ), feed.mirror_behind

        await admin.ensure_streams([_SPEC[ledger.IN_STREAM]])
        await asyncio.wait_for(start, _COPIED_S)
        await feed.catch_up()
        # Caught up means every decision the origin holds, not what the mirror held at a bind.
        assert feed.mirror_behind is None
        assert len(feed.book) == DECISIONS
        assert feed.book.get("acme", f"job-{DECISIONS - 1}") is not None
        info = await node.stream_info(ledger.NODE_STREAM)
        assert info is not None
        assert mirror_behind(info) is None
        assert feed.seq == info.state.last_seq
    finally:
        await stop_task(start)
        await feed.close()
        await node.close()


async def test_a_feed_rebinds_only_once_a_recreated_mirror_has_copied_the_origin(
    admin: Bus, auth_url: str
) -> None:
    """The operator deletes the mirror and provisions it again while an agent runs: its reader
    is gone, and the rebind waits for the new mirror's copy, then reads on from its position."""
    await admin.publish_many(
        [(slicing.subject("acme", "placement"), _placement(i)) for i in range(DECISIONS)]
    )
    await admin.ensure_streams()

    async def origin_whole() -> bool:
        info = await admin.stream_info(ledger.IN_STREAM)
        return info is not None and info.state.messages >= DECISIONS

    await eventually(origin_whole, what="the ledger's input sourcing every decision")
    node = await _bus(auth_url, "node-agent")
    feed = PlacementFeed(node, NODE)
    await feed.start()
    run = asyncio.create_task(feed.run())
    try:
        await feed.catch_up()
        before = len(feed.book)
        assert before >= DECISIONS
        await admin.js.delete_stream(ledger.NODE_STREAM)
        await eventually(
            lambda: feed.mirror_behind == "it does not exist",
            what="the feed waiting for the deleted mirror",
        )
        await admin.ensure_streams([_SPEC[ledger.NODE_STREAM]])
        await eventually(lambda: feed.mirror_behind is None, _COPIED_S, what="the feed's rebind")
        info = await admin.stream_info(ledger.NODE_STREAM)
        assert info is not None
        assert info.state.messages >= before
        assert len(feed.book) == before
    finally:
        await stop_task(run)
        await feed.close()
        await node.close()


async def test_a_runtime_is_not_ready_while_its_service_waits_on_something(
    admin: Bus, auth_url: str
) -> None:
    """The node agent holds its readiness with ``waiting_on`` until its replay is applied."""
    settings = BusSettings(url=auth_url, user="node-agent", password=shipped_password("node-agent"))
    runtime = ServiceRuntime("node-agent", settings)
    runtime.waiting_on = "placement_replay"
    await runtime.start()
    try:
        assert not runtime.ready()
        runtime.waiting_on = None
        assert runtime.ready()
    finally:
        await runtime.stop()
        await runtime.close()
