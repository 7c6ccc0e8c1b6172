"""`seedance admin provision` logs in as the shipped ``provisioner``, not the operator ``admin``
(compose's one-shot ``provision``, the Kubernetes Job ``seedance-provision``), under the shipped
users (deploy/auth) on a real nats-server.

The provisioner converges the catalogue's streams, buckets and stores from an empty server and
from an older release's (a drifted stream, a bucket with rollups, a mirror of another filter:
deleted and re-created), and is refused everything else by name: publishing any event, reading
a stream (consumers, message gets), deleting a stream, bucket or store that is not a mirror,
making a stream the catalogue does not have, listening on the services' inbox or the bus.
On the config shipped before, there is no such user: provision needed the operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from nats.js import api as js_api

from seedance.core import Bus, BusSettings
from seedance.core.barrier import flushed
from seedance.events.provision_permissions import PROVISIONER, PROVISIONER_INBOX
from seedance.events.subjects import (
    BUCKETS,
    OBJECT_STORES,
    STREAMS,
    api,
    costs,
    dlq,
    jobs,
    routing,
    slicing,
    telemetry,
)
from seedance.sdk import SeedanceClient
from seedance.sdk.cli import invoke
from seedance.testing.paths import REPO
from seedance.testing.servers import shipped_auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password
from tests.integration.deploy.refusals import ShippedUser, connect_shipped

JS = "$JS.API"
TENANTS_BUCKET = "seedance-tenants"
JOBS = "SEEDANCE_JOB_REQUESTS"  # a stream with subjects of its own (the tenants')
STORE = next(iter(OBJECT_STORES))
EVERY_STREAM = (
    {s.name for s in STREAMS} | {f"KV_{b}" for b in BUCKETS} | {f"OBJ_{o}" for o in OBJECT_STORES}
)


@pytest.fixture
def bare_url() -> Iterator[str]:
    """The shipped users on a server nothing was provisioned on (a deployment's first start)."""
    with shipped_auth_server(shipped_password, provisioned=False) as server:
        yield server.url


@pytest_asyncio.fixture
async def operator(bare_url: str) -> AsyncIterator[Bus]:
    """The operator, to look at what provision did and to make an older release's streams."""
    bus = await Bus.connect(
        BusSettings(url=bare_url, user="admin", password=shipped_password("admin"))
    )
    try:
        yield bus
    finally:
        await bus.close()


async def _names(bus: Bus) -> set[str]:
    return {i.config.name or "" for i in await bus.js.streams_info()}


async def _make_an_older_release(operator: Bus) -> None:
    """Three kinds of what an upgrade meets: a stream with another limit, a bucket that
    nats-py made (rollups on), the router's mirror with another filter (only re-creatable)."""
    config = (await operator.js.stream_info("SEEDANCE_TELEMETRY")).config
    await operator.js.update_stream(
        dataclasses.replace(config, max_age=2 * (config.max_age or 1.0))
    )
    spec = BUCKETS["seedance-leases"]
    await operator.js.delete_stream(f"KV_{spec.name}")
    await operator.js.create_key_value(
        js_api.KeyValueConfig(
            bucket=spec.name, history=spec.history, ttl=spec.ttl_s or None,
            description=spec.description or None, replicas=1, direct=spec.direct or None,
        )
    )  # fmt: skip
    mirror = (await operator.js.stream_info(routing.PLAN_STREAM)).config
    await operator.js.delete_stream(routing.PLAN_STREAM)
    await operator.js.add_stream(
        dataclasses.replace(
            mirror, mirror=js_api.StreamSource(name=routing.STREAM, filter_subject=routing.ALL)
        )
    )


async def test_the_provisioner_provisions_an_empty_server_and_converges_an_older_one(
    bare_url: str, operator: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    """The deployment's command as compose and the Job run it creates everything; after the
    operator leaves an older release's streams, the provisioner (the SDK's connect: its own
    inbox follows from its name) converges each, a mirror by re-creating it; then nothing."""
    argv = ["--nats-url", bare_url, "--user", PROVISIONER]
    argv += ["--password", shipped_password(PROVISIONER), "admin", "provision"]
    assert await asyncio.to_thread(invoke, argv) == 0
    assert f"streams provisioned: {len(EVERY_STREAM)} changed" in capsys.readouterr().out
    assert await _names(operator) == EVERY_STREAM

    await _make_an_older_release(operator)
    async with await SeedanceClient.connect(
        bare_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        changes = {(c.stream, c.action) for c in await client.provision()}
        assert changes == {
            ("SEEDANCE_TELEMETRY", "updated"),
            ("KV_seedance-leases", "updated"),
            (routing.PLAN_STREAM, "recreated"),
        }
        assert await client.provision() == []
    mirror = (await operator.js.stream_info(routing.PLAN_STREAM)).config.mirror
    assert mirror is not None
    assert mirror.filter_subject == routing.OBSERVED
    assert not (await operator.js.stream_info("KV_seedance-leases")).config.allow_rollup_hdrs


async def test_a_stream_only_the_operator_can_delete_is_named_and_the_rest_converged(
    bare_url: str, operator: Bus, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream the catalogue does not make a mirror that carries one (made by hand, planted):
    only its deletion undoes it, and the provisioner may delete only the catalogue's mirrors.
    Provision names it and the operator, creates the missing bucket after it all the same and
    exits 1; once the operator has deleted it, provision converges the rest (exit 0)."""
    argv = ["--nats-url", bare_url, "--user", PROVISIONER]
    argv += ["--password", shipped_password(PROVISIONER), "admin", "provision"]
    assert await asyncio.to_thread(invoke, argv) == 0
    jobs_config = (await operator.js.stream_info(JOBS)).config
    await operator.js.delete_stream(JOBS)
    await operator.js.add_stream(
        dataclasses.replace(
            jobs_config, subjects=None, mirror=js_api.StreamSource(name="SEEDANCE_COSTS")
        )
    )
    await operator.js.delete_stream(f"KV_{TENANTS_BUCKET}")
    capsys.readouterr()

    assert await asyncio.to_thread(invoke, argv) == 1
    out, err = capsys.readouterr()
    assert f"created: stream KV_{TENANTS_BUCKET}" in out
    assert f"left: stream {JOBS} (subjects, mirror): carries a mirror" in err
    assert "the operator (`admin`) must delete it" in err
    assert f"provision left 1 stream(s) as they were ({JOBS})" in err
    assert (await operator.js.stream_info(JOBS)).config.mirror is not None

    await operator.js.delete_stream(JOBS)
    assert await asyncio.to_thread(invoke, argv) == 0
    assert f"created: stream {JOBS}" in capsys.readouterr().out
    assert (await operator.js.stream_info(JOBS)).config.mirror is None


def _forbidden_requests() -> list[tuple[str, bytes]]:
    """What provision never does: each a request the provisioner's grants must refuse
    (`ShippedUser.refused`: the server's violation names the subject, so a request no one
    serves does not pass for a refusal)."""
    consumer = json.dumps({"stream_name": "SEEDANCE_COSTS", "config": {"name": "p"}}).encode()
    last = json.dumps({"last_by_subj": costs.subject("acme", "entry")}).encode()
    other = json.dumps({"name": "COPY", "sources": [{"name": "SEEDANCE_JOBS"}]}).encode()
    kv = f"KV_{TENANTS_BUCKET}"
    return [
        # publish on any service's or tenant's subjects
        (jobs.subject("acme", "submitted"), b"{}"),
        (slicing.subject("acme", "placement"), b"{}"),
        (costs.subject("acme", "entry"), b"{}"),
        (telemetry.sample("node-a"), b"{}"),
        (dlq.subject("slicer"), b"{}"),
        (api.allocation("acme"), b"{}"),
        (f"$KV.{TENANTS_BUCKET}.acme", b"{}"),
        # read tenants' streams, a bucket's keys, an object
        (f"{JS}.CONSUMER.CREATE.SEEDANCE_COSTS.p", consumer),
        (f"{JS}.CONSUMER.DURABLE.CREATE.SEEDANCE_JOBS.p", b"{}"),
        (f"{JS}.CONSUMER.MSG.NEXT.SEEDANCE_LEDGER_IN.ledger-in", b"1"),
        (f"{JS}.STREAM.MSG.GET.SEEDANCE_COSTS", last),
        (f"{JS}.DIRECT.GET.SEEDANCE_SLICING", last),
        (f"{JS}.DIRECT.GET.{kv}.$KV.{TENANTS_BUCKET}.acme", b""),
        (f"{JS}.CONSUMER.CREATE.OBJ_{STORE}", b"{}"),
        # delete or empty a stream, a bucket, a store
        (f"{JS}.STREAM.DELETE.SEEDANCE_JOBS", b""),
        (f"{JS}.STREAM.DELETE.{kv}", b""),
        (f"{JS}.STREAM.DELETE.OBJ_{STORE}", b""),
        (f"{JS}.STREAM.PURGE.SEEDANCE_COSTS", b"{}"),
        (f"{JS}.STREAM.MSG.DELETE.SEEDANCE_COSTS", b'{"seq": 1}'),
        (f"{JS}.CONSUMER.DELETE.SEEDANCE_LEDGER_IN.ledger-in", b""),
        # make a stream the catalogue does not have (a copy of the job stream)
        (f"{JS}.STREAM.CREATE.COPY", other),
    ]


async def _subscription_refused(user: ShippedUser, subject: str) -> bool:
    await user.nc.subscribe(subject)
    await flushed(user.nc)

    def named() -> bool:
        return any(
            "subscription" in e.lower() and subject.lower() in e.lower() for e in user.errors
        )

    try:
        await eventually(named, 3.0)
    except TimeoutError:
        return False
    return True


async def test_the_provisioner_may_do_nothing_but_provision(bare_url: str, operator: Bus) -> None:
    """Every forbidden request refused by name and every listening refused, with the stores
    provisioned and a tenant's cost entry stored; afterwards everything is as it was."""
    async with await SeedanceClient.connect(
        bare_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        await client.provision()
    await operator.js.publish(costs.subject("acme", "entry"), b"acme's bill")
    before = await _names(operator)
    user = await connect_shipped(bare_url, PROVISIONER, inbox_prefix=PROVISIONER_INBOX)
    try:
        probes = _forbidden_requests()
        refused = await asyncio.gather(*(user.refused(s, b) for s, b in probes))
        assert [s for (s, _), r in zip(probes, refused, strict=True) if not r] == []
        listens = ("_INBOX.>", "seedance.>", f"$KV.{TENANTS_BUCKET}.>", "$JS.ACK.>")
        heard = [s for s in listens if not await _subscription_refused(user, s)]
        assert heard == []
    finally:
        await user.nc.close()
    assert await _names(operator) == before == EVERY_STREAM
    assert (await operator.js.stream_info("SEEDANCE_COSTS")).state.messages == 1
    assert (await operator.js.stream_info(JOBS)).state.messages == 0


async def test_the_provisioner_reads_and_empties_any_stream_as_the_docs_say(
    bare_url: str, operator: Bus
) -> None:
    """What no grant takes from the provisioner (nats-server checks no read permission of a
    stream's updater), with nothing but its shipped grants: a catalogue stream made to source
    the tenants' costs and republish them to its own inbox hands it a tenant's history, and a
    limit lowered then restored drops stored messages without a purge. So the docs must not
    promise less: security.md says it is the operator's equal for confidentiality and
    integrity (the review's probe_exfil.py and probe_limits.py)."""
    async with await SeedanceClient.connect(
        bare_url, user=PROVISIONER, password=shipped_password(PROVISIONER)
    ) as client:
        await client.provision()
    for bill in (b"acme's first bill", b"acme's second bill"):
        await operator.js.publish(costs.subject("acme", "entry"), bill)
    user = await connect_shipped(bare_url, PROVISIONER, inbox_prefix=PROVISIONER_INBOX)
    try:
        heard: list[bytes] = []

        async def on_message(msg: Any) -> None:
            heard.append(msg.data)

        await user.nc.subscribe(f"{PROVISIONER_INBOX}.spy.>", cb=on_message)
        js = user.nc.jetstream()
        dlq = (await js.stream_info("SEEDANCE_DLQ")).config
        await js.update_stream(
            dataclasses.replace(
                dlq,
                sources=[js_api.StreamSource(name="SEEDANCE_COSTS")],
                republish=js_api.RePublish(src=">", dest=f"{PROVISIONER_INBOX}.spy.>"),
            )
        )
        await eventually(lambda: b"acme's first bill" in heard, 10.0)

        bills = (await js.stream_info("SEEDANCE_COSTS")).config
        await js.update_stream(dataclasses.replace(bills, max_msgs=1))
        await js.update_stream(bills)
    finally:
        await user.nc.close()
    assert (await operator.js.stream_info("SEEDANCE_COSTS")).state.messages == 1
    section = _section(REPO / "docs" / "security.md", "**The provisioner")
    assert "the provisioner is equivalent to the operator" in " ".join(section.split())
    assert "not against a stolen password" in " ".join(section.split())


def _section(path: Path, opening: str) -> str:
    """The paragraphs of ``path`` from the one that opens with ``opening`` to the next bold
    heading that is not the provisioner's."""
    text = path.read_text()
    start = text.index(opening)
    end = text.index("**A key's writer owns that key", start)
    return text[start:end]
