"""No shipped user but the operator and the provisioner creates a stream, KV bucket or object
store (review 3), and a service that finds one missing waits for `seedance admin provision` (as
the provisioner, which may create the catalogue's streams and nothing else:
test_provisioner.py), under the shipped users (deploy/auth) on a real nats-server.

nats-server checks a creator's read permissions no more than an updater's: with
``STREAM.CREATE`` of SEEDANCE_JOBS, a node agent that found it missing created it with a
``republish`` to an inbox it reads and received tenants' job specs. Each probe runs on the
shipped config (refused by name, nothing created) and the republish probe on the config shipped
before (``fixtures/nats-auth-stream-create.conf``), where it succeeds, so the probe is one that
catches the grant.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings
from seedance.core.barrier import flushed
from seedance.core.consumer import Delivery
from seedance.core.kv import ensure_bucket
from seedance.core.service import ServiceRuntime
from seedance.events import new_event_id
from seedance.events.codec import encode
from seedance.events.node_permissions import FLEET_REPLAYER
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS, consumer, jobs, slicing
from seedance.testing import identities
from seedance.testing.identities import as_user
from seedance.testing.servers import NatsServer, auth_server, provision, shipped_auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

JS = "$JS.API"
OLD_CONF = Path(__file__).parent / "fixtures" / "nats-auth-stream-create.conf"
SECRET = b"ACME SECRET JOB SPEC"
STOLEN = "_INBOX.stolen"
OPERATOR = identities.ADMIN
#: The replaying collector's durable (on the ledger's input's mirror).
PLACEMENTS = consumer("collector-placements")


@pytest.fixture
def bare_url() -> Iterator[str]:
    """The shipped users on a server nothing was provisioned on (a first start, or right after
    an operator deleted a stream)."""
    with shipped_auth_server(shipped_password, provisioned=False) as server:
        yield server.url


@pytest.fixture
def provisioned_url() -> Iterator[str]:
    """The shipped users on a provisioned server."""
    with shipped_auth_server(shipped_password) as server:
        yield server.url


@pytest.fixture
def old_bare_url() -> Iterator[str]:
    """The users shipped before this change (every service held STREAM.CREATE), unprovisioned."""
    with auth_server(OLD_CONF.read_text(), shipped_password, provisioned=False) as server:
        yield server.url


def _creates() -> list[tuple[str, dict[str, object]]]:
    """A creation of each kind: the job stream with a republish to an inbox, the router's
    mirror as a copy of the job stream, a KV bucket, an object store."""
    bucket, store = next(iter(BUCKETS)), next(iter(OBJECT_STORES))
    return [
        (
            "SEEDANCE_JOBS",
            {
                "name": "SEEDANCE_JOBS",
                "subjects": ["seedance.jobs.>"],
                "republish": {"src": "seedance.jobs.>", "dest": f"{STOLEN}.>"},
            },
        ),
        (
            "SEEDANCE_ROUTING_PLAN",
            {"name": "SEEDANCE_ROUTING_PLAN", "mirror": {"name": "SEEDANCE_JOBS"}},
        ),
        (f"KV_{bucket}", {"name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"]}),
        (f"OBJ_{store}", {"name": f"OBJ_{store}", "subjects": [f"$O.{store}.>"]}),
    ]  # fmt: skip


async def _refusals(user: ShippedUser) -> list[bool]:
    return list(
        await asyncio.gather(
            *(
                user.refused(f"{JS}.STREAM.CREATE.{name}", json.dumps(config).encode())
                for name, config in _creates()
            )
        )
    )


async def _admin(url: str) -> Bus:
    return await Bus.connect(
        BusSettings(url=url, user=OPERATOR, password=shipped_password(OPERATOR), name="admin")
    )


async def test_no_shipped_user_but_the_operator_creates_a_stream_bucket_or_store(
    bare_url: str,
) -> None:
    """Every shipped user (services, the replayers, the callout, tenants) is refused each
    creation by name, and nothing was created. The provisioner's creations are its job."""
    names = [u for u in identities.users() if u not in (OPERATOR, PROVISIONER)]
    users = [await connect_shipped(bare_url, u) for u in names]
    try:
        refused = await asyncio.gather(*(_refusals(u) for u in users))
    finally:
        for u in users:
            await u.nc.close()
    assert dict(zip(names, refused, strict=True)) == {n: [True] * len(_creates()) for n in names}
    admin = await _admin(bare_url)
    try:
        assert [i.config.name for i in await admin.js.streams_info()] == []
    finally:
        await admin.close()


