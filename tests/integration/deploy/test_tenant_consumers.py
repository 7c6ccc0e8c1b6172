"""A tenant holds at most `TENANT_CONSUMERS` consumers on each stream it reads, on a real
nats-server running the shipped config (deploy/auth): the server refuses the rest.

Before, a tenant's permissions granted any consumer name (``CONSUMER.CREATE.<stream>.*.
<its filter>``): one tenant created 300 memory-stored durables on its own cost stream. Now its
consumers may take only its own names (``<tenant>_0`` .. ``<tenant>_7``), each granted by name,
for a tenant listed in the config and one added at run time (the callout's JWT) alike. The SDK
reads through those names, and says so when all are taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import nkeys
import pytest
import pytest_asyncio

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry
from seedance.core.barrier import flushed
from seedance.core.xkeys import CurveKeyPair
from seedance.events import new_event_id
from seedance.events.cost import CostEntry
from seedance.events.permissions import CALLOUT_USER, TENANT_READS
from seedance.events.subjects import (
    TENANT_CONSUMERS,
    consumer_create,
    costs,
    deliver_prefix,
    inbox_prefix,
    tenant_consumers,
)
from seedance.sdk import ConsumersInUse, SeedanceClient
from seedance.sdk.cli import invoke
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
]

STATIC, RUNTIME = "acme", "initech"
HOSTILE_CREATES = 300


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(
    server: NatsServer, issuer: nkeys.KeyPair, xkey: CurveKeyPair
) -> AsyncIterator[dict[str, str]]:
    """The streams provisioned, a cost of each tenant's in them, the callout running; the
    tenants' passwords."""
    admin = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    own = await Bus.connect(
        BusSettings(url=server.url, user=CALLOUT_USER, password=shipped_password(CALLOUT_USER))
    )
    try:
        await admin.ensure_streams()
        at = datetime(2026, 11, 1, tzinfo=UTC)
        for t in (STATIC, RUNTIME):
            await admin.publish(costs.subject(t, "entry"), CostEntry(
                id=new_event_id(at=at), at=at, tenant=t, job_id="j1", period_start=at,
                period_end=at + timedelta(minutes=5), cost_micro_usd=1_000,
                gpu_hours_micro=83_333,
            ))  # fmt: skip
        passwords = {
            STATIC: shipped_password(f"tenant-{STATIC}"),
            RUNTIME: await (await TenantRegistry.open(admin)).add(RUNTIME),
        }
        async with AuthCallout(own, issuer, xkey=xkey):
            yield passwords
    finally:
        await own.close()
        await admin.close()


