"""A node cannot spend the slicer's next placement id in the ledger's input (docs/security.md,
"Nats-Msg-Id").

``SEEDANCE_LEDGER_IN`` sources the slicer's decisions (``SEEDANCE_SLICING``) and the nodes'
telemetry (``SEEDANCE_TELEMETRY``, written by the nodes' own users) into one stream, with one
duplicate window, and the node agents' ``SEEDANCE_NODE_DECISIONS`` mirrors it. A node reads
every placement there, and each carries its job's submit id (``cause_id``), from which the
slicer derived the ids of the job's placements: ``placement/<attempt>/<part>``. With those ids
unkeyed, a node that read a job's first placement published the id of its second on its own
inventory subject; once the job was moved (here: the node reported itself removed), the
slicer's new placement was stored in ``SEEDANCE_SLICING`` but never copied into the ledger's
input (nor the node agents' mirror): the ledger did not bill it and the new node's agent never
saw it. The slicer now keys its ids with a secret in its own bucket.

Real pinned server with the shipped authorization: the slicer as ``slicer``, the tenant as
``tenant-acme``, the collector as ``telemetry-collector``, the attacker as ``node-agent``.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from nats.js.errors import NotFoundError

from seedance.core import Bus, ServiceRuntime, WallClock
from seedance.core.reader import PullReader
from seedance.events import decode, derived_event_id, new_event_id
from seedance.events.node_permissions import node_reader_replica
from seedance.events.slicing import Placement
from seedance.events.subjects import Header, ledger, replica_consumer, slicing, telemetry
from seedance.events.telemetry import NodeState
from seedance.sdk import SeedanceClient
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.waits import eventually, last_stored
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.slicer.test_autosize_rollback import TENANT, a100_node, as_user, read

pytestmark = pytest.mark.slow


async def first_placement(node_bus: Bus, node: str, job: str) -> Placement:
    """`job`'s placement as `node`'s agent reads it, with its own reader of the mirror."""
    spec = replica_consumer("node-agent-in", node_reader_replica(node))
    await node_bus.ensure_consumer(spec)
    reader = PullReader(node_bus.nc, spec.stream, spec.durable, batch=100)
    await reader.start()
    try:
        while True:
            msgs = await reader.next_batch(timeout_s=10.0)
            assert msgs, "no decision reached the node's reader"
            for m in msgs:
                ev = decode(m.data)
                if isinstance(ev, Placement) and ev.job_id == job:
                    return ev
    finally:
        await reader.close()


async def stored(admin: Bus, stream: str, subject: str) -> list[Any]:
    """Every event `stream` holds on `subject`, read by sequence (the ledger's input has no
    subjects of its own: a subscription on one would read the origin's copies; a mirror keeps
    its origin's sequences, gaps and all)."""
    info = await admin.js.stream_info(stream)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await admin.js.get_msg(stream, seq)
        except NotFoundError:
            continue
        if msg.subject == subject:
            out.append(decode(msg.data or b""))
    return out


async def copied(admin: Bus, stream: str, subject: str, job: str) -> list[Any]:
    """What `stream` holds on `subject` once `job`'s placement is there (a placement published
    after those the caller looks at, copied by the same source: all before it are copied, or
    dropped)."""

    async def there() -> bool:
        return any(getattr(e, "job_id", None) == job for e in await stored(admin, stream, subject))

    await eventually(there, 20, what=f"{job}'s placement in {stream}")
    return await stored(admin, stream, subject)


async def test_a_node_cannot_spend_the_id_of_a_jobs_next_placement(
    auth_url: str, admin: Bus
) -> None:
    u = uuid.uuid4().hex[:6]
    attacker_node, other_node, job = f"spend-a-{u}", f"spend-b-{u}", f"train-{u}"
    subject = slicing.subject(TENANT, "placement")

    def moved(events: list[Any]) -> list[Placement]:
        return [
            e
            for e in events
            if isinstance(e, Placement) and e.node == other_node and e.job_id == job
        ]

    # Each connection is closed however far this got (one that failed to open closes those
    # opened before it).
    async with contextlib.AsyncExitStack() as opened:
        attacker = await Bus.connect(as_user(auth_url, "node-agent"))
        opened.push_async_callback(attacker.close)
        collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
        opened.push_async_callback(collector.close)
        tenant = await SeedanceClient.connect(
            auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
        )
        opened.push_async_callback(tenant.close)
        runtime = ServiceRuntime("slicer", as_user(auth_url, "slicer"))
        svc = SlicerService.build(
            runtime, WallClock(), SlicerSettings(pool=f"spend-{u}", replica="a", lease_ttl_s=1.5)
        )
        opened.push_async_callback(svc.close)
        own = a100_node(attacker_node)
        await collector.publish(telemetry.inventory(attacker_node), own)
        async with serving(svc):
            await eventually(lambda: attacker_node in svc.scheduler.node_names, 20, what="node")
            placed = await tenant.submit_job(TENANT, job, gpus=1, wait_s=20)
            assert isinstance(placed.decision, Placement)
            assert placed.decision.node == attacker_node
            # What the node reads: the placement and the submit id it was derived from.
            first = await first_placement(attacker, attacker_node, job)
            assert first.id == placed.decision.id
            assert first.cause_id
            # The node spends what the unkeyed derivation gives the job's second placement,
            # on its own inventory subject (its own inventory, unchanged but for the id).
            spent = derived_event_id(first.cause_id, "placement/2/0")
            ack = await attacker.js.publish(
                telemetry.inventory(attacker_node),
                msgspec.json.encode(msgspec.structs.replace(own, id=spent)),
                headers={Header.MSG_ID.value: spent},
            )
            assert not ack.duplicate

            # Before the slicer decides the second placement: the ledger's input holds the
            # node's message under that id (its source copies it), so on unkeyed ids the
            # placement's copy is a duplicate every run, not only when the copy wins a race.
            async def spent_in_ledger_in() -> bool:
                msg = await last_stored(
                    admin.js, ledger.IN_STREAM, telemetry.inventory(attacker_node)
                )
                return msg is not None and decode(msg.data or b"").id == spent

            await eventually(
                spent_in_ledger_in, 20, what="the node's message in the ledger's input"
            )
            # A node of two GPUs joins; the attacker's leaves, and the job moves there.
            two = a100_node(other_node)
            gpu1 = msgspec.structs.replace(two.gpus[0], index=1)
            await collector.publish(
                telemetry.inventory(other_node),
                msgspec.structs.replace(two, gpus=[*two.gpus, gpu1]),
            )
            await eventually(lambda: other_node in svc.scheduler.node_names, 20, what="node b")
            now = datetime.now(UTC)
            gone = msgspec.structs.replace(
                own, id=new_event_id(at=now), at=now, state=NodeState.REMOVED
            )
            await attacker.publish(telemetry.inventory(attacker_node), gone)

            async def slicing_has_it() -> bool:
                return bool(moved(await read(admin, "SEEDANCE_SLICING", subject, job)))

            await eventually(slicing_has_it, 20, what="the second placement")
            (second,) = moved(await read(admin, "SEEDANCE_SLICING", subject, job))
            # A later placement, copied by the same source: once it is in the ledger's input,
            # the second one was copied before it, or dropped.
            later = await tenant.submit_job(TENANT, f"{job}-later", gpus=1, wait_s=20)
            assert isinstance(later.decision, Placement)

            # The ledger's input, and the node agents' mirror of it (which the new node's
            # agent reads), hold it: the node's message under the id it computed did not take
            # its place.
            for stream in (ledger.IN_STREAM, ledger.NODE_STREAM):
                held = moved(await copied(admin, stream, subject, f"{job}-later"))
                assert [p.id for p in held] == [second.id], f"dropped from {stream}"
            assert second.id != spent
