"""No service user changes a stream's configuration (review 1, findings 1, 2 and 6), under the
shipped users (deploy/auth) on a real nats-server.

nats-server does not check an updater's read permissions for a stream's ``sources``/``mirror``:
with ``STREAM.UPDATE`` on SEEDANCE_ROUTING, the router user sourced SEEDANCE_JOBS into it with a
subject transform and read tenants' job specs through its mirror, and a node agent copied its
telemetry into the planner's reports. Each probe runs on the shipped config (refused by name,
nothing copied) and on the config shipped before (``fixtures/nats-auth-stream-update.conf``),
where it succeeds, so the probe is one that catches the grant.

A service finding a drifted stream logs ``stream_config_drift`` and starts; one carrying a
planted copy refuses to start naming it; `seedance admin provision` (as the shipped provisioner)
converges both.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.js import api as js_api
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings
from seedance.core.drift import stream_config
from seedance.core.errors import StartRefused
from seedance.core.kv import ensure_bucket, ensure_object_store, provision
from seedance.core.service import ServiceRuntime
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.subjects import BUCKETS, OBJECT_STORES, STREAMS, routing, slicing
from seedance.sdk import SeedanceClient
from seedance.testing.servers import auth_server
from seedance.testing.waits import eventually, last_stored
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

JS = "$JS.API"
OLD_CONF = Path(__file__).parent / "fixtures" / "nats-auth-stream-update.conf"
SECRET = b"ACME SECRET JOB SPEC"
FORGED = b"FORGED PLAN REPORT"


@pytest.fixture
def old_url() -> Iterator[str]:
    """A server on the users shipped before this change (every service held STREAM.UPDATE)."""
    with auth_server(OLD_CONF.read_text(), shipped_password) as server:
        yield server.url


@pytest.fixture
def fresh_url() -> Iterator[str]:
    """A server of its own on the shipped users: these tests change the catalogue's streams."""
    from seedance.testing.servers import shipped_auth_server

    with shipped_auth_server(shipped_password, provisioned=False) as server:
        yield server.url


async def _admin(url: str, *, provisioned: bool = True) -> Bus:
    """The operator's connection; ``provisioned``: after `provision` (what a deployment does
    before any service starts), else on whatever the server holds."""
    bus = await Bus.connect(
        BusSettings(url=url, user="admin", password=shipped_password("admin"), name="admin")
    )
    if provisioned:
        await provision(bus)
    return bus


@pytest_asyncio.fixture
async def admin(fresh_url: str) -> AsyncIterator[Bus]:
    bus = await _admin(fresh_url)
    try:
        yield bus
    finally:
        await bus.close()


@pytest_asyncio.fixture
async def bare_admin(fresh_url: str) -> AsyncIterator[Bus]:
    """The operator's connection to a server nothing was provisioned on."""
    bus = await _admin(fresh_url, provisioned=False)
    try:
        yield bus
    finally:
        await bus.close()


async def _plant(user: ShippedUser, source: dict[str, object]) -> bool:
    """``user`` adds ``source`` to SEEDANCE_ROUTING: True when the server took it."""
    info = json.loads(
        (await user.nc.request(f"{JS}.STREAM.INFO.{routing.STREAM}", b"", timeout=5)).data
    )
    config = info["config"]
    config["sources"] = [source]
    subject = f"{JS}.STREAM.UPDATE.{routing.STREAM}"
    return not await user.refused(subject, json.dumps(config).encode())


