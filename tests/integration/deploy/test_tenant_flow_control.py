"""A tenant's flow control crosses from its account to Seedance's as a stream, on a real
nats-server running the shipped config with monitoring.

A tenant's push consumers live in ``SEEDANCE`` and ask for flow control on the tenant's deliver
subject; the tenant answers on ``$JS.FC.<stream>.…``. Exported as a *service*, each such
publish that carried a reply left the server a reply mapping that nothing would ever answer,
kept for minutes: a tenant flooding them grew the server ~33 MiB per 100,000 (review of
2026-12-07). ``TENANTS`` now exports its flow control to ``SEEDANCE`` as a stream
(`seedance.events.accounts.tenant_flow_control`), which keeps no mapping, and every service
export has a response threshold.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from nats.js import api as js_api

from seedance.core import Bus
from seedance.core.barrier import flushed
from seedance.events.subjects import api, costs, deliver_prefix, inbox_prefix, tenant_consumers
from seedance.testing.identities import as_user
from seedance.testing.servers import NatsServer, shipped_auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import connect_shipped

TENANT = "acme"
STREAM = "SEEDANCE_COSTS"
#: Requests sent with a reply in each flood: far more than the few mappings of the setup.
FLOOD = 200


@pytest.fixture(scope="module")
def server() -> Iterator[NatsServer]:
    with shipped_auth_server(shipped_password, monitor=True) as s:
        yield s


def pending_replies(server: NatsServer) -> int:
    """How many reply mappings Seedance's account holds for requests not answered yet."""
    url = f"{server.monitor_url}/accountz?acc=SEEDANCE"
    with urllib.request.urlopen(url, timeout=10) as reply:
        detail: dict[str, Any] = json.loads(reply.read())["account_detail"]
    return len(detail.get("responses") or {})


async def test_flow_control_a_tenant_floods_leaves_no_reply_mapping(server: NatsServer) -> None:
    admin = await Bus.connect(as_user(server.url, "admin"))
    acme = await connect_shipped(server.url, f"tenant-{TENANT}", inbox_prefix=inbox_prefix(TENANT))
    try:
        # the control: a service that hears and never answers keeps one mapping per request
        await admin.nc.subscribe(api.allocation(TENANT))
        await flushed(admin.nc)
        before = pending_replies(server)
        for _ in range(FLOOD):
            await acme.nc.publish(api.allocation(TENANT), b"{}", reply=f"{inbox_prefix(TENANT)}.x")
        await flushed(acme.nc)
        await eventually(lambda: pending_replies(server) >= before + FLOOD, 10.0)

        # flow control of the tenant's own consumer, which a consumer hears and never answers
        name = tenant_consumers(TENANT)[0]
        deliver = f"{deliver_prefix(TENANT)}.{uuid.uuid4().hex}"
        await acme.nc.subscribe(deliver)
        await acme.nc.jetstream(timeout=5.0).add_consumer(
            STREAM,
            js_api.ConsumerConfig(
                name=name,
                filter_subject=costs.tenant_wildcard(TENANT),
                deliver_subject=deliver,
                ack_policy=js_api.AckPolicy.NONE,
                flow_control=True,
                idle_heartbeat=5.0,
                inactive_threshold=30.0,
            ),
        )
        held = pending_replies(server)
        for i in range(FLOOD):
            # the consumer's own flow-control subject (``$JS.FC.<stream>.<name>.*``): one it
            # hears, so a service import would map each reply
            await acme.nc.publish(
                f"$JS.FC.{STREAM}.{name}.{i}", b"", reply=f"{inbox_prefix(TENANT)}.fc"
            )
        await flushed(acme.nc)
        # what the tenant sent after its flood has crossed, so the flood has too
        await acme.nc.request("$JS.API.INFO", b"", timeout=5)
        assert pending_replies(server) <= held
        assert not acme.errors, acme.errors
    finally:
        await acme.nc.close()
        await admin.close()


async def test_a_tenants_watch_past_the_flow_control_window_reads_everything(
    server: NatsServer,
) -> None:
    """Past half of its pending-bytes window (64 MiB / 16) a push consumer asks for flow
    control and stalls until it is answered: the tenant's answers reach the consumer."""
    admin = await Bus.connect(as_user(server.url, "admin"))
    acme = await connect_shipped(server.url, f"tenant-{TENANT}", inbox_prefix=inbox_prefix(TENANT))
    count, body = 600, b"x" * 16_000  # ~9.6 MB: past the 2 MiB where the server asks
    try:
        subject = costs.subject(TENANT, "entry")
        for _ in range(count):
            await admin.js.publish(subject, body)
        deliver = f"{deliver_prefix(TENANT)}.{uuid.uuid4().hex}"
        sub = await acme.nc.subscribe(deliver)
        await acme.nc.jetstream(timeout=5.0).add_consumer(
            STREAM,
            js_api.ConsumerConfig(
                name=tenant_consumers(TENANT)[1],
                filter_subject=subject,
                deliver_subject=deliver,
                ack_policy=js_api.AckPolicy.NONE,
                flow_control=True,
                idle_heartbeat=5.0,
                inactive_threshold=30.0,
            ),
        )
        data, asked = 0, 0
        while data < count:
            msg = await sub.next_msg(timeout=10)
            if msg.data:
                data += 1
            elif msg.reply:  # flow control: answered as the SDK's watch answers it
                asked += 1
                await acme.nc.publish(msg.reply, b"")
        assert asked >= 1
        assert not acme.errors, acme.errors
    finally:
        await acme.nc.close()
        await admin.close()
