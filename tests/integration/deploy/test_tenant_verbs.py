"""Every verb a tenant could try, on a real nats-server running the generated config: refused.

The server runs the rendered ``deploy/auth/nats-auth.conf`` (passwords in its environment, as
compose and Kubernetes set them) with auth callout on, and the auth-callout service in-process.
Two tenants are enumerated the same way: ``acme``, listed in the config, and ``initech``,
registered at run time in the tenant registry (no re-render, no restart). For each, every
catalogue durable (create, re-create with the tenant's own filter, durable-create, delete, info,
next, ack, pause), every stream, KV bucket and object store (create, update, delete, info,
purge, msg get/delete, direct get, snapshot, list, names, key and chunk writes), other tenants'
subjects, the trusted ``observed``/``slicing`` families and badly shaped subjects are tried, and
the server must answer each with a permission violation naming it (and never with a reply).
Positive controls show the same connection can do what a tenant should.

The trust-base config (``fixtures/nats-auth-trust-base.conf``) let a tenant re-create
``slicer-pauses`` with its own filter; ``test_trust_base_config_let_a_tenant_take_slicer_pauses``
runs the same probe on it and sees it succeed, so the probe is the one that catches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
import pytest_asyncio
from nats.js import api as js_api

from seedance.core import Bus, BusSettings
from seedance.core.auth_callout import AuthCallout, TenantRegistry, new_issuer
from seedance.core.barrier import flushed
from seedance.core.kv import ensure_bucket, ensure_object_store
from seedance.core.xkeys import new_curve_keys
from seedance.events import permissions
from seedance.events.accounts import SEEDANCE_ACCOUNT, TENANTS_ACCOUNT
from seedance.events.subjects import (
    BUCKETS,
    CONSUMERS,
    OBJECT_STORES,
    STREAMS,
    TENANT_KINDS,
    api,
    costs,
    deliver_prefix,
    graph,
    inbox_prefix,
    jobs,
    models,
    observed,
    slicing,
    tenant_consumers,
)
from seedance.testing.paths import REPO
from seedance.testing.servers import auth_server
from seedance.testing.waits import eventually
from tests.integration.deploy.refusals import ShippedUser, connect_as

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
]

STATIC, RUNTIME, OTHER = "acme", "initech", "globex"
#: Another rendered config to enumerate (say, the trust-base fixture, to see the probes fail).
CONF = Path(
    os.environ.get("SEEDANCE_TEST_AUTH_CONF") or REPO / "deploy" / "auth" / "nats-auth.conf"
)
OLD_CONF = Path(__file__).parent / "fixtures" / "nats-auth-trust-base.conf"
JS = "$JS.API"


def password(user: str) -> str:
    return f"test-{user}-secret"


def read(path: Path) -> str:
    return path.read_text()


class Running:
    def __init__(self, url: str, admin: Bus, callout: bool) -> None:
        self.url = url
        self.admin = admin
        self.callout = callout

    def need(self, tenant: str) -> None:
        if tenant == RUNTIME and not self.callout:
            pytest.skip(f"{CONF.name} has no auth callout: no tenants added at run time")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def running() -> AsyncIterator[Running]:
    text = read(CONF)
    callout = "auth_callout {" in text
    issuer, xkey = new_issuer(), new_curve_keys()
    with auth_server(text, password, issuer=issuer, xkey=xkey) as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=password("admin"))
        )
        try:
            await provision(admin)
            if not callout:
                yield Running(server.url, admin, callout)
                return
            callout_bus = await Bus.connect(
                BusSettings(
                    url=server.url,
                    user=permissions.CALLOUT_USER,
                    password=password(permissions.CALLOUT_USER),
                )
            )
            try:
                registry = await TenantRegistry.open(admin)
                await registry.add(RUNTIME, password(f"tenant-{RUNTIME}"))
                async with AuthCallout(callout_bus, issuer, xkey=xkey):
                    yield Running(server.url, admin, callout)
            finally:
                await callout_bus.close()
        finally:
            await admin.close()


async def provision(admin: Bus) -> None:
    """Every stream, durable, bucket and store of the catalogue, with something in each."""
    await admin.ensure_streams()
    await admin.ensure_consumers([d for d, c in CONSUMERS.items() if c.acked])
    for bucket in BUCKETS:
        kv = await ensure_bucket(admin, bucket)
        await kv.put("k", b"v")
    for store in OBJECT_STORES:
        await (await ensure_object_store(admin, store)).put("o", b"data")
    for tenant in (STATIC, RUNTIME, OTHER):
        await admin.js.publish(costs.subject(tenant, "entry"), b"{}")
        await admin.js.publish(costs.subject(tenant, "pause"), b"{}")
        await admin.js.publish(slicing.subject(tenant, "placement"), b"{}")
        await admin.js.publish(jobs.subject(tenant, "submitted"), b"{}")
        await admin.js.publish(graph.subject(tenant, "result"), b"{}")
        await admin.js.publish(models.chunk(tenant, "artifact", "r1", 0), b"x")
        await admin.js.publish(models.chunk(tenant, "upload", "r1", 0), b"x")


class Tenant:
    """A raw nats-py connection of one tenant that records the server's errors."""

    def __init__(self, probe: ShippedUser, tenant: str) -> None:
        self.probe = probe  # its requests raced against the server's named refusals
        self.nc = probe.nc
        self.tenant = tenant
        self.errors = probe.errors
        self.prefix = inbox_prefix(tenant)

    def refused(self, kind: str = "publish") -> set[str]:
        """The subjects the server has refused by name so far (lower-cased, as it reports)."""
        marker = f"permissions violation for {kind} to"
        return {e.split('"')[1].lower() for e in self.errors if marker in e.lower() and '"' in e}

    async def violations_for(
        self, subjects: list[tuple[str, bytes]], *, batch: int = 20
    ) -> tuple[set[str], list[str]]:
        """Request each (subject, body), a batch at a time, each raced against the server's
        refusal naming it (``ShippedUser.answer``); the subjects refused, and those that got
        any reply."""
        replied: list[str] = []
        for start in range(0, len(subjects), batch):
            chunk = subjects[start : start + batch]
            answers = await asyncio.gather(*(self.probe.answer(s, b) for s, b in chunk))
            replied += [s for (s, _), a in zip(chunk, answers, strict=True) if a is not None]
        return self.refused(), replied