async def _read_mirror(router: ShippedUser, name: str, *, copied: bool) -> list[bytes]:
    """What a reader of the router's mirror with its one granted filter gets (0.5 s waits):
    when the secret was ``copied`` there, until it arrives (the source and the mirror copy
    asynchronously, in no bounded time on a loaded machine); otherwise one read."""
    body = {
        "stream_name": routing.PLAN_STREAM,
        "config": {"name": name, "ack_policy": "none", "filter_subject": routing.OBSERVED},
    }
    reply = await router.nc.request(
        f"{JS}.CONSUMER.CREATE.{routing.PLAN_STREAM}.{name}.{routing.OBSERVED}",
        json.dumps(body).encode(),
        timeout=5,
    )
    assert "error" not in json.loads(reply.data), reply.data
    got: list[bytes] = []
    inbox = router.nc.new_inbox()
    sub = await router.nc.subscribe(inbox)
    request = json.dumps({"batch": 10, "expires": 500_000_000}).encode()

    async def read_once() -> bool:
        await router.nc.publish(
            f"{JS}.CONSUMER.MSG.NEXT.{routing.PLAN_STREAM}.{name}", request, reply=inbox
        )
        with contextlib.suppress(TimeoutError):  # the request expired: all it had is read
            while True:
                m = await sub.next_msg(timeout=0.7)
                if m.data:
                    got.append(m.data)
        return SECRET in got

    try:
        if copied:
            what = "the tenant's job copied into the router's mirror"
            await eventually(read_once, 30, what=what, interval_s=0)
        else:
            await read_once()
    finally:
        await sub.unsubscribe()
    return got


async def _router_reads_jobs(url: str, unique: str) -> tuple[bool, list[bytes]]:
    admin = await _admin(url)
    router = await connect_shipped(url, "router")
    try:
        await admin.js.publish(f"seedance.jobs.acme.j{unique}.submitted", SECRET)
        # Directly: refused on both configs (no consumer verb on SEEDANCE_JOBS, no MSG.GET).
        assert await router.refused(f"{JS}.STREAM.MSG.GET.SEEDANCE_JOBS", b'{"seq":1}')
        planted = await _plant(
            router,
            {
                "name": "SEEDANCE_JOBS",
                "subject_transforms": [
                    {
                        "src": "seedance.jobs.*.*.*",
                        "dest": "seedance.routing.{{wildcard(1)}}.observed.{{wildcard(2)}}",
                    }
                ],
            },
        )
        if not planted:
            # Refused: the stream has no source, so nothing is copied after the read below.
            assert not (await admin.js.stream_info(routing.STREAM)).config.sources
        return planted, await _read_mirror(router, f"leak{unique}", copied=planted)
    finally:
        await router.nc.close()
        await admin.close()


async def test_the_router_cannot_copy_tenants_jobs_into_its_mirror(
    fresh_url: str, unique: str
) -> None:
    planted, read = await _router_reads_jobs(fresh_url, unique)
    assert not planted
    assert SECRET not in read


async def test_the_old_grants_let_the_router_read_tenants_jobs(old_url: str, unique: str) -> None:
    planted, read = await _router_reads_jobs(old_url, unique)
    assert planted
    assert SECRET in read


async def _agent_forges_a_report(url: str, unique: str) -> tuple[bool, bytes | None]:
    admin = await _admin(url)
    agent = await connect_shipped(url, "node-agent")
    try:
        planted = await _plant(
            agent,
            {
                "name": "SEEDANCE_TELEMETRY",
                "subject_transforms": [
                    {
                        "src": f"seedance.telemetry.evil{unique}.*",
                        "dest": "seedance.routing.m.observed.{{wildcard(1)}}",
                    }
                ],
            },
        )
        await agent.nc.request(f"seedance.telemetry.evil{unique}.default", FORGED, timeout=5)
        subject = "seedance.routing.m.observed.default"
        found: list[bytes | None] = [None]

        async def in_the_mirror() -> bool:
            last = await last_stored(admin.js, routing.PLAN_STREAM, subject)
            found[0] = None if last is None else last.data
            return found[0] is not None

        if planted:  # copied asynchronously (source, then mirror): in no bounded time
            await eventually(in_the_mirror, 30, what="the forged report in the planner's mirror")
        else:
            # Refused: the stream has no source, so nothing is copied after this read.
            assert not (await admin.js.stream_info(routing.STREAM)).config.sources
            await in_the_mirror()
        return planted, found[0]
    finally:
        await agent.nc.close()
        await admin.close()


async def test_a_node_agent_cannot_put_a_report_before_the_planner(
    fresh_url: str, unique: str
) -> None:
    planted, found = await _agent_forges_a_report(fresh_url, unique)
    assert not planted
    assert found is None


async def test_the_old_grants_let_a_node_agent_forge_a_report(old_url: str, unique: str) -> None:
    planted, found = await _agent_forges_a_report(old_url, unique)
    assert planted
    assert found == FORGED


