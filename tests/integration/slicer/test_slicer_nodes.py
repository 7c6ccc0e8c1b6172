"""Nodes come and go through the bus: the slicer service reads a node's state from the inventory
stream (`node.inventory.v1`'s `state`), keeps new work off a cordoned node, and evicts a removed
node's jobs (reason `node_removed`, stamped with the inventory's time, where the cost-ledger
ends their billing) and places them again when room comes."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from seedance.core import Bus
from seedance.events import new_event_id
from seedance.events.slicing import Placement, Preempted, Unschedulable
from seedance.events.telemetry import NodeState
from tests.integration.slicer.test_slicer_service import (
    Decisions,
    add_nodes,
    inventory,
    slicer,
    submit,
)
from tests.integration.slicer.test_slicer_service import env as env  # the fixture, reused


async def test_a_cordoned_node_gets_nothing_new_and_a_removed_node_s_jobs_are_placed_again(
    nats_url: str, env: tuple[Bus, Decisions], unique: str
) -> None:
    bus, d = env
    t = f"t{unique}"
    n0, n1, n2 = (f"n{i}-{unique}" for i in range(3))
    async with slicer(nats_url, unique) as svc:
        await add_nodes(bus, inventory(n0, 4))
        await submit(bus, t, "a", gpus=2)
        await d.wait(lambda: bool(d.of(Placement, "a")))
        assert d.of(Placement, "a")[0].node == n0
        # Cordoned: a's place is kept; b, which would fit beside it, waits.
        await add_nodes(bus, msgspec.structs.replace(inventory(n0, 4), state=NodeState.CORDONED))
        await d.wait(lambda: svc.scheduler.snapshot().nodes[0].state == "cordoned")
        await submit(bus, t, "b", gpus=2)
        await d.wait(lambda: bool(d.of(Unschedulable, "b")))
        assert not d.of(Placement, "b")
        await add_nodes(bus, inventory(n1, 2))
        await d.wait(lambda: bool(d.of(Placement, "b")))
        assert d.of(Placement, "b")[0].node == n1
        # n0 leaves: a is evicted at the inventory's time and waits (n1 is full) ...
        gone_at = datetime.now(UTC)
        removed = msgspec.structs.replace(
            inventory(n0, 4), id=new_event_id(), at=gone_at, state=NodeState.REMOVED
        )
        await add_nodes(bus, removed)
        await d.wait(lambda: bool(d.of(Preempted, "a")))
        (evicted,) = d.of(Preempted, "a")
        assert (evicted.node, evicted.reason, evicted.by_job_id) == (n0, "node_removed", "")
        assert evicted.at == gone_at
        assert ("t" + unique, "a") in svc.scheduler.waiting_jobs
        # ... until a node with room joins: a runs again there, its second attempt.
        await add_nodes(bus, inventory(n2, 2))
        await d.wait(lambda: len(d.of(Placement, "a")) == 2)
        again = d.of(Placement, "a")[1]
        assert again.node == n2
        assert not d.of(Preempted, "b")