@contextlib.asynccontextmanager
async def tenant_conn(url: str, tenant: str) -> AsyncIterator[Tenant]:
    user = f"tenant-{tenant}"
    probe = await connect_as(
        url,
        user,
        password(user),
        inbox_prefix=inbox_prefix(tenant),
        allow_reconnect=False,
        connect_timeout=5,
    )
    try:
        yield Tenant(probe, tenant)
    finally:
        await probe.nc.close()


def consumer_body(stream: str, name: str, filter_subject: str | None, deliver: str) -> bytes:
    config: dict[str, Any] = {
        "name": name,
        "durable_name": name,
        "ack_policy": "explicit",
        "deliver_policy": "all",
        "deliver_subject": deliver,
    }
    if filter_subject:
        config["filter_subject"] = filter_subject
    return json.dumps({"stream_name": stream, "config": config}).encode()


def tenant_filter(stream: str, tenant: str) -> str | None:
    for s, f in permissions.TENANT_READS:
        if s == stream:
            return f(tenant)
    return None


def own_name_probes(tenant: str, deliver: str) -> list[tuple[str, bytes]]:
    """Under its own consumer name: another tenant's artifacts or results, its own uploads
    (the compiler's to read), or every tenant's."""
    out = []
    mine = tenant_consumers(tenant)[0]
    for stream, f in (
        (models.STREAM, models.tenant_wildcard(OTHER, "artifact")),
        (models.STREAM, f"seedance.models.{OTHER}.artifact.r1.*"),
        (models.STREAM, models.tenant_wildcard(tenant, "upload")),
        (models.STREAM, "seedance.models.*.artifact.*.*"),
        (models.STREAM, f"seedance.models.{tenant}.>"),
        ("SEEDANCE_GRAPH", graph.subject(OTHER, "result")),
        ("SEEDANCE_GRAPH", graph.subject(tenant, "request")),
        ("SEEDANCE_GRAPH", "seedance.graph.*.result"),
    ):
        out.append(
            (f"{JS}.CONSUMER.CREATE.{stream}.{mine}.{f}", consumer_body(stream, mine, f, deliver))
        )
    return out