@contextlib.asynccontextmanager
async def raw(url: str, tenant: str, password: str) -> AsyncIterator[tuple[Any, list[str]]]:
    errors: list[str] = []

    async def heard(e: Exception) -> None:
        errors.append(str(e))

    nc = await nats.connect(
        url,
        user=f"tenant-{tenant}",
        password=password,
        inbox_prefix=inbox_prefix(tenant),
        error_cb=heard,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


def create_body(stream: str, name: str, filter_subject: str, deliver: str) -> bytes:
    """What the hostile tenant sent: a durable, memory-stored, never removed when idle."""
    config = {
        "durable_name": name,
        "filter_subject": filter_subject,
        "deliver_subject": deliver,
        "ack_policy": "none",
        "mem_storage": True,
    }
    return json.dumps({"stream_name": stream, "config": config}).encode()


async def tenants_consumers(url: str, stream: str, tenant: str) -> list[str]:
    admin = await nats.connect(url, user="admin", password=shipped_password("admin"))
    try:
        infos = await admin.jetstream().consumers_info(stream)
    finally:
        await admin.close()
    own = dict(TENANT_READS)[stream](tenant)
    return sorted(i.name for i in infos if i.config.filter_subject == own)


@pytest.mark.parametrize("tenant", [STATIC, RUNTIME], ids=["static", "added-at-run-time"])
@pytest.mark.parametrize("stream", [s for s, _ in TENANT_READS])
async def test_a_tenant_gets_only_its_own_consumer_names_on_a_stream_it_reads(
    server: NatsServer, stack: dict[str, str], tenant: str, stream: str
) -> None:
    own = dict(TENANT_READS)[stream](tenant)
    async with raw(server.url, tenant, stack[tenant]) as (nc, errors):
        deliver = f"{deliver_prefix(tenant)}.hostile"  # where its consumers may deliver
        # 300 durables of names of its choosing, as the hostile tenant made
        for i in range(HOSTILE_CREATES):
            name = f"hoard-{uuid.uuid4().hex[:8]}-{i}"
            await nc.publish(
                consumer_create(stream, name, own), create_body(stream, name, own, deliver)
            )
        await flushed(nc)
        await eventually(lambda: len(errors) >= HOSTILE_CREATES, 30, what="300 refusals")
        assert all("permissions violation" in e for e in errors)
        assert await tenants_consumers(server.url, stream, tenant) == []
        # its own names: each one, and not a ninth
        granted = []
        for name in tenant_consumers(tenant):
            reply = await nc.request(
                consumer_create(stream, name, own),
                create_body(stream, name, own, deliver),
                timeout=5,
            )
            granted.append(json.loads(reply.data).get("name"))
        assert granted == list(tenant_consumers(tenant))
        ninth = f"{tenant}_{TENANT_CONSUMERS}"
        await nc.publish(
            consumer_create(stream, ninth, own), create_body(stream, ninth, own, deliver)
        )
        await flushed(nc)
        await eventually(lambda: len(errors) > HOSTILE_CREATES, 10, what="the ninth refused")
        # a body naming another durable than the subject's name is refused by the server
        mismatch = await nc.request(
            consumer_create(stream, f"{tenant}_0", own),
            create_body(stream, "hoard-by-body", own, deliver),
            timeout=5,
        )
        assert "does not match" in json.loads(mismatch.data)["error"]["description"]
        assert await tenants_consumers(server.url, stream, tenant) == sorted(granted)
        for name in granted:
            await nc.request(f"$JS.API.CONSUMER.DELETE.{stream}.{name}", b"", timeout=5)
    assert await tenants_consumers(server.url, stream, tenant) == []


async def test_the_sdk_reads_through_the_tenants_own_names_and_says_when_all_are_taken(
    server: NatsServer, stack: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    client = await SeedanceClient.connect(
        server.url, user=f"tenant-{RUNTIME}", password=stack[RUNTIME]
    )
    try:
        readers = [client.costs(RUNTIME) for _ in range(TENANT_CONSUMERS)]
        firsts = await asyncio.gather(*(anext(r) for r in readers))  # each read the entry
        assert len(firsts) == TENANT_CONSUMERS
        names = await tenants_consumers(server.url, "SEEDANCE_COSTS", RUNTIME)
        assert names == sorted(tenant_consumers(RUNTIME))
        with pytest.raises(ConsumersInUse, match=f"all {TENANT_CONSUMERS} of tenant"):
            await client.cost_history(RUNTIME)
        # The CLI says so in one line and exits 1 (it once ended in a traceback).
        argv = ["--nats-url", server.url, "--user", f"tenant-{RUNTIME}"]
        argv += ["--password", stack[RUNTIME], "jobs", "list", "--tenant", RUNTIME]
        assert await asyncio.to_thread(invoke, argv) == 1
        err = capsys.readouterr().err
        assert f"all {TENANT_CONSUMERS} of tenant {RUNTIME!r}'s consumers on" in err
        assert "Traceback" not in err
        await readers.pop().aclose()  # one reader done: its name is free again
        held = await client.cost_history(RUNTIME)
        assert len(held) == 1
        for r in readers:
            await r.aclose()
    finally:
        await client.close()
    assert await tenants_consumers(server.url, "SEEDANCE_COSTS", RUNTIME) == []