async def _node_agent_reads_jobs(url: str) -> tuple[bool, list[bytes]]:
    """The node agent creates the missing SEEDANCE_JOBS with a republish to an inbox it
    reads; a tenant's job spec then published: whether the create was taken, what it read."""
    agent = await connect_shipped(url, "node-agent")
    admin = await _admin(url)
    try:
        sub = await agent.nc.subscribe(f"{STOLEN}.>")
        await flushed(agent.nc)
        name, config = _creates()[0]
        created = not await agent.refused(f"{JS}.STREAM.CREATE.{name}", json.dumps(config).encode())
        got: list[bytes] = []
        if created:
            await admin.js.publish(jobs.subject("acme", "submitted"), SECRET)
            got.append((await sub.next_msg(timeout=5)).data)
        return created, got
    finally:
        await agent.nc.close()
        await admin.close()


async def test_a_node_agent_cannot_create_the_job_stream_with_a_republish(bare_url: str) -> None:
    assert await _node_agent_reads_jobs(bare_url) == (False, [])


async def test_the_old_grants_let_a_node_agent_read_job_specs_so(old_bare_url: str) -> None:
    assert await _node_agent_reads_jobs(old_bare_url) == (True, [SECRET])


async def _status(runtime: ServiceRuntime, path: str) -> int:
    url = runtime.http_url(path)
    assert url is not None

    def get() -> int:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    return await asyncio.to_thread(get)


async def test_a_service_waits_for_provision_then_starts_and_loses_no_event(
    bare_url: str,
) -> None:
    """The telemetry collector under its shipped user on an unprovisioned server: not ready,
    saying which stream it waits for and what to run; provision runs, a placement is published
    before the collector bound its durable, and the collector starts and handles it."""
    got: list[Placement] = []

    async def on_placement(delivery: Delivery[Placement]) -> None:
        got.append(delivery.event)

    # a replay's collector: as the replaying collector's user, which reads the decisions
    runtime = ServiceRuntime("telemetry-collector", as_user(bare_url, FLEET_REPLAYER), http_port=0)
    runtime.consume("collector-placements", Placement, on_placement)
    with capture_logs() as logs:
        starting = asyncio.create_task(runtime.start())
        try:

            def waiting() -> bool:
                return any(e["event"] == "stream_not_provisioned" for e in logs)

            await eventually(waiting, 20.0, what="the collector saying it waits for provision")
            (line,) = [e for e in logs if e["event"] == "stream_not_provisioned"]
            assert line["stream"] == STREAMS[0].name == jobs.STREAM  # the catalogue's first
            assert "seedance admin provision" in line["fix"]
            assert line["user"] == FLEET_REPLAYER
            assert not runtime.ready()
            assert not starting.done()
            # not ready, but alive: a liveness probe must not restart it into a crash loop
            assert await _status(runtime, "/readyz") == 503
            assert await _status(runtime, "/healthz") == 200

            await asyncio.to_thread(provision, bare_url, PROVISIONER, shipped_password(PROVISIONER))
            placement = Placement(
                id=new_event_id(), at=datetime.now(UTC), job_id="early", tenant="acme",
                node="n1", gpu_model="T4", kind=PlacementKind.WHOLE,
                gpus=[GpuAssignment(index=0, milli=1000)],
            )  # fmt: skip
            slicer = await Bus.connect(
                BusSettings(url=bare_url, user="slicer", password=shipped_password("slicer"))
            )
            try:
                await slicer.js.publish(
                    slicing.subject("acme", "placement"),
                    encode(placement),
                    headers={"Nats-Msg-Id": placement.id},
                )
            finally:
                await slicer.close()
            await asyncio.wait_for(starting, 20.0)
            assert runtime.ready()
            running = asyncio.create_task(runtime.run())
            await eventually(lambda: bool(got), 20.0, what="the early placement handled")
            assert [p.id for p in got] == [placement.id]
            await runtime.stop()
            await asyncio.wait_for(running, 15.0)
        finally:
            starting.cancel()
            await runtime.close()
    assert any(e["event"] == "stream_provisioned" for e in logs)