def probes(tenant: str) -> list[tuple[str, bytes]]:
    """Every JetStream API verb and data subject a tenant should not be able to use."""
    deliver = f"{inbox_prefix(tenant)}.steal"
    out: list[tuple[str, bytes]] = []
    # Every catalogue durable, every verb, including a re-create with the tenant's own filter.
    for c in CONSUMERS.values():
        own = tenant_filter(c.stream, tenant)
        names = [c.durable] if c.acked else [c.durable, f"{c.durable}-r1"]
        for d in names:
            body = consumer_body(c.stream, d, own, deliver)
            out += [
                (f"{JS}.CONSUMER.CREATE.{c.stream}.{d}", body),
                (f"{JS}.CONSUMER.DURABLE.CREATE.{c.stream}.{d}", body),
                (f"{JS}.CONSUMER.DELETE.{c.stream}.{d}", b""),
                (f"{JS}.CONSUMER.INFO.{c.stream}.{d}", b""),
                (f"{JS}.CONSUMER.MSG.NEXT.{c.stream}.{d}", b'{"batch":1}'),
                (f"{JS}.CONSUMER.PAUSE.{c.stream}.{d}", b"{}"),
                (f"{JS}.CONSUMER.LEADER.STEPDOWN.{c.stream}.{d}", b""),
                (f"$JS.ACK.{c.stream}.{d}.1.1.1.0.0", b"+ACK"),
            ]
            for f in {own, *c.filter_subjects} - {None}:
                out.append((f"{JS}.CONSUMER.CREATE.{c.stream}.{d}.{f}", body))
    # Every stream (catalogue, KV, object store): every stream verb.
    streams = [s.name for s in STREAMS]
    streams += [f"KV_{b}" for b in BUCKETS] + [f"OBJ_{o}" for o in OBJECT_STORES]
    for s in streams:
        out += [
            (f"{JS}.STREAM.{verb}.{s}", b"{}")
            for verb in ("CREATE", "UPDATE", "DELETE", "INFO", "PURGE", "SNAPSHOT", "RESTORE")
        ]
        out += [
            (f"{JS}.STREAM.MSG.GET.{s}", b'{"seq":1}'),
            (f"{JS}.STREAM.MSG.DELETE.{s}", b'{"seq":1}'),
            (f"{JS}.DIRECT.GET.{s}", b'{"seq":1}'),
            (f"{JS}.DIRECT.GET.{s}.seedance.costs.{OTHER}.entry", b""),
            (f"{JS}.STREAM.LEADER.STEPDOWN.{s}", b""),
            (f"{JS}.CONSUMER.LIST.{s}", b"{}"),
            (f"{JS}.CONSUMER.NAMES.{s}", b"{}"),
            # an unnamed (legacy ephemeral) consumer carries no filter in its subject
            (f"{JS}.CONSUMER.CREATE.{s}", consumer_body(s, "", None, deliver)),
            (f"{JS}.CONSUMER.CREATE.{s}.grab", consumer_body(s, "grab", None, deliver)),
        ]
    out += [(f"{JS}.{v}", b"{}") for v in ("STREAM.LIST", "STREAM.NAMES")]
    # purging an account's JetStream: Seedance's (which holds it) or the tenants' own
    out += [(f"{JS}.ACCOUNT.PURGE.{a}", b"{}") for a in (SEEDANCE_ACCOUNT, TENANTS_ACCOUNT)]
    out += [(f"{JS}.META.LEADER.STEPDOWN", b"{}"), (f"{JS}.SERVER.REMOVE", b"{}")]
    out += own_name_probes(tenant, deliver)
    # Consumers on what a tenant reads, but filtered on others' or on everything.
    for stream, own in permissions.TENANT_READS:
        family = stream.removeprefix("SEEDANCE_").lower()
        for f in (
            own(OTHER),
            f"seedance.{family}.>",
            f"seedance.{family}.*.*",
            f"seedance.{family}.{tenant}.*.x",
            f"seedance.{family}.*.pause",
        ):
            out.append(
                (
                    f"{JS}.CONSUMER.CREATE.{stream}.grab.{f}",
                    consumer_body(stream, "grab", f, deliver),
                )
            )
    # The job streams, even filtered on its own requests: the requests', the observers' (its
    # own jobs' reports) and the slicer's merged input.
    job_streams = (
        (jobs.IN_STREAM, jobs.tenant_wildcard(tenant)),
        (jobs.STREAM, jobs.tenant_wildcard(tenant)),
        (observed.STREAM, observed.subject(tenant, "finished")),
        (jobs.IN_STREAM, observed.subject(tenant, "finished")),
    )
    out += [
        (f"{JS}.CONSUMER.CREATE.{stream}.grab.{f}", consumer_body(stream, "grab", f, deliver))
        for stream, f in job_streams
    ]
    # KV and object-store reads and writes through their own subjects.
    for b in BUCKETS:
        out += [(f"$KV.{b}.k", b"x"), (f"$KV.{b}.{tenant}", b"x")]
    for o in OBJECT_STORES:
        out += [(f"$O.{o}.C.x", b"x"), (f"$O.{o}.M.x", b"x")]
    # Publishing: others' requests, trusted families, wrong shapes, everything else.
    for kind in sorted(TENANT_KINDS["jobs"]):
        out += [
            (jobs.subject(OTHER, kind), b"{}"),
            (f"seedance.observed.{tenant}.{kind}", b"{}"),
            (f"seedance.jobs.{tenant}.{kind}.x", b"{}"),  # five tokens
        ]
    out += [
        (f"seedance.jobs.{tenant}.bogus", b"{}"),
        (f"seedance.jobs.{tenant}", b"{}"),
        (slicing.subject(tenant, "placement"), b"{}"),
        (slicing.subject(tenant, "released"), b"{}"),
        (costs.subject(tenant, "pause"), b"{}"),
        (costs.subject(OTHER, "entry"), b"{}"),
        (f"seedance.telemetry.{tenant}.sample", b"{}"),
        # compiles: only its own request and upload subjects, of exactly their shape
        (graph.subject(OTHER, "request"), b"{}"),
        (graph.subject(tenant, "result"), b"{}"),
        (f"seedance.graph.{tenant}.request.x", b"{}"),
        (models.chunk(OTHER, "upload", "r1", 0), b"x"),
        (models.chunk(tenant, "artifact", "r1", 0), b"x"),
        (f"seedance.models.{tenant}.upload.r1", b"x"),
        (f"{models.chunk(tenant, 'upload', 'r1', 0)}.x", b"x"),
        (f"seedance.dlq.{tenant}", b"{}"),
        ("seedance.ledger.idle.n1", b"{}"),
        # allocation requests: another tenant's, the fleet's, a longer subject
        (api.allocation(OTHER), b"{}"),
        (api.allocation(None), b"{}"),
        (f"{api.allocation(tenant)}.x", b"{}"),
        (permissions.CALLOUT_SUBJECT, b"{}"),
        ("_INBOX.x", b"{}"),
        (f"{inbox_prefix(OTHER)}.x", b"{}"),
        # deliveries are the server's to publish, its own consumers' included
        (f"{deliver_prefix(OTHER)}.x", b"{}"),
        (f"{deliver_prefix(tenant)}.x", b"{}"),
    ]
    return out