async def test_no_service_user_updates_or_deletes_a_stream_bucket_or_store(
    fresh_url: str, admin: Bus
) -> None:
    """Each service user's grants, asked of the server: STREAM.UPDATE and STREAM.DELETE of a
    catalogue stream, a bucket and a store it uses are refused by name."""
    await ensure_bucket(admin, "seedance-leases")
    streams = (routing.STREAM, routing.PLAN_STREAM, "SEEDANCE_JOBS", "KV_seedance-leases",
               "OBJ_seedance-graph-models")  # fmt: skip
    users = ("router", "slicer", "cost-ledger", "graph-compiler", "node-agent")
    conns = [await connect_shipped(fresh_url, user) for user in users]
    try:
        probes = [
            (user, f"{JS}.STREAM.{verb}.{stream}", conn, json.dumps({"name": stream}).encode())
            for user, conn in zip(users, conns, strict=True)
            for stream in streams
            for verb in ("UPDATE", "DELETE")
        ]
        # asked together: each refusal takes the request's timeout to tell from an answer
        refused = await asyncio.gather(*(c.refused(s, b) for _, s, c, b in probes))
        assert [(u, s) for (u, s, _, _), r in zip(probes, refused, strict=True) if not r] == []
    finally:
        for conn in conns:
            await conn.nc.close()


def _router_runtime(url: str) -> ServiceRuntime:
    return ServiceRuntime(
        "router", BusSettings(url=url, user="router", password=shipped_password("router"))
    )