async def test_without_authorization_a_service_still_creates_what_it_misses() -> None:
    """The create path stays where the server checks no user (a bare dev server)."""
    with NatsServer() as server:
        runtime = ServiceRuntime("telemetry-collector", BusSettings(url=server.url))
        with capture_logs() as logs:
            await asyncio.wait_for(runtime.start(), 20.0)
            try:
                names = {i.config.name for i in await runtime.bus.js.streams_info()}
            finally:
                await runtime.close()
    assert "SEEDANCE_JOBS" in names
    assert not any(e["event"] == "stream_not_provisioned" for e in logs)


async def test_a_service_waiting_for_a_bucket_is_not_ready(provisioned_url: str) -> None:
    """The router binds its weights bucket after its runtime started (as slicer and
    graph-compiler bind theirs): while provision has yet to create the bucket, /readyz is 503,
    and 200 once it has (review-grants F2: it was 200 throughout)."""
    admin = await _admin(provisioned_url)
    try:
        await admin.js.delete_stream("KV_seedance-router-weights")  # a rollout that adds it
    finally:
        await admin.close()
    runtime = ServiceRuntime("router", BusSettings(url=provisioned_url), http_port=0)
    with capture_logs() as logs:
        await asyncio.wait_for(runtime.start(), 20.0)
        binding = asyncio.create_task(ensure_bucket(runtime.bus, "seedance-router-weights"))
        try:

            def waiting() -> bool:
                return any(e["event"] == "stream_not_provisioned" for e in logs)

            await eventually(waiting, 20.0, what="the router saying it waits for its bucket")
            assert runtime.bus.awaiting == {"KV_seedance-router-weights"}
            assert not runtime.ready()
            assert await _status(runtime, "/readyz") == 503
            assert await _status(runtime, "/healthz") == 200

            await asyncio.to_thread(
                provision, provisioned_url, PROVISIONER, shipped_password(PROVISIONER)
            )
            await asyncio.wait_for(binding, 20.0)
            assert runtime.ready()
            assert await _status(runtime, "/readyz") == 200
        finally:
            binding.cancel()
            await runtime.close()


async def test_a_stream_deleted_under_a_running_service_is_named_and_ends_its_run(
    provisioned_url: str,
) -> None:
    """Not waited for (only a start waits): the consumer's run ends, with one line naming the
    stream and the durable, and the runtime is no longer ready, so that Kubernetes restarts it
    into the start-up wait (review-grants F5: a bare ServiceUnavailableError, still ready)."""

    async def on_placement(delivery: Delivery[Placement]) -> None:
        raise AssertionError("nothing is published")

    runtime = ServiceRuntime(
        "telemetry-collector", as_user(provisioned_url, FLEET_REPLAYER), http_port=0
    )
    runtime.consume("collector-placements", Placement, on_placement)
    with capture_logs() as logs:
        await asyncio.wait_for(runtime.start(), 20.0)
        running = asyncio.create_task(runtime.run())
        try:
            assert runtime.ready()
            admin = await _admin(provisioned_url)
            try:
                await admin.js.delete_stream(PLACEMENTS.stream)
            finally:
                await admin.close()
            with pytest.raises(ExceptionGroup):
                await asyncio.wait_for(running, 20.0)
            assert not runtime.ready()
            assert await _status(runtime, "/readyz") == 503
        finally:
            running.cancel()
            await runtime.close()
    (line,) = [e for e in logs if e["event"] == "consumer_lost"]
    assert (line["stream"], line["durable"]) == (PLACEMENTS.stream, PLACEMENTS.durable)