def subscribe_probes(tenant: str) -> list[str]:
    return [
        f"{inbox_prefix(OTHER)}.>",
        "_INBOX.>",
        f"{deliver_prefix(OTHER)}.>",  # another tenant's consumers' deliveries
        "_DELIVER.>",
        "seedance.>",
        costs.tenant_wildcard(tenant),  # own costs only through a consumer, never raw
        api.ALLOCATIONS,  # nobody but the ledger hears (or answers) allocation requests
        api.allocation(tenant),
        costs.tenant_wildcard(OTHER),
        slicing.tenant_wildcard(OTHER),
        "$KV.>",
        "$O.>",
        "$JS.>",
        permissions.CALLOUT_SUBJECT,
        ">",
    ]


async def assert_all_refused(url: str, tenant: str) -> None:
    wanted = probes(tenant)
    async with tenant_conn(url, tenant) as t:
        refused, replied = await t.violations_for(wanted)
    missing = [s for s, _ in wanted if s.lower() not in refused]
    assert not replied, f"{tenant}: the server answered {replied}"
    assert not missing, f"{tenant}: not refused by permission: {missing}"
    assert len(wanted) > 300  # every catalogue durable, stream, bucket and store was tried
    async with tenant_conn(url, tenant) as t:
        for s in subscribe_probes(tenant):
            await t.nc.subscribe(s)
        await flushed(t.nc)

        def missing() -> list[str]:
            joined = "\n".join(t.errors).lower()
            probes = subscribe_probes(tenant)
            return [s for s in probes if f'subscription to "{s.lower()}"' not in joined]

        with contextlib.suppress(TimeoutError):  # the refusals come by callback
            await eventually(lambda: not missing(), 5.0)
        assert not missing(), f"{tenant}: subscriptions not refused: {missing()}"


