"""A tenant's push consumer pointed at a subject a component core-subscribes to, on a real
nats-server running the shipped config (deploy/auth) with the auth callout.

A consumer's deliver subject travels in the create request's body: nats-server checks it
against no one's permissions, so a tenant may point a consumer on its own costs at any subject,
and the server delivers there while some subscription matches. Tenants are users of their own
account (``seedance.events.accounts``), but the create crosses a service import and the
consumer lives in Seedance's account, with the streams: its deliver subject is one of
Seedance's (only ``_DELIVER.>`` is exported back, where a tenant hears its own consumers'
deliveries under ``deliver_prefix``). These tests show that it does
(for a tenant listed in the config and one added at run time) and pin what each component's
core subscription makes of it:

- the node agent's ``seedance.slicing.node.<node>.mig_plan``: no longer a core subscription
  (the agent reads its plans from their stream), so the server binds the consumer to nothing,
  the node's user may not subscribe there, and a plan the shipped slicer user publishes reaches
  the node's own reader as a stored plan (`not_a_stored_plan`);
- the auth callout's ``$SYS.REQ.USER.AUTH``: reached only through its deliver group; the
  callout ignores a consumer's delivery unread (counted), and logins go on;
- the tenant mirror's ``$KV.seedance-tenants.>``: no registry record changes;
- the server's own ``$JS.API.>``: a delivery is no API request (the stream stays).

A stream that captures the deliver subject stores the delivery: the plan subject's own stream,
SEEDANCE_NODE_PLANS (bounded), stores the tenant's cost (under its own subject, ``Nats-Msg-Id``
kept) and each idle heartbeat (under the plan subject), and SEEDANCE_SLICING (unbounded in
bytes) none of it. The last test pins that, and that no reader of SEEDANCE_SLICING, nor the
ledger's input sourced from it, takes either copy.

The other core subscriptions are inboxes (`_INBOX.<nuid>`, the publisher's and pull readers':
not guessable) and the ledger's allocation API (a request/reply service on a subject only
operators may publish; a delivery there is a request whose body is the tenant's own cost).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nkeys
import pytest
import pytest_asyncio
from nats.aio.msg import Msg
from nats.js.api import DiscardPolicy

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry
from seedance.core.barrier import flushed
from seedance.core.reader import PullReader
from seedance.core.tenant_registry import TENANTS_BUCKET
from seedance.core.xkeys import CurveKeyPair
from seedance.events import new_event_id
from seedance.events.codec import DecodeError, decode
from seedance.events.cost import CostEntry
from seedance.events.node_permissions import node_plan_reader
from seedance.events.permissions import CALLOUT_SUBJECT, CALLOUT_USER, TENANT_READS
from seedance.events.slicing import (
    GpuAssignment,
    MigInstanceChange,
    MigLayoutPlan,
    Placement,
    PlacementKind,
)
from seedance.events.subjects import (
    CONSUMERS,
    STREAMS,
    consumer_create,
    costs,
    inbox_prefix,
    ledger,
    slicing,
    tenant_consumers,
)
from seedance.node_agent.core.plan_source import not_a_stored_plan
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually, last_stored
from tests.integration.conftest import shipped_password

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

STATIC, RUNTIME, VICTIM, NODE = "acme", "initech", "globex-rt", "gpu-a"
AT = datetime(2026, 11, 1, tzinfo=UTC)
CALLOUT_QUEUE = "seedance-auth-callout"  # AuthCallout's queue group


class Stack:
    def __init__(self, url: str, admin: Bus, callout: AuthCallout, pw: dict[str, str]) -> None:
        self.url, self.admin, self.callout, self.pw = url, admin, callout, pw


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    server: NatsServer, issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> AsyncIterator[Stack]:
    """Streams provisioned, a cost of each tenant's stored, a node and two run-time tenants
    registered, the callout running."""
    admin = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    own = await Bus.connect(
        BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
    )
    try:
        await admin.ensure_streams()
        for t in (STATIC, RUNTIME):
            await admin.publish(costs.subject(t, "entry"), CostEntry(
                id=new_event_id(at=AT), at=AT, tenant=t, job_id="j1", period_start=AT,
                period_end=AT + timedelta(minutes=5), cost_micro_usd=1_000,
                gpu_hours_micro=83_333,
            ))  # fmt: skip
        registry = await TenantRegistry.open(admin)
        pw = {
            STATIC: shipped_password(f"tenant-{STATIC}"),
            RUNTIME: await registry.add(RUNTIME),
            VICTIM: await registry.add(VICTIM),
            NODE: await registry.add_node(NODE),
        }
        async with AuthCallout(own, issuer, xkey=xkey, refusal_delay_s=0.0) as callout:
            yield Stack(server.url, admin, callout, pw)
    finally:
        await own.close()
        await admin.close()


@contextlib.asynccontextmanager
async def pointed_at(
    s: Stack,
    tenant: str,
    deliver: str,
    slot: int,
    group: str | None = None,
    stream: str = "SEEDANCE_COSTS",
) -> AsyncIterator[dict[str, Any]]:
    """The tenant's push consumer on its own costs (or its own reads of ``stream``), delivering
    onto ``deliver`` (granted: its own name and filter); the server's reply. Deleted on
    leaving."""
    nc = await nats.connect(
        s.url, user=f"tenant-{tenant}", password=s.pw[tenant], inbox_prefix=inbox_prefix(tenant)
    )
    name, own = tenant_consumers(tenant)[slot], dict(TENANT_READS)[stream](tenant)
    config = {
        "name": name,
        "filter_subject": own,
        "deliver_subject": deliver,
        "deliver_policy": "all",
        "ack_policy": "none",
        "idle_heartbeat": 500_000_000,  # status messages onto the subject too
        "inactive_threshold": 30_000_000_000,
    }
    if group is not None:
        config["deliver_group"] = group
    body = json.dumps({"stream_name": stream, "config": config}).encode()
    try:
        reply = json.loads((await nc.request(consumer_create(stream, name, own), body, 5)).data)
        yield reply
    finally:
        with contextlib.suppress(nats.errors.Error):
            await nc.request(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", b"", timeout=5)
        await nc.close()


@pytest.mark.parametrize("tenant", [STATIC, RUNTIME], ids=["static", "added-at-run-time"])
async def test_a_tenants_push_consumer_onto_the_plan_subject_is_bound_to_nothing(
    stack: Stack, tenant: str
) -> None:
    """The node agent reads its plans through its own reader, so nothing core-subscribes to the
    plan subject: the server binds the tenant's consumer to no one there (before, the agent's
    subscription took its cost and heartbeats). The node's user may not subscribe there any
    more, and the slicer's plan reaches the node's reader as a stored plan."""
    subject = slicing.mig_plan(NODE)
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        stack.url, user=f"node-{NODE}", password=stack.pw[NODE], error_cb=on_error
    )
    node = await Bus.connect(
        BusSettings(url=stack.url, user=f"node-{NODE}", password=stack.pw[NODE])
    )
    slicer = await Bus.connect(
        BusSettings(url=stack.url, user="slicer", password=shipped_password("slicer"))
    )
    spec = node_plan_reader(NODE)
    reader = PullReader(node.nc, spec.stream, spec.durable, batch=64)
    try:
        await nc.subscribe(subject)
        await flushed(nc)
        await eventually(
            lambda: any("permissions violation for subscription" in e.lower() for e in errors),
            what="the node's subscription to its plan subject refused",
        )
        await node.ensure_consumer(spec)
        await reader.start()
        async with pointed_at(stack, tenant, subject, slot=0) as reply:
            # The server takes it (the deliver subject is in no permission's reach) and binds
            # it to nothing: no subscription matches the plan subject.
            assert reply.get("config", {}).get("deliver_subject") == subject, reply
            assert not reply.get("push_bound"), reply
        plan = MigLayoutPlan(
            id=new_event_id(), at=AT, node=NODE, gpu_index=0,
            create=[MigInstanceChange(profile="3g.71gb", start_slot=0)],
        )  # fmt: skip
        await slicer.publish(subject, plan)
        ack = f"$JS.ACK.{spec.stream}.{spec.durable}."
        read: list[Msg] = []

        async def plan_read() -> bool:
            read.extend(await reader.next_batch(timeout_s=0.5))
            return any(decode_plan(m) == plan for m in read)

        await eventually(plan_read, what="the slicer's plan read by the node's reader")
        published = next(m for m in read if decode_plan(m) == plan)
        assert (
            not_a_stored_plan(published.subject, published.reply, published.data, subject, ack)
            is None
        )
    finally:
        await reader.close()
        await slicer.close()
        await node.close()
        await nc.close()


def decode_plan(m: Msg) -> MigLayoutPlan | None:
    try:
        return decode(m.data, MigLayoutPlan)
    except DecodeError:
        return None


def answers(callout: AuthCallout) -> float:
    return sum(
        s.value
        for metric in callout.metrics.answers_total.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    )


async def test_onto_the_callout_subject_a_delivery_is_ignored_unread(stack: Stack) -> None:
    """The callout's subscription is a queue group: a consumer without that deliver group has
    no interest there (the server delivers nothing); with it, the delivery reaches the callout."""
    async with pointed_at(stack, STATIC, CALLOUT_SUBJECT, slot=1) as reply:
        assert reply.get("config", {}).get("deliver_subject") == CALLOUT_SUBJECT, reply
        assert not reply.get("push_bound"), reply
    before = answers(stack.callout)
    async with pointed_at(stack, STATIC, CALLOUT_SUBJECT, slot=2, group=CALLOUT_QUEUE) as reply:
        assert reply.get("push_bound"), reply
        ignored = stack.callout.metrics.deliveries_total
        await eventually(lambda: ignored._value.get() >= 1, what="the delivery ignored")
    # The login after the delivery is the only request answered, and it is granted.
    nc = await nats.connect(stack.url, user=f"tenant-{VICTIM}", password=stack.pw[VICTIM])
    await nc.close()
    assert answers(stack.callout) == before + 1


@pytest.mark.parametrize(
    "deliver",
    [f"$KV.{TENANTS_BUCKET}.{VICTIM}", "$JS.API.STREAM.DELETE.SEEDANCE_JOBS"],
    ids=["tenant-registry", "jetstream-api"],
)
async def test_onto_the_registry_or_the_api_the_server_delivers_nothing(
    stack: Stack, deliver: str
) -> None:
    """The tenant mirror's wildcard subscription and the server's own API subscriptions are no
    interest a consumer delivers to: the server binds it to nothing, and no record changes."""
    kv = await stack.admin.js.key_value(TENANTS_BUCKET)
    was = await kv.get(VICTIM)
    slot = 3 if deliver.startswith("$KV") else 4
    async with pointed_at(stack, STATIC, deliver, slot=slot) as reply:
        assert reply.get("config", {}).get("deliver_subject") == deliver, reply
        assert not reply.get("push_bound"), reply
    now = await kv.get(VICTIM)
    assert (now.revision, now.value) == (was.revision, was.value)
    assert (await stack.admin.js.stream_info("SEEDANCE_JOBS")).config.name == "SEEDANCE_JOBS"
    nc = await nats.connect(stack.url, user=f"tenant-{VICTIM}", password=stack.pw[VICTIM])
    await nc.close()  # the victim still logs in


SLICING, PLANS = "SEEDANCE_SLICING", slicing.PLAN_STREAM


def readers_of(stream: str) -> list[tuple[str, str]]:
    """(reader, filter) for everything that reads ``stream``: the catalogue's consumers, the
    streams that source or mirror it, and tenants' own reads. No filter reads everything."""
    out = [
        (c.durable, f)
        for c in CONSUMERS.values()
        if c.stream == stream
        for f in c.filter_subjects or (">",)
    ]
    for spec in STREAMS:
        sources = (*spec.sources, *([spec.mirror] if spec.mirror else []))
        out += [(spec.name, src.filter_subject or ">") for src in sources if src.stream == stream]
    out += [(f"tenant {VICTIM}", f(VICTIM)) for s, f in TENANT_READS if s == stream]
    return out


