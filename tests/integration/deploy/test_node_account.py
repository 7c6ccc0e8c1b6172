"""A node-side user's forged reply subject, on a real nats-server running the shipped config.

nats-server answers a request at the request's reply subject under no user's permissions (a
JetStream publish ack, an API answer, a pull's messages, an ack's confirmation). While node users
were users of Seedance's account, the shared ``node-agent`` publishing ``$JS.API.INFO`` with the
reply ``$KV.seedance-leases.slicer.default`` had the server overwrite the slicer's lease, and a
telemetry publish with the reply ``$KV.seedance-tenants.evil`` stored a tenant key (review
HIGH-2). Node-side users (``node-<node>``, the shared node agents, ``telemetry-replayer``) are
now users of ``NODES`` (``seedance.events.accounts``): each request crosses a service import,
the server replaces its reply by one of its own and carries the answers back into ``NODES``.

As in test_tenant_account, each forged request is followed by the operator's control
(`forged.assert_lands_nowhere`). The node
users' own paths still work: telemetry acks, the node agent's pull reader, the collector's
acked pulls, the node agent's reader of its MIG plans.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
import nkeys
import pytest
import pytest_asyncio
from nats.js import api as js_api

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry
from seedance.core.barrier import flushed
from seedance.core.reader import PullReader
from seedance.core.xkeys import CurveKeyPair
from seedance.events.node_permissions import TELEMETRY_REPLAYER, node_plan_reader, node_reader
from seedance.events.permissions import CALLOUT_USER
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.stores import POLICY_BUCKET, QUOTA_POLICY_KEY
from seedance.events.subjects import consumer, replica_consumer, slicing, telemetry
from seedance.node_agent.core.plan_source import not_a_stored_plan
from seedance.testing.identities import as_user
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually
from tests.integration.deploy.forged import LEASES, assert_lands_nowhere, last_stored
from tests.integration.deploy.refusals import ShippedUser, connect_as, connect_shipped
from tests.integration.node_agent.agent import merged
from tests.integration.node_agent.test_allocation import placement

pytestmark = pytest.mark.asyncio(loop_scope="module")

#: A node the auth callout admits (registered at run time), and one of the shipped replay's.
NODE, REPLAYED = "gpu-n1", "compose-node-0"
#: (stream, subject) of what a forged reply aims at: the slicer's lease, its journal, the
#: quota policy, the tenant registry.
TARGETS = [
    (f"KV_{LEASES}", f"$KV.{LEASES}.slicer.default"),
    ("KV_seedance-slicer-state", "$KV.seedance-slicer-state.default"),
    (f"KV_{POLICY_BUCKET}", f"$KV.{POLICY_BUCKET}.{QUOTA_POLICY_KEY}"),
    ("KV_seedance-tenants", "$KV.seedance-tenants.evil"),
]
DECISIONS = consumer("node-agent-in").stream
PLACEMENTS = consumer("collector-placements")
#: The node agent's reader the shared user's forged pulls ask (empty: its answer is a 404
#: status); a node's own user may name only its own reader (`node_reader`).
PROBE = "node-agent-in-probe"
OWN = node_reader(NODE)
NO_WAIT = json.dumps({"batch": 5, "no_wait": True}).encode()
PLANS = slicing.PLAN_STREAM


def plans_reader(reader: str) -> str:
    """The plans' reader the user asks: a node's own user its own, the shared one any."""
    return node_plan_reader(NODE).durable if reader == OWN else "node-agent-plans-probe"


@dataclass
class Running:
    url: str
    admin: Bus
    node_password: str


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running(
    server: NatsServer, issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> AsyncIterator[Running]:
    admin = await Bus.connect(as_user(server.url, "admin"))
    callout_bus = await Bus.connect(as_user(server.url, CALLOUT_USER))
    try:
        await admin.ensure_streams()
        await admin.js.key_value(LEASES)  # provisioned
        registry = await TenantRegistry.open(admin)
        pw = await registry.add_node(NODE)
        async with AuthCallout(callout_bus, issuer, xkey=xkey, refusal_delay_s=0.0):
            yield Running(server.url, admin, pw)
    finally:
        await callout_bus.close()
        await admin.close()


def password_of(running: Running, user: str) -> str | None:
    return running.node_password if user == f"node-{NODE}" else None


async def fresh_placements(admin: Bus) -> None:
    """The collector's durable made anew: it holds what the stream holds, none delivered yet
    (an earlier test's pulls, in any order, leave it nothing owed)."""
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await admin.js.delete_consumer(PLACEMENTS.stream, PLACEMENTS.durable)
    await admin.ensure_consumer(PLACEMENTS)


@pytest_asyncio.fixture(loop_scope="module")
async def readers(running: Running) -> None:
    """The pulls' consumers, holding nothing (a pull is answered by a 404 status): a stored
    message delivered to the control key twice would be dropped there as a duplicate (its
    ``Nats-Msg-Id`` travels with it), and the control would never land."""
    for name in (PROBE, OWN):
        # made anew: an earlier test's (the node agent's own reader, from its start) may hold
        # stored decisions
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await running.admin.js.delete_consumer(DECISIONS, name)
        await running.admin.js.add_consumer(
            DECISIONS,
            js_api.ConsumerConfig(
                durable_name=name,
                deliver_policy=js_api.DeliverPolicy.NEW,
                ack_policy=js_api.AckPolicy.NONE,
            ),
        )
    await fresh_placements(running.admin)
    admin = running.admin
    pending = (await admin.js.consumer_info(PLACEMENTS.stream, PLACEMENTS.durable)).num_pending
    if pending:  # what earlier tests published: read and acked as the operator
        sub = await admin.js.pull_subscribe_bind(PLACEMENTS.durable, PLACEMENTS.stream)
        for msg in await sub.fetch(pending, timeout=5):
            await msg.ack_sync(timeout=5)
        await sub.unsubscribe()
    info = await admin.js.consumer_info(PLACEMENTS.stream, PLACEMENTS.durable)
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


async def connect_node(running: Running, user: str) -> ShippedUser:
    pw = password_of(running, user)
    if pw is None:
        return await connect_shipped(running.url, user)
    return await connect_as(running.url, user, pw)


def requests(
    node: str, agent: bool, collector: bool, reader: str = PROBE
) -> list[tuple[str, bytes]]:
    """Every kind of request the user may send that the server answers itself (``reader``:
    the decisions' reader it may name)."""
    out = [
        (telemetry.sample(node), b"{}"),  # a publish ack
        ("$JS.API.INFO", b""),
        ("$JS.API.STREAM.INFO.SEEDANCE_TELEMETRY", b""),
    ]
    if agent:
        out += [
            ("seedance.dlq.node-agent", b"{}"),
            (f"$JS.API.CONSUMER.INFO.{DECISIONS}.{reader}", b""),
            (f"$JS.API.CONSUMER.MSG.NEXT.{DECISIONS}.{reader}", NO_WAIT),
            # its plans' reader (absent: answered with an error, an answer all the same)
            (f"$JS.API.CONSUMER.INFO.{PLANS}.{plans_reader(reader)}", b""),
            # last: a node's own user may delete only its own reader
            (f"$JS.API.CONSUMER.DELETE.{DECISIONS}.{reader}", b""),
        ]
    if collector:
        out += [
            ("seedance.dlq.telemetry-collector", b"{}"),
            (f"$JS.API.CONSUMER.INFO.{PLACEMENTS.stream}.{PLACEMENTS.durable}", b""),
            (f"$JS.API.CONSUMER.MSG.NEXT.{PLACEMENTS.stream}.{PLACEMENTS.durable}", NO_WAIT),
        ]
    return out


USERS = [
    pytest.param("node-agent", NODE, True, False, id="node-agent"),
    # a node's own user holds its collector's grants, which follow no decision
    pytest.param(f"node-{NODE}", NODE, True, False, id="node-callout"),
    pytest.param(TELEMETRY_REPLAYER, REPLAYED, False, True, id="telemetry-replayer"),
]


@pytest.mark.usefixtures("readers")
@pytest.mark.parametrize(("user", "node", "agent", "collector"), USERS)
async def test_a_forged_reply_lands_on_no_subject_of_seedance(
    running: Running, user: str, node: str, agent: bool, collector: bool
) -> None:
    admin = running.admin
    conn = await connect_node(running, user)
    try:
        reader = OWN if user == f"node-{NODE}" else PROBE
        for subject, body in requests(node, agent, collector, reader):
            await assert_lands_nowhere(admin, conn, subject, body, TARGETS)
        assert not conn.errors, conn.errors  # every request was the user's to send
    finally:
        await conn.nc.close()


@pytest.mark.parametrize(("user", "node"), [(p.values[0], p.values[1]) for p in USERS])
async def test_each_node_side_user_s_own_answers_still_reach_it(
    running: Running, user: str, node: str
) -> None:
    conn = await connect_node(running, user)
    try:
        ack = await conn.nc.jetstream(timeout=5.0).publish(telemetry.sample(node), b"{}")
        assert ack.stream == "SEEDANCE_TELEMETRY"
        reply = await conn.nc.request("$JS.API.INFO", b"", timeout=5)
        assert b"account_info_response" in reply.data
        assert not conn.errors, conn.errors
    finally:
        await conn.nc.close()


def decision(job: str) -> Placement:
    return placement(job, PlacementKind.WHOLE, [GpuAssignment(index=0, uuid="GPU-0")])


async def test_the_node_agent_s_pull_reader_gets_every_decision_of_a_batch(
    running: Running,
) -> None:
    """A pull is answered by several messages: all of them cross (``response_type: stream``;
    a single-answer export let the first through and dropped the rest, never redelivered)."""
    slicer = await Bus.connect(as_user(running.url, "slicer"))
    node = await Bus.connect(
        BusSettings(url=running.url, user=f"node-{NODE}", password=running.node_password)
    )
    reader: PullReader | None = None
    try:
        events = [decision(f"job-{i}") for i in range(3)]
        for ev in events:
            await slicer.publish(slicing.subject(ev.tenant, "placement"), ev)
        last = await merged(running.admin.js, events[-1])
        spec = replica_consumer("node-agent-in", NODE, start_seq=last - 2)
        await node.ensure_consumer(spec)
        reader = PullReader(node.nc, spec.stream, spec.durable, batch=10)
        await reader.start()
        got: list[str] = []

        async def all_read() -> bool:
            assert reader is not None
            got.extend(json.loads(m.data)["job_id"] for m in await reader.next_batch(0.5))
            return len(got) >= 3

        await eventually(all_read, 10.0, what="three decisions through one pull")
        assert got == [ev.job_id for ev in events]
    finally:
        if reader is not None:
            await reader.close()
        await node.close()
        await slicer.close()


async def test_the_collector_acks_what_it_pulls_and_a_forged_ack_reply_lands_nowhere(
    running: Running,
) -> None:
    admin = running.admin
    slicer = await Bus.connect(as_user(running.url, "slicer"))
    conn = await connect_shipped(running.url, TELEMETRY_REPLAYER)
    try:
        await fresh_placements(admin)
        events = [decision(f"acked-{i}") for i in range(3)]
        for ev in events:
            await slicer.publish(slicing.subject(ev.tenant, "placement"), ev)
        sub = await conn.nc.jetstream(timeout=5.0).pull_subscribe_bind(
            PLACEMENTS.durable, PLACEMENTS.stream
        )
        msgs = []

        async def pulled() -> bool:
            with contextlib.suppress(nats.errors.TimeoutError):  # none stored yet
                msgs.extend(await sub.fetch(3 - len(msgs), timeout=1))
            return len(msgs) >= 3

        await eventually(pulled, 10.0, what="three placements through the collector's pull")
        before = {t: await last_stored(admin, *t) for t in TARGETS}
        for msg, (_, target) in zip(msgs[:2], TARGETS, strict=False):
            await conn.nc.publish(msg.reply, b"+ACK", reply=target)
        await msgs[2].ack_sync(timeout=5)  # answered: the forged ones before it were too
        after = {t: await last_stored(admin, *t) for t in TARGETS}
        assert after == before
        info = await admin.js.consumer_info(PLACEMENTS.stream, PLACEMENTS.durable)
        assert info.num_ack_pending == 0
        assert not conn.errors, conn.errors
    finally:
        await conn.nc.close()
        await slicer.close()


async def test_a_mig_plan_the_slicer_publishes_reaches_the_node_agent(running: Running) -> None:
    """The node's own user reads it with its own reader on the plans' stream: the pull crosses
    the service import and its answers come back; the plan is a stored plan of that reader
    (``plan_source``)."""
    slicer = await Bus.connect(as_user(running.url, "slicer"))
    node = await Bus.connect(
        BusSettings(url=running.url, user=f"node-{NODE}", password=running.node_password)
    )
    spec = node_plan_reader(NODE)
    reader = PullReader(node.nc, spec.stream, spec.durable, batch=64)
    try:
        plan = slicing.mig_plan(NODE)
        await node.ensure_consumer(spec)
        await reader.start()
        ack = await slicer.js.publish(plan, b'{"plan": 1}')
        assert ack.stream == spec.stream
        read: list[Any] = []

        async def arrived() -> bool:
            read.extend(await reader.next_batch(timeout_s=0.5))
            return any(m.data == b'{"plan": 1}' for m in read)

        await eventually(arrived, what="the plan read by the node's reader")
        msg = next(m for m in read if m.data == b'{"plan": 1}')
        mine = f"$JS.ACK.{spec.stream}.{spec.durable}."
        assert not_a_stored_plan(msg.subject, msg.reply, msg.data, plan, mine) is None
    finally:
        await reader.close()
        await node.close()
        await slicer.close()


@pytest.mark.usefixtures("readers")
async def test_a_nodes_user_may_touch_no_other_nodes_reader(running: Running) -> None:
    """A node's own user names its own decisions' reader only: with the node agent's grant of
    any consumer there, one node drained another's reader, deleted it, and filled the stream
    with 1,000 durables of its own until no node agent could make its reader (review of
    2026-12-07). The shared ``node-agent`` user still may (it speaks for every node)."""
    other = node_reader("gpu-n2")
    conn = await connect_node(running, f"node-{NODE}")
    try:
        create = json.dumps({"stream_name": DECISIONS, "config": {"durable_name": "junk"}})
        probes = [
            (f"$JS.API.CONSUMER.MSG.NEXT.{DECISIONS}.{other}", NO_WAIT),
            (f"$JS.API.CONSUMER.INFO.{DECISIONS}.{other}", b""),
            (f"$JS.API.CONSUMER.DELETE.{DECISIONS}.{other}", b""),
            (f"$JS.API.CONSUMER.CREATE.{DECISIONS}.{other}", b"{}"),
            (f"$JS.API.CONSUMER.CREATE.{DECISIONS}.junk", create.encode()),
            (f"$JS.API.CONSUMER.DURABLE.CREATE.{DECISIONS}.junk", create.encode()),
        ]
        answers = await conn.nc.subscribe(f"_INBOX.{NODE}-probes.*")
        for i, (subject, body) in enumerate(probes):
            await conn.nc.publish(subject, body, reply=f"_INBOX.{NODE}-probes.{i}")
        await flushed(conn.nc)

        def unrefused() -> list[str]:  # the server's refusals come by callback, each named
            said = "\n".join(conn.errors).lower()
            return [s for s, _ in probes if s.lower() not in said]

        await eventually(lambda: not unrefused(), 10.0, what="every probe refused by name")
        # a refused publish is never delivered: no API answered any of them
        await conn.nc.request(f"$JS.API.CONSUMER.INFO.{DECISIONS}.{OWN}", b"", timeout=5)
        assert answers.pending_msgs == 0
        reply = await conn.nc.request(f"$JS.API.CONSUMER.INFO.{DECISIONS}.{OWN}", b"", timeout=5)
        assert json.loads(reply.data).get("name") == OWN
        assert answers.pending_msgs == 0
    finally:
        await conn.nc.close()
