"""The leader leases and the planner's reader under the shipped users (deploy/auth).

Review2 findings 7 and 8: the slicer user could write every key of ``seedance-leases`` (and
reconfigure the bucket), so it could take a router fleet's planner lease and stop that fleet's
planning; the router user could read every lease (STREAM.MSG.GET names the key in its body),
create consumers on the leases bucket, and create a consumer with any filter on
``SEEDANCE_ROUTING``. Then it could still inspect, read and delete any consumer of
``SEEDANCE_ROUTING`` (a consumer name is one subject token: no grant says "its own"); its
planners now read the router's own mirror of the reports, and it has no consumer verb on
``SEEDANCE_ROUTING``. Each probe is a raw request; the server refuses by name, on the
connection's error callback.
"""

from __future__ import annotations

import json
from typing import Any

from nats.js import api as js_api

from seedance.core import Bus, BusSettings, VirtualClock
from seedance.core.kv import Lease, ensure_bucket, provision
from seedance.events.provision_permissions import PROVISIONER
from seedance.events.subjects import fleet_plan_consumer, routing
from seedance.sdk import SeedanceClient
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import connect_shipped

JS = "$JS.API"
LEASES = "KV_seedance-leases"


async def test_a_slicer_holds_its_own_leases_and_never_a_router_fleets(
    auth_url: str, admin: Bus, unique: str
) -> None:
    bus = await Bus.connect(
        BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer"))
    )
    slicer = await connect_shipped(auth_url, "slicer")
    try:
        kv = await ensure_bucket(bus, "seedance-leases")
        for key in (f"slicer.p{unique}", f"slicer-autosize.p{unique}"):
            lease = Lease(kv, key, "slicer-0", VirtualClock(), 10.0)  # time stands still
            assert await lease.try_acquire()
            assert await lease.try_acquire()  # refreshed (a compare-and-set update)
            await lease.release()
        # The router fleet's planner lease: neither created nor written, nor the bucket
        # reconfigured (a shorter TTL or history would shorten every leader's hold).
        assert await slicer.refused(f"$KV.seedance-leases.router-plan.f{unique}", b"slicer-0")
        assert await slicer.refused(f"{JS}.STREAM.UPDATE.{LEASES}", b"{}")
    finally:
        await slicer.nc.close()
        await bus.close()


async def test_the_router_reads_and_writes_only_its_planner_lease(
    auth_url: str, admin: Bus, unique: str
) -> None:
    await (await ensure_bucket(admin, "seedance-leases")).put(f"slicer.p{unique}", b"slicer-0")
    bus = await Bus.connect(
        BusSettings(url=auth_url, user="router", password=shipped_password("router"))
    )
    router = await connect_shipped(auth_url, "router")
    try:
        kv = await ensure_bucket(bus, "seedance-leases")
        lease = Lease(kv, f"router-plan.f{unique}", "gw-a", VirtualClock(), 10.0)
        assert await lease.try_acquire()
        assert (await kv.get(f"router-plan.f{unique}")).value == b"gw-a"  # a direct get
        await lease.release()
        slicer_key = f"$KV.seedance-leases.slicer.p{unique}"
        assert await router.refused(f"{JS}.DIRECT.GET.{LEASES}.{slicer_key}")
        body = json.dumps({"last_by_subj": slicer_key}).encode()
        assert await router.refused(f"{JS}.STREAM.MSG.GET.{LEASES}", body)
        assert await router.refused(f"{JS}.CONSUMER.CREATE.{LEASES}.watch-{unique}", b"{}")
        assert await router.refused(slicer_key, b"gw-a")
    finally:
        await router.nc.close()
        await bus.close()


async def test_the_router_creates_consumers_on_its_mirror_only_on_the_observed_reports(
    auth_url: str, admin: Bus, unique: str
) -> None:
    router = await connect_shipped(auth_url, "router")
    stream = routing.PLAN_STREAM

    def create(name: str, filter_subject: str | None) -> tuple[str, bytes]:
        config: dict[str, Any] = {"name": name, "ack_policy": "none"}
        subject = f"{JS}.CONSUMER.CREATE.{stream}.{name}"
        if filter_subject is not None:
            config["filter_subject"] = filter_subject
            subject += f".{filter_subject}"
        return subject, json.dumps({"stream_name": stream, "config": config}).encode()

    try:
        subject, body = create(f"router-plan-f{unique}", routing.OBSERVED)
        reply = await router.nc.request(subject, body, timeout=5)
        assert "error" not in json.loads(reply.data), reply.data
        # Every routing event, or the whole stream: refused.
        for name, filter_subject in (
            (f"wide{unique}", "seedance.routing.>"),
            (f"all{unique}", None),
        ):
            assert await router.refused(*create(name, filter_subject))
        # The catalogue's durable name is never bound (each fleet's is router-plan-<fleet>).
        assert await router.refused(f"{JS}.CONSUMER.DURABLE.CREATE.{stream}.router-plan", b"{}")
    finally:
        await router.nc.close()


