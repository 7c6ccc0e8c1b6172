"""The node side reads none of the slicer's decisions before the ledger's input holds them.

``SEEDANCE_LEDGER_IN`` sources the decisions (from ``SEEDANCE_SLICING``) and the nodes'
telemetry (from ``SEEDANCE_TELEMETRY``) into one duplicate window, with no order between the
two: a node that learns a decision's id before the input has copied it, and publishes a
telemetry message under that id first, has the slicer's copy dropped there (never billed, never
in the node agents' mirror). The shipped ``telemetry-collector`` user (a node-side user on every
Kubernetes node) and compose's ``telemetry-replayer`` held the ``collector-placements`` consumer
on ``SEEDANCE_SLICING`` itself, any filter, so either read a decision straight from the origin.

Deterministic here: as the operator, the input's ``SEEDANCE_SLICING`` sources are taken off,
the slicer publishes a placement (stored in ``SEEDANCE_SLICING``, not in the input), and each
node-side user tries to read it. On the earlier grants both read it from the origin; now no
consumer on ``SEEDANCE_SLICING`` is theirs, the collector's user reads no decision at all, and
the replaying users' durable (``fleet-replayer``, where a server renders it, and compose's
``telemetry-replayer``; on the input's mirror ``SEEDANCE_NODE_DECISIONS``) holds the placement
only once the sources are back and the input holds it. The shared ``node-agent`` user (its
reader of its own on the mirror, any name but the replaying collector's) likewise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio
from nats.js import api as js_api

from seedance.core import Bus, ServiceRuntime, WallClock
from seedance.core.errors import StartRefused
from seedance.events.codec import decode
from seedance.events.node_permissions import FLEET_REPLAYER, TELEMETRY_REPLAYER
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import consumer, ledger, slicing
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import build_source
from seedance.testing.identities import as_user
from seedance.testing.waits import eventually, last_stored
from tests.integration.deploy.refusals import ShippedUser, connect_shipped
from tests.integration.node_agent.test_allocation import placement

ORIGIN = "SEEDANCE_SLICING"
COLLECTOR = "telemetry-collector"
NODE_AGENT = "node-agent"
#: The replaying collector's durable, where the catalogue declares it.
PLACEMENTS = consumer("collector-placements")
NO_WAIT = json.dumps({"batch": 1, "no_wait": True}).encode()


@pytest_asyncio.fixture
async def held_back(admin: Bus) -> AsyncIterator[tuple[Bus, list[js_api.StreamSource]]]:
    """The ledger's input without its ``SEEDANCE_SLICING`` sources, and all of its sources
    (put back after the test): a decision published now is stored at the origin and not copied
    into the input."""
    for stream in {ORIGIN, PLACEMENTS.stream}:  # no reader left by an earlier test
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await admin.js.delete_consumer(stream, PLACEMENTS.durable)
    config = (await admin.js.stream_info(ledger.IN_STREAM)).config
    sources = list(config.sources or [])
    assert any(s.name == ORIGIN for s in sources)
    config.sources = [s for s in sources if s.name != ORIGIN]
    await admin.js.update_stream(config)
    try:
        yield admin, sources
    finally:
        await restore(admin, sources)


async def restore(admin: Bus, sources: list[js_api.StreamSource]) -> None:
    config = (await admin.js.stream_info(ledger.IN_STREAM)).config
    if len(config.sources or []) != len(sources):
        config.sources = sources
        await admin.js.update_stream(config)


async def holds(admin: Bus, stream: str, ev: Placement) -> bool:
    last = await last_stored(admin.js, stream, slicing.subject(ev.tenant, "placement"))
    return last is not None and decode(last.data, Placement).id == ev.id


async def read_from_origin(
    conn: ShippedUser, name: str, subject: str, stream: str = ORIGIN
) -> str | None:
    """The id of the decision ``conn`` reads from ``stream`` (``SEEDANCE_SLICING``) through a
    consumer it creates there (named ``name``, filtered on ``subject``); None when the server
    refuses the create, or when the consumer has nothing to deliver."""
    body = {"stream_name": stream, "config": {"name": name, "durable_name": name}}
    body["config"] |= {
        "filter_subject": subject,
        "ack_policy": "explicit",
        "deliver_policy": "last",
    }
    create = f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{subject}"
    made = await conn.answer(create, json.dumps(body).encode())
    if made is None or "error" in json.loads(made.data):
        return None
    msg = await conn.answer(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{name}", NO_WAIT)
    if msg is None or not msg.data:
        return None
    return decode(msg.data, Placement).id


async def node_agent_reads_after_the_input(
    conn: ShippedUser, admin: Bus, sources: list[js_api.StreamSource], ev: Placement
) -> None:
    """The node agent's user: refused the replaying collector's durable on the mirror; a reader
    of its own there is made and holds nothing while the input is held back, and delivers the
    placement once the input holds it."""
    subject = slicing.subject(ev.tenant, "placement")
    create = f"$JS.API.CONSUMER.CREATE.{PLACEMENTS.stream}.{PLACEMENTS.durable}"
    assert await conn.refused(create, b"{}")  # not the replaying collector's
    mine = "node-agent-in-probe"
    try:
        assert await read_from_origin(conn, mine, subject, PLACEMENTS.stream) is None
        await admin.js.consumer_info(PLACEMENTS.stream, mine)  # made: empty, not refused
        assert not await holds(admin, PLACEMENTS.stream, ev)
        await restore(admin, sources)
        await eventually(lambda: holds(admin, ledger.IN_STREAM, ev), what="the input holds it")
        next_ = f"$JS.API.CONSUMER.MSG.NEXT.{PLACEMENTS.stream}.{mine}"

        async def reads() -> bool:
            msg = await conn.answer(next_, NO_WAIT)
            return msg is not None and bool(msg.data) and decode(msg.data, Placement).id == ev.id

        await eventually(reads, what=f"node-agent reads the placement from {PLACEMENTS.stream}")
    finally:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await admin.js.delete_consumer(PLACEMENTS.stream, mine)


@pytest.mark.parametrize("user", [COLLECTOR, NODE_AGENT, FLEET_REPLAYER, TELEMETRY_REPLAYER])
async def test_a_node_side_user_reads_no_decision_before_the_ledger_input_holds_it(
    auth_url: str, held_back: tuple[Bus, list[js_api.StreamSource]], user: str
) -> None:
    admin, sources = held_back
    slicer = await Bus.connect(as_user(auth_url, "slicer"))
    conn: ShippedUser | None = None
    replay: Bus | None = None
    try:
        ev = placement(f"early-{user}", PlacementKind.WHOLE, [GpuAssignment(index=0, uuid="G-0")])
        subject = slicing.subject(ev.tenant, "placement")
        await slicer.publish(subject, ev)
        assert await holds(admin, ORIGIN, ev)
        assert not await holds(admin, ledger.IN_STREAM, ev)  # held back: not copied
        conn = await connect_shipped(auth_url, user)
        for name in (PLACEMENTS.durable, "any-reader"):
            read = await read_from_origin(conn, name, subject)
            assert read is None, (  # on the earlier grants: this test's own placement
                f"{user} read decision {read} from {ORIGIN} (consumer {name!r}) before "
                f"{ledger.IN_STREAM} held it"
            )
        # nor any other create of a consumer there: unfiltered, ephemeral, the legacy verb
        for create in (
            f"$JS.API.CONSUMER.CREATE.{ORIGIN}.any-reader",
            f"$JS.API.CONSUMER.CREATE.{ORIGIN}",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{ORIGIN}.{PLACEMENTS.durable}",
        ):
            assert await conn.refused(create, b"{}"), create
        assert PLACEMENTS.stream == ledger.NODE_STREAM  # the input's mirror, read after it
        if user == COLLECTOR:  # a real node's collector follows no decision at all
            create = f"$JS.API.CONSUMER.CREATE.{PLACEMENTS.stream}.{PLACEMENTS.durable}"
            assert await conn.refused(create, b"{}")
            assert await conn.refused(f"{create}.{subject}", b"{}")
            return
        if user == NODE_AGENT:  # its own reader on the mirror: nothing before the input has it
            await node_agent_reads_after_the_input(conn, admin, sources, ev)
            return
        replay = await Bus.connect(as_user(auth_url, user))
        await replay.ensure_consumer(PLACEMENTS)
        # the mirror holds nothing the input does not (earlier tests' decisions it may)
        assert not await holds(admin, PLACEMENTS.stream, ev)
        sub = await replay.js.pull_subscribe_bind(PLACEMENTS.durable, PLACEMENTS.stream)
        await restore(admin, sources)
        await eventually(lambda: holds(admin, ledger.IN_STREAM, ev), what="the input holds it")
        got: list[str] = []

        async def read() -> bool:
            with contextlib.suppress(nats.errors.TimeoutError):
                for msg in await sub.fetch(1, timeout=1):
                    got.append(decode(msg.data, Placement).id)
                    await msg.ack_sync(timeout=5)
            return ev.id in got

        await eventually(read, what=f"{user} reads the placement from {PLACEMENTS.stream}")
    finally:
        if replay is not None:
            await replay.close()
        if conn is not None:
            await conn.nc.close()
        await slicer.close()


async def test_a_replay_under_the_node_collector_s_user_ends_at_start_saying_why(
    auth_url: str, admin: Bus, tmp_path: Path
) -> None:
    """The shipped ``telemetry-collector`` (a real node's) has no decisions' read: a replay
    started under it is refused its durable by the server and ends at start naming the durable
    and the users that replay (``serve``: one ``service_refused`` line), not a time-out."""
    csv = tmp_path / "nodes.csv"
    csv.write_text("sn,cpu_milli,memory_mib,gpu,model\nrefused-node-0,32000,131072,2,T4\n")
    settings = CollectorSettings(source="replay", node_csv=str(csv), http_port=0)
    clock = WallClock()
    runtime = ServiceRuntime("telemetry-collector", as_user(auth_url, COLLECTOR), http_port=0)
    svc = CollectorService(runtime, build_source(settings, clock), clock, settings)
    try:
        with pytest.raises(StartRefused) as refused:
            await svc.start()
    finally:
        await svc.close()
    said = str(refused.value)
    assert FLEET_REPLAYER in said, said
    assert f"$JS.API.CONSUMER.CREATE.{PLACEMENTS.stream}.{PLACEMENTS.durable}" in said, said