async def stored(s: Stack, stream: str, subject: str) -> int:
    info = await s.admin.js.stream_info(stream, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_a_copy_lands_in_the_bounded_plan_stream_and_reaches_no_reader(
    stack: Stack,
) -> None:
    """A delivery onto the node agent's plan subject is stored by the stream that captures it:
    the MIG plans' own, bounded in bytes, per node and in age, not SEEDANCE_SLICING (kept 30
    days without a byte limit), whose message count stays as it was. The copy keeps its stored
    subject (the tenant's cost) and each idle heartbeat lands under the plan subject. Only the
    node agents read the plan stream, on their plan subjects, and refuse a heartbeat's copy;
    no reader of SEEDANCE_SLICING — catalogue consumer, sourcing stream, tenant — filters on
    either subject; a reader that would fails here. The interest here is an operator's: the
    node agent no longer core-subscribes (the test above)."""
    # A tenant no other test copies from, so that the copy is this test's.
    plan_subject, cost_subject = slicing.mig_plan(NODE), costs.subject(VICTIM, "entry")
    # An operator's core subscription on the plan subject (`nats sub 'seedance.>'`): interest,
    # so delivery (the node agent no longer gives it: it reads the stream).
    node = await Bus.connect(
        BusSettings(url=stack.url, user="admin", password=shipped_password("admin"))
    )
    slicer = await Bus.connect(
        BusSettings(url=stack.url, user="slicer", password=shipped_password("slicer"))
    )
    try:
        await node.subscribe(plan_subject, no_op)
        await stack.admin.publish(cost_subject, CostEntry(
            id=new_event_id(at=AT), at=AT, tenant=VICTIM, job_id="j1", period_start=AT,
            period_end=AT + timedelta(minutes=5), cost_micro_usd=1_000, gpu_hours_micro=83_333,
        ))  # fmt: skip
        original = await stack.admin.js.get_last_msg("SEEDANCE_COSTS", cost_subject)
        slicing_before = (await stack.admin.js.stream_info(SLICING)).state.messages
        beats = await stored(stack, PLANS, plan_subject)
        assert await stored(stack, PLANS, cost_subject) == 0
        async with pointed_at(stack, VICTIM, plan_subject, slot=0) as reply:
            assert reply.get("push_bound"), reply

            async def copied() -> bool:
                return (
                    await stored(stack, PLANS, cost_subject) == 1
                    and await stored(stack, PLANS, plan_subject) > beats
                )

            await eventually(copied, what=f"the cost and a heartbeat stored in {PLANS}")
        # A consumer of its own decisions may deliver there too now (no cycle: SEEDANCE_SLICING
        # no longer captures the plan subject); its copies land in the plan stream as well.
        async with pointed_at(stack, VICTIM, plan_subject, slot=1, stream=SLICING) as reply:
            assert reply.get("push_bound"), reply
        copy = await stack.admin.js.get_last_msg(PLANS, cost_subject)
        assert copy.data == original.data
        assert (copy.headers or {}).get("Nats-Msg-Id") == (original.headers or {})["Nats-Msg-Id"]
        # Nothing of it in SEEDANCE_SLICING: the stream a full disk would stop.
        assert (await stack.admin.js.stream_info(SLICING)).state.messages == slicing_before
        # The plan stream, as the server holds it, is bounded every way a copy could grow it.
        bounds = (await stack.admin.js.stream_info(PLANS)).config
        assert bounds.subjects == [slicing.MIG_PLANS]
        assert 0 < (bounds.max_bytes or -1) <= 64 * 1024**2, bounds
        assert 0 < (bounds.max_msgs_per_subject or -1) <= 64, bounds
        assert 0 < (bounds.max_age or 0) <= 3600, bounds
        assert bounds.discard == DiscardPolicy.OLD, bounds  # the slicer's publishes still land
        # Its one reader is each node agent's, on its own plan subject: the cost's copy is
        # under the tenant's subject, never read; a heartbeat's copy is read, and refused for
        # its empty body before anything decodes it.
        assert readers_of(PLANS) == [("node-agent-plans", slicing.MIG_PLANS)]
        spec = node_plan_reader(NODE)
        mine = f"$JS.ACK.{spec.stream}.{spec.durable}."
        beat = await stack.admin.js.get_last_msg(PLANS, plan_subject)
        delivered = mine + "1.1.1.1.0"
        why = not_a_stored_plan(plan_subject, delivered, beat.data or b"", plan_subject, mine)
        assert "empty" in (why or ""), why
        for reader, f in readers_of(SLICING):
            matched = (await stack.admin.js.stream_info(SLICING, subjects_filter=f)).state
            assert not {cost_subject, plan_subject} & set(matched.subjects or {}), (reader, f)
        # End to end: a placement published after the copies reaches the node agents' mirror
        # of the ledger's input (sources keep the origin's order), and no copy came before it.
        plan = Placement(
            id=new_event_id(), at=AT, job_id="j-after", tenant=VICTIM, node=NODE,
            kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
        )  # fmt: skip
        await slicer.publish(slicing.subject(VICTIM, "placement"), plan)
        mirror = ledger.NODE_STREAM

        async def through() -> bool:  # the mirror holds none of this tenant's until it arrives
            last = await last_stored(stack.admin.js, mirror, slicing.subject(VICTIM, "placement"))
            return last is not None and decode(last.data, Placement).id == plan.id

        await eventually(through, what="the placement in the node agents' mirror")
        for stream in (ledger.IN_STREAM, mirror):
            state = (await stack.admin.js.stream_info(stream, subjects_filter=">")).state
            assert not {cost_subject, plan_subject} & set(state.subjects or {}), stream
    finally:
        await slicer.close()
        await node.close()


async def no_op(msg: Msg) -> None:
    del msg