async def assert_can_do_its_own(url: str, admin: Bus, tenant: str) -> None:
    """The positive control: the same user reads its costs and decisions, sends its requests."""
    async with tenant_conn(url, tenant) as t:
        js = t.nc.jetstream(timeout=5.0)
        ack = await js.publish(jobs.subject(tenant, "submitted"), b"{}")
        assert ack.stream == jobs.STREAM
        for stream, own in permissions.TENANT_READS:
            # its consumers live in Seedance's account: they deliver under its deliver prefix
            inbox = f"{deliver_prefix(tenant)}.{uuid.uuid4().hex}"
            sub = await t.nc.subscribe(inbox)
            name = tenant_consumers(tenant)[0]  # only its own names are granted
            info = await js.add_consumer(
                stream,
                js_api.ConsumerConfig(
                    name=name,
                    filter_subject=own(tenant),
                    deliver_subject=inbox,
                    ack_policy=js_api.AckPolicy.NONE,
                    inactive_threshold=10.0,
                ),
            )
            assert info.config.filter_subject == own(tenant)
            msg = await sub.next_msg(timeout=5)
            assert msg.subject.split(".")[2] == tenant
            assert (await js.consumer_info(stream, name)).name == name
            await js.delete_consumer(stream, name)
            await sub.unsubscribe()
        assert not t.errors, t.errors


@pytest.mark.parametrize("tenant", [STATIC, RUNTIME], ids=["static", "added-at-run-time"])
async def test_a_tenant_can_use_only_its_own_subjects(running: Running, tenant: str) -> None:
    running.need(tenant)
    await assert_can_do_its_own(running.url, running.admin, tenant)