async def test_the_router_touches_no_consumer_of_the_routing_stream(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """Another's reader of SEEDANCE_ROUTING (an autoscaler's, on the replica recommendations) is
    neither inspected, read, re-configured nor deleted by the router user; its own reader on
    the mirror it inspects and deletes (what binding does)."""
    stream, other = routing.STREAM, f"autoscaler{unique}"
    await admin.js.add_consumer(
        stream,
        js_api.ConsumerConfig(
            durable_name=other,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            filter_subject=routing.REPLICAS,
        ),
    )
    await admin.js.delete_stream(routing.PLAN_STREAM)
    await provision(admin)  # the operator makes it again; the router's start-up only checks it
    bus = await Bus.connect(
        BusSettings(url=auth_url, user="router", password=shipped_password("router"))
    )
    router = await connect_shipped(auth_url, "router")
    try:
        await bus.ensure_streams()
        mirror = (await admin.js.stream_info(routing.PLAN_STREAM)).config.mirror
        assert mirror is not None
        assert (mirror.name, mirror.filter_subject) == (stream, routing.OBSERVED)
        own = fleet_plan_consumer(f"f{unique}", "gw-a")
        await bus.ensure_consumer(own)
        assert (await bus.js.consumer_info(own.stream, own.durable)).name == own.durable
        await bus.js.delete_consumer(own.stream, own.durable)

        body = json.dumps(
            {"stream_name": stream, "config": {"durable_name": other, "ack_policy": "none"}}
        ).encode()
        next_body = json.dumps({"batch": 1, "expires": 500_000_000}).encode()
        for subject, payload in (
            (f"{JS}.CONSUMER.INFO.{stream}.{other}", b""),
            (f"{JS}.CONSUMER.DELETE.{stream}.{other}", b""),
            (f"{JS}.CONSUMER.MSG.NEXT.{stream}.{other}", next_body),
            (f"{JS}.CONSUMER.CREATE.{stream}.{other}.{routing.OBSERVED}", body),
            (f"{JS}.CONSUMER.DURABLE.CREATE.{stream}.{other}", body),
        ):
            assert await router.refused(subject, payload), subject
        assert (await admin.js.consumer_info(stream, other)).config.filter_subject == (
            routing.REPLICAS
        )
    finally:
        await router.nc.close()
        await bus.close()


async def test_an_operator_s_provision_turns_on_direct_gets_of_an_old_leases_bucket(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """A ``seedance-leases`` made before the catalogue asked for direct gets (nats-py's bucket
    without ``direct``): the router's user binds it but may not reconfigure it; an operator's
    `seedance admin provision` turns direct gets on (and nats-py's rollups off), keeping the
    bucket's TTL and keys, and the router's user then reads its lease by direct get, the only
    read its grant allows."""
    await provision(admin)  # all else as the catalogue has it: the one change is the bucket's
    await admin.js.delete_key_value("seedance-leases")
    old = await admin.js.create_key_value(
        js_api.KeyValueConfig(bucket="seedance-leases", history=1, ttl=10.0)
    )
    await old.put(f"router-plan.f{unique}", b"gw-a")
    assert not (await admin.js.stream_info(LEASES)).config.allow_direct
    router = await connect_shipped(auth_url, "router")
    assert await router.refused(
        f"{JS}.STREAM.UPDATE.{LEASES}",
        json.dumps({"name": LEASES, "allow_direct": True}).encode(),
    )
    client = await SeedanceClient.connect(
        auth_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    )
    try:
        assert [str(c) for c in await client.provision()] == [
            "updated: stream KV_seedance-leases (description, allow_direct, allow_rollup_hdrs)"
        ]
        assert await client.provision() == []  # once
    finally:
        await client.close()
    config = (await admin.js.stream_info(LEASES)).config
    assert (config.allow_direct, config.max_age, config.max_msgs_per_subject) == (True, 10.0, 1)
    assert not config.allow_rollup_hdrs  # nats-py's rollups: a key's writer purged the bucket
    bus = await Bus.connect(
        BusSettings(url=auth_url, user="router", password=shipped_password("router"))
    )
    try:
        kv = await ensure_bucket(bus, "seedance-leases")
        assert (await kv.get(f"router-plan.f{unique}")).value == b"gw-a"  # a direct get
    finally:
        await router.nc.close()
        await bus.close()