async def test_a_service_starts_on_drifted_streams_and_provision_converges_them(
    fresh_url: str, admin: Bus, unique: str
) -> None:
    """An older catalogue's mirror filter and limits: the router's start logs each drift and
    starts (before, the update it tried was refused for the mirror and it crash-looped); the
    operator's provision re-creates the mirror from its origin and updates the limits."""
    await admin.js.delete_stream(routing.PLAN_STREAM)
    await admin.js.add_stream(
        js_api.StreamConfig(
            name=routing.PLAN_STREAM,
            mirror=js_api.StreamSource(name=routing.STREAM, filter_subject="seedance.routing.>"),
        )
    )
    telemetry = (await admin.js.stream_info("SEEDANCE_TELEMETRY")).config
    telemetry.max_age = 7200.0
    await admin.js.update_stream(telemetry)
    report = f"seedance.routing.m{unique}.observed.default"
    await admin.js.publish(report, b"a report")

    runtime = _router_runtime(fresh_url)
    with capture_logs() as logs:
        async with runtime:
            assert runtime.ready()
    drifts = {e["stream"]: e for e in logs if e["event"] == "stream_config_drift"}
    assert set(drifts) == {routing.PLAN_STREAM, "SEEDANCE_TELEMETRY"}
    assert drifts[routing.PLAN_STREAM]["fields"] == [
        "mirror",
        "description",
        "max_age",
        "max_bytes",
        "duplicate_window",
    ]
    assert drifts["SEEDANCE_TELEMETRY"]["fields"] == ["max_age"]
    assert all(e["log_level"] == "warning" for e in drifts.values())
    assert "seedance admin provision" in drifts["SEEDANCE_TELEMETRY"]["fix"]

    async with await SeedanceClient.connect(
        fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        changes = [str(c) for c in await client.provision()]
        assert changes == [
            "updated: stream SEEDANCE_TELEMETRY (max_age)",
            f"recreated: stream {routing.PLAN_STREAM} "
            "(mirror, description, max_age, max_bytes, duplicate_window)",
        ]
        assert await client.provision() == []  # once
    mirror = (await admin.js.stream_info(routing.PLAN_STREAM)).config.mirror
    assert mirror is not None
    assert (mirror.name, mirror.filter_subject) == (routing.STREAM, routing.OBSERVED)

    async def rebuilt() -> bool:  # the re-created mirror is rebuilt from its origin
        last = await last_stored(admin.js, routing.PLAN_STREAM, report)
        return last is not None and last.data == b"a report"

    await eventually(rebuilt, 30, what="the re-created mirror holding the origin's report")
    with capture_logs() as logs:
        async with _router_runtime(fresh_url):
            pass
    assert not [e for e in logs if e["event"] == "stream_config_drift"]


async def test_a_planted_source_refuses_the_start_until_provision_removes_it(
    fresh_url: str, admin: Bus
) -> None:
    config = (await admin.js.stream_info(routing.STREAM)).config
    config.sources = [
        js_api.StreamSource(
            name="SEEDANCE_JOBS",
            subject_transforms=[
                js_api.SubjectTransform(
                    src="seedance.jobs.*.*.*",
                    dest="seedance.routing.{{wildcard(1)}}.observed.{{wildcard(2)}}",
                )
            ],
        )
    ]
    await admin.js.update_stream(config)  # an operator's (or an older release's grant)
    with capture_logs() as logs, pytest.raises(StartRefused, match=routing.STREAM):
        await _router_runtime(fresh_url).start()
    (line,) = [e for e in logs if e["event"] == "stream_config_drift"]
    assert (line["stream"], line["log_level"], line["fields"]) == (
        routing.STREAM, "error", ["sources"]
    )  # fmt: skip
    assert "source SEEDANCE_JOBS" in line["planted"][0]

    async with await SeedanceClient.connect(
        fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        assert [str(c) for c in await client.provision()] == [
            f"updated: stream {routing.STREAM} (sources)"
        ]
    assert not (await admin.js.stream_info(routing.STREAM)).config.sources
    async with _router_runtime(fresh_url) as runtime:
        assert runtime.ready()


async def test_a_republish_made_before_the_service_refuses_it_and_limits_are_drift(
    fresh_url: str, admin: Bus
) -> None:
    """Review-3 1c: the catalogue's stream created first with a republish (every report
    copied to an inbox of the creator's choice) and other limits and flags: the router
    refuses to start naming the republish; provision converges every field."""
    config = (await admin.js.stream_info(routing.STREAM)).config
    await admin.js.delete_stream(routing.STREAM)
    await admin.js.add_stream(
        dataclasses.replace(
            config,
            republish=js_api.RePublish(src=">", dest="_INBOX.leak.>"),
            max_msgs=1,
            discard=js_api.DiscardPolicy.NEW,
            allow_rollup_hdrs=True,
            max_msg_size=64,
        )
    )
    with capture_logs() as logs, pytest.raises(StartRefused, match="republish"):
        await _router_runtime(fresh_url).start()
    (line,) = [e for e in logs if e["event"] == "stream_config_drift"]
    assert line["fields"] == [
        "max_msgs",
        "discard",
        "max_msg_size",
        "allow_rollup_hdrs",
        "republish",
    ]
    async with await SeedanceClient.connect(
        fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        assert len(await client.provision()) == 1
        assert await client.provision() == []
    after = (await admin.js.stream_info(routing.STREAM)).config
    assert (after.republish, after.max_msgs, after.allow_rollup_hdrs) == (None, -1, False)
    with capture_logs() as logs:
        async with _router_runtime(fresh_url) as runtime:
            assert runtime.ready()
    assert not [e for e in logs if e["event"] == "stream_config_drift"]


async def test_a_bucket_with_a_planted_source_is_refused_and_converged(
    fresh_url: str, admin: Bus
) -> None:
    """A KV bucket's stream can carry sources too: a lease holder refuses to bind one that
    copies another stream in; provision removes the source and keeps the keys and the TTL."""
    kv = await ensure_bucket(admin, "seedance-leases")
    await kv.put("slicer.p1", b"slicer-0")
    config = (await admin.js.stream_info("KV_seedance-leases")).config
    config.sources = [js_api.StreamSource(name="SEEDANCE_JOBS")]
    await admin.js.update_stream(config)
    slicer = await Bus.connect(
        BusSettings(url=fresh_url, user="slicer", password=shipped_password("slicer"))
    )
    try:
        with pytest.raises(StartRefused, match="KV_seedance-leases"):
            await ensure_bucket(slicer, "seedance-leases")
        async with await SeedanceClient.connect(
            fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
        ) as client:
            assert [str(c) for c in await client.provision()] == [
                "updated: stream KV_seedance-leases (sources)"
            ]
        after = (await admin.js.stream_info("KV_seedance-leases")).config
        assert (after.sources, after.max_age, after.allow_direct) == (None, 10.0, True)
        kv = await ensure_bucket(slicer, "seedance-leases")
        assert (await kv.get("slicer.p1")).value == b"slicer-0"
    finally:
        await slicer.close()


async def test_what_services_create_is_what_provision_wants(
    fresh_url: str, bare_admin: Bus
) -> None:
    """Every bucket and store as `ensure_bucket`/`ensure_object_store` make them, bound again:
    no drift reported, and provision changes nothing (else every start would warn)."""
    admin = bare_admin
    await admin.ensure_streams()
    for name in BUCKETS:
        await ensure_bucket(admin, name)
    for name in OBJECT_STORES:
        await ensure_object_store(admin, name)
    with capture_logs() as logs:
        await admin.ensure_streams()
        for name in BUCKETS:
            await ensure_bucket(admin, name)
        for name in OBJECT_STORES:
            await ensure_object_store(admin, name)
    assert [(e["stream"], e["fields"]) for e in logs if e["event"] == "stream_config_drift"] == []
    async with await SeedanceClient.connect(
        fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        assert await client.provision() == []


async def test_provision_on_an_empty_server_leaves_services_nothing_to_create(
    fresh_url: str, bare_admin: Bus
) -> None:
    """Run before any service (compose's one-shot ``provision``), provision creates every
    catalogue stream, bucket and store, as each service's ensure path would (so none of them
    then reports drift), and a second run changes nothing: no service is ever the first creator
    of a stream (docs/security.md)."""
    async with await SeedanceClient.connect(
        fresh_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        changes = await client.provision()
        created = {c.stream for c in changes if c.action == "created"}
        assert len(changes) == len(created)  # created, nothing else
        assert created == (
            {s.name for s in STREAMS}
            | {f"KV_{b.name}" for b in BUCKETS.values()}
            | {f"OBJ_{o.name}" for o in OBJECT_STORES.values()}
        )
        bus = bare_admin
        names = sorted(i.config.name or "" for i in await bus.js.streams_info())
        assert names == sorted(created)
        with capture_logs() as logs:
            await bus.ensure_streams()
            for name in BUCKETS:
                await ensure_bucket(bus, name)
            for name in OBJECT_STORES:
                await ensure_object_store(bus, name)
            async with _router_runtime(fresh_url) as runtime:
                assert runtime.ready()
        assert [e for e in logs if e["event"] == "stream_config_drift"] == []
        after = sorted(i.config.name or "" for i in await bus.js.streams_info())
        assert after == names  # the services created nothing
        assert await client.provision() == []


async def test_provision_moves_mig_plans_off_an_old_slicing_stream(bare_admin: Bus) -> None:
    """A server holding the SEEDANCE_SLICING shipped before (``seedance.slicing.>``, the plans
    included): streams may not overlap, so provision narrows it before it creates the plans'
    own bounded stream; the stored decisions stay, and a plan then lands in the new stream."""
    spec = next(s for s in STREAMS if s.name == "SEEDANCE_SLICING")
    await bare_admin.js.add_stream(
        dataclasses.replace(stream_config(spec, 1), subjects=["seedance.slicing.>"])
    )
    decision, plan = slicing.subject("acme", "placement"), slicing.mig_plan("gpu-a")
    await bare_admin.js.publish(decision, b"a decision")
    assert (await bare_admin.js.publish(plan, b"an old plan")).stream == "SEEDANCE_SLICING"

    changes = [str(c) for c in await provision(bare_admin)]
    narrowed = "updated: stream SEEDANCE_SLICING (subjects)"
    created = f"created: stream {slicing.PLAN_STREAM}"
    assert narrowed in changes, changes
    assert created in changes, changes
    assert changes.index(narrowed) < changes.index(created)
    assert await provision(bare_admin) == []  # once
    got = await bare_admin.js.get_last_msg("SEEDANCE_SLICING", decision)
    assert got.data == b"a decision"
    assert (await bare_admin.js.publish(plan, b"a new plan")).stream == slicing.PLAN_STREAM
    assert (await bare_admin.js.stream_info("SEEDANCE_SLICING")).config.subjects == list(
        slicing.STORED
    )