@pytest.mark.parametrize("tenant", [STATIC, RUNTIME], ids=["static", "added-at-run-time"])
async def test_the_server_refuses_every_other_verb_a_tenant_tries(
    running: Running, tenant: str
) -> None:
    running.need(tenant)
    before = {
        d: (await running.admin.js.consumer_info(c.stream, d)).config
        for d, c in CONSUMERS.items()
        if c.acked
    }
    await assert_all_refused(running.url, tenant)
    for d, config in before.items():
        now = (await running.admin.js.consumer_info(CONSUMERS[d].stream, d)).config
        assert now.filter_subject == config.filter_subject, d
        assert now.filter_subjects == config.filter_subjects, d
        assert now.deliver_subject is None, d


async def test_slicer_pauses_cannot_be_recreated_by_a_tenant(running: Running) -> None:
    took = await take_slicer_pauses(running.url, STATIC)
    assert took is None
    info = await running.admin.js.consumer_info("SEEDANCE_COSTS", "slicer-pauses")
    assert info.config.filter_subject == costs.PAUSES


async def test_a_runtime_tenant_needs_its_registered_password(running: Running) -> None:
    running.need(RUNTIME)
    for user, pw in (
        (f"tenant-{RUNTIME}", "wrong-password"),
        ("tenant-unregistered", password("tenant-unregistered")),
        ("slicer-impostor", "whatever-it-is"),
        ("tenant-node", "reserved-tenant"),
    ):
        await assert_refused(running.url, user, pw)


async def test_a_removed_tenant_cannot_connect_again(running: Running) -> None:
    running.need(RUNTIME)
    registry = await TenantRegistry.open(running.admin)
    pw = await registry.add("umbrella")
    nc = await nats.connect(running.url, user="tenant-umbrella", password=pw, connect_timeout=3)
    await nc.close()
    await registry.remove("umbrella")
    await assert_refused(running.url, "tenant-umbrella", pw)


async def assert_refused(url: str, user: str, pw: str) -> None:
    nc = nats.NATS()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nc.connect(url, user=user, password=pw, allow_reconnect=False, connect_timeout=3)
    finally:
        # nats-py leaves a refused connection's socket open: closing the client closes it
        # here, not the garbage collector in whichever test runs next.
        await nc.close()


async def take_slicer_pauses(url: str, tenant: str) -> str | None:
    """Re-create the slicer's pause durable with the tenant's own filter, as the exploit did;
    the filter the consumer has afterwards if the server took it, else None."""
    async with tenant_conn(url, tenant) as t:
        own = costs.tenant_wildcard(tenant)
        body = consumer_body("SEEDANCE_COSTS", "slicer-pauses", own, f"{t.prefix}.steal")
        body = json.dumps(
            {
                "stream_name": "SEEDANCE_COSTS",
                "config": {
                    "name": "slicer-pauses",
                    "durable_name": "slicer-pauses",
                    "ack_policy": "explicit",
                    "deliver_policy": "all",
                    "filter_subject": own,
                },
            }
        ).encode()
        subject = f"{JS}.CONSUMER.CREATE.SEEDANCE_COSTS.slicer-pauses.{own}"
        reply = await t.probe.answer(subject, body)
        if reply is None:  # refused by name
            return None
        answer = json.loads(reply.data)
        assert "error" not in answer, answer
        return str(answer["config"]["filter_subject"])


async def test_trust_base_config_let_a_tenant_take_slicer_pauses() -> None:
    """The same probe on the config trust-base shipped: the server took the tenant's filter."""
    with auth_server(read(OLD_CONF), password) as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=password("admin"))
        )
        try:
            await admin.ensure_streams()
            await admin.ensure_consumers(["slicer-pauses"])
            took = await take_slicer_pauses(server.url, STATIC)
            assert took == costs.tenant_wildcard(STATIC)  # the slicer's pauses: switched off
        finally:
            await admin.close()
