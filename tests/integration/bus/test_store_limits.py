"""One stream filling stops writes to that stream only; a tenant's oversized request is refused
by the server; an oversized undecodable one is dead-lettered, truncated, once (security audit
F2: a tenant's 1 MiB junk requests filled the whole store; F3: an 800 KB undecodable request's
dead letter exceeded max_payload and the request was lost).

Against the pinned nats-server running the shipped authorization, each writer as its shipped
user: tenants ``tenant-acme`` / ``tenant-globex``, ``slicer``, ``cost-ledger``,
``graph-compiler``. The store-filling test scales the catalogue down (every reservation / 1024)
on a server whose ``max_file_store`` is scaled the same way, so that it fills in megabytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import nats.js.errors
import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.core.errors import StreamRefused
from seedance.events import decode, encode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.jobs import JobSubmitted, ResourceRequest
from seedance.events.specs import StreamSpec
from seedance.events.stream_limits import COPY_HEADER_MAX_BYTES, JOB_EVENT_MAX_BYTES, LIMITS
from seedance.events.subjects import (
    STREAMS,
    costs,
    dlq,
    graph,
    inbox_prefix,
    jobs,
    observed,
    slicing,
)
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import SeedanceClient
from seedance.testing.identities import ADMIN, as_user, password
from seedance.testing.servers import shipped_auth_server
from seedance.testing.waits import eventually, last_stored, wait_consumer_settled, wait_copied
from tests.conftest import serving

#: The catalogue at 1/1024 of its size (GiB -> MiB), on a server with 1/1024 of the shipped
#: 32G store (nats-server's M is 10**6 bytes): 9.4 MiB reserved, the rest free.
_SCALE = 1024
_SMALL_STORE = "31M"
_JOBS_BYTES = LIMITS[jobs.STREAM].max_bytes


async def _as(url: str, user: str) -> Bus:
    if user.startswith("tenant-"):  # a tenant's replies come to its own inbox prefix only
        prefix = inbox_prefix(user.removeprefix("tenant-"))
        return await Bus.connect(as_user(url, user, inbox_prefix=prefix))
    return await Bus.connect(as_user(url, user))


@pytest.fixture
async def small_store() -> AsyncIterator[tuple[str, Bus]]:
    """A shipped-auth server with a small store, the scaled catalogue created by the operator."""
    server = shipped_auth_server(password, provisioned=False, max_file_store=_SMALL_STORE)
    try:
        admin = await _as(server.url, ADMIN)
        try:
            scaled = [replace(s, max_bytes=s.max_bytes // _SCALE) for s in STREAMS]
            await admin.ensure_streams(scaled)
            yield server.url, admin
        finally:
            await admin.close()
    finally:
        server.stop()


async def test_a_tenants_request_over_the_stream_message_bound_is_refused(auth_url: str):
    """The server refuses it (err_code 10054) before any reader sees it: no valid job event is
    over 21 KB (audit p4), and 1 MiB ones filled the store 1 MiB at a time (p1)."""
    acme = await _as(auth_url, "tenant-acme")
    try:
        over = b"x" * (JOB_EVENT_MAX_BYTES + 1)
        with pytest.raises(nats.js.errors.BadRequestError) as refused:
            await acme.js.publish(jobs.subject("acme", "submitted"), over)
        assert refused.value.err_code == StreamRefused.TOO_LARGE
        ack = await acme.js.publish(jobs.subject("acme", "submitted"), b"x" * 21_230)
        assert ack.stream == jobs.STREAM
    finally:
        await acme.close()


_TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def _widest_valid_submission() -> bytes:
    """job.submitted.v1 at every character bound of its schema, each character a control
    character (msgspec writes it as a 6-byte ``\\u00XX``, wider than any UTF-8 character): the
    largest job event decode() accepts (review R5: a 64 KiB bound refused such events)."""
    ch = "\x01"
    event = JobSubmitted(
        id=new_event_id(),
        at=datetime.now(UTC),
        job_id="j-1",
        tenant="acme",
        request=ResourceRequest(gpu_models=[f"{i:02d}" + ch * 62 for i in range(32)]),
        labels={f"{i:02d}" + ch * 61: ch * 256 for i in range(64)},
    )
    data = encode(event)
    decode(data)  # valid by the schema's own validation
    return data


async def test_the_widest_valid_job_event_is_stored(auth_url: str):
    """The schema bounds characters, the stream bytes: a valid event in the widest encoding
    (134,686 bytes) is taken by SEEDANCE_JOB_REQUESTS, with room for a trace context's headers."""
    data = _widest_valid_submission()
    assert len(data) > 128 * 1024
    acme = await _as(auth_url, "tenant-acme")
    try:
        ack = await acme.js.publish(
            jobs.subject("acme", "submitted"),
            data,
            headers={"Nats-Msg-Id": decode(data).id, "traceparent": _TRACEPARENT},
        )
        assert ack.stream == jobs.STREAM
    finally:
        await acme.close()


def test_the_test_servers_have_the_shipped_store() -> None:
    """Tests, the demo and the local stack (`shipped_auth_server`, `NatsServer`) run with the
    shipped 32G max_file_store, not nats-server's default of 75 % of the machine's free disk:
    provisioning the catalogue needs no free disk for its reservations (review R6)."""
    import json
    import urllib.request

    from seedance.testing.servers import NatsServer

    starts = (lambda: shipped_auth_server(password, provisioned=False, monitor=True),
              lambda: NatsServer(monitor=True))  # fmt: skip
    for start in starts:
        server = start()
        try:
            assert server.monitor_url is not None
            with urllib.request.urlopen(f"{server.monitor_url}/varz", timeout=10) as reply:
                varz = json.loads(reply.read())
            assert varz["jetstream"]["config"]["max_storage"] == 32 * 10**9
        finally:
            server.stop()


async def _fill(tenant: Bus, size: int) -> nats.js.errors.APIError | None:
    """Publish ``size``-byte junk as acme until refused (the refusal), at most 1000 times."""
    for _ in range(1000):
        try:
            await tenant.js.publish(jobs.subject("acme", "submitted"), b"j" * size)
        except nats.js.errors.APIError as exc:
            return exc
    return None


async def test_a_full_tenant_stream_stops_no_other_stream(small_store: tuple[str, Bus]):
    url, admin = small_store
    acme, slicer, ledger = (
        await _as(url, "tenant-acme"), await _as(url, "slicer"), await _as(url, "cost-ledger")
    )  # fmt: skip
    user = "tenant-globex"
    globex = await SeedanceClient.connect(url, user=user, password=password(user))
    try:
        # Under the message bound, so that only the stream's bytes stop it: large ones (9 fill
        # the scaled 512 KiB; the store's free 21 MB takes 350), then smaller into what is left.
        refusals = [await _fill(acme, size) for size in (60_000, 4096, 256)]
        # The slicer's placements and the ledger's entries are still taken.
        placed = await slicer.js.publish(slicing.subject("acme", "placement"), b"{}")
        assert placed.stream == "SEEDANCE_SLICING"
        entry = await ledger.js.publish(costs.subject("globex", "entry"), b"{}")
        assert entry.stream == "SEEDANCE_COSTS"
        assert all(r is not None and r.err_code == StreamRefused.FULL for r in refusals), refusals
        held = (await admin.js.stream_info(jobs.STREAM)).state.bytes
        assert held <= _JOBS_BYTES // _SCALE
        # What a tenant can still do: the stream's NEW requests wait for retention or a purge,
        # and the SDK says why.
        with pytest.raises(StreamRefused, match="stream full"):
            await globex.submit_job("globex", "j1", gpus=1)
    finally:
        for bus in (acme, slicer, ledger):
            await bus.close()
        await globex.close()


async def test_an_oversized_undecodable_request_is_dead_lettered_once(auth_url: str):
    """800,000 undecodable bytes on the tenant's own compile subject: the letter carries the
    first 64 KiB, the size and the SHA-256, and says it was truncated (its base64 whole was
    over max_payload: the publish failed at each delivery and the message was dropped)."""
    body = b"\xff" * 800_000
    acme = await _as(auth_url, "tenant-acme")
    admin = await _as(auth_url, ADMIN)
    runtime = ServiceRuntime("graph-compiler", as_user(auth_url, "graph-compiler"))
    compiler = GraphCompilerService(runtime, GraphCompilerSettings())
    subject = dlq.subject("graph-compiler")
    try:
        async with serving(compiler):
            await acme.js.publish(graph.subject("acme", "request"), body)

            async def lettered() -> bool:
                return await last_stored(admin.js, "SEEDANCE_DLQ", subject) is not None

            await eventually(lettered, 30.0, what="the dead letter in SEEDANCE_DLQ")
            await wait_consumer_settled(admin, "SEEDANCE_GRAPH", "compiler-requests")
        stored = await last_stored(admin.js, "SEEDANCE_DLQ", subject)
        letter = decode(stored.data, DeadLetter)
        assert letter.truncated
        assert letter.payload_bytes == len(body)
        assert letter.payload_sha256 == hashlib.sha256(body).hexdigest()
        assert letter.payload == body[: 64 * 1024]
        assert letter.num_delivered == 1
        info = await admin.js.stream_info("SEEDANCE_DLQ", subjects_filter=subject)
        assert info.state.subjects == {subject: 1}
    finally:
        await acme.close()
        await admin.close()


async def test_provision_gives_an_existing_stream_its_limits_and_names_a_refused_update():
    """An upgrade's provision updates the streams an older catalogue made unbounded, and a
    stream whose update the server refuses (a storage an operator changed by hand) is left,
    named with the server's reason, while the others are still converged."""
    from nats.js import api as js_api

    from seedance.core.drift import converge, stream_config
    from seedance.testing.servers import NatsServer

    wanted = {
        s.name: stream_config(s, 1) for s in STREAMS if s.name in (jobs.STREAM, "SEEDANCE_DLQ")
    }
    with NatsServer() as server:
        bus = await Bus.connect(BusSettings(url=server.url, name="test-provision"))
        try:
            old_jobs = replace(wanted[jobs.STREAM], max_bytes=-1, max_msg_size=-1,
                               discard=js_api.DiscardPolicy.OLD)  # fmt: skip
            hand_made = replace(wanted["SEEDANCE_DLQ"], max_bytes=-1,
                                storage=js_api.StorageType.MEMORY)  # fmt: skip
            await bus.js.add_stream(hand_made)
            await bus.js.add_stream(old_jobs)
            changes = await converge(bus.js, [wanted["SEEDANCE_DLQ"], wanted[jobs.STREAM]])
            assert [(c.stream, c.action) for c in changes] == [
                ("SEEDANCE_DLQ", "left"), (jobs.STREAM, "updated")
            ]  # fmt: skip
            assert "can not change storage type" in changes[0].fix
            jobs_now = (await bus.js.stream_info(jobs.STREAM)).config
            assert jobs_now.max_bytes == _JOBS_BYTES
            assert jobs_now.max_msg_size == JOB_EVENT_MAX_BYTES
            assert jobs_now.discard == js_api.DiscardPolicy.NEW
        finally:
            await bus.close()


async def test_provision_leaves_a_stream_already_over_its_new_bound():
    """An upgrade's bound below what a stream already holds is not applied: the refuse-when-full
    SEEDANCE_JOB_REQUESTS would refuse every write from then, the evict-oldest SEEDANCE_DLQ would
    drop its oldest letters silently (review R3, R4). Provision leaves both, naming each stream, its
    bytes, the new bound and the purge or raise to do; both still take writes, nothing lost."""
    from nats.js import api as js_api

    from seedance.core.drift import converge, stream_config
    from seedance.testing.servers import NatsServer

    bound = 64 * 1024
    wanted = [
        replace(stream_config(s, 1), max_bytes=bound)
        for s in STREAMS
        if s.name in (jobs.STREAM, "SEEDANCE_DLQ")
    ]
    with NatsServer() as server:
        bus = await Bus.connect(BusSettings(url=server.url, name="test-provision"))
        try:
            for config, subject in zip(wanted, (jobs.subject("acme", "submitted"),
                                                dlq.subject("slicer")), strict=True):  # fmt: skip
                old = replace(config, max_bytes=-1, max_msg_size=-1,
                              discard=js_api.DiscardPolicy.OLD)  # fmt: skip
                await bus.js.add_stream(old)
                for _ in range(4):
                    await bus.js.publish(subject, b"o" * 30_000)
            changes = await converge(bus.js, wanted)
            assert [(c.stream, c.action) for c in changes] == [
                (jobs.STREAM, "left"), ("SEEDANCE_DLQ", "left")
            ]  # fmt: skip
            for change in changes:
                assert f"its new max_bytes {bound}" in change.fix
                assert f"nats stream purge {change.stream}" in change.fix
                info = await bus.js.stream_info(change.stream)
                assert info.config.max_bytes == -1
                assert info.state.messages == 4
                assert f"it holds {info.state.bytes} bytes" in change.fix
            await bus.js.publish(jobs.subject("acme", "submitted"), b"{}")
        finally:
            await bus.close()


async def test_provision_leaves_a_stream_already_over_its_new_message_bound() -> None:
    """SEEDANCE_JOB_REQUESTS' message bound (review C1) is checked as its bytes are: a stream
    already holding more keeps its config (applied, discard new would refuse every request)."""
    from seedance.core.drift import converge, stream_config
    from seedance.testing.servers import NatsServer

    wanted = replace(stream_config(_spec(jobs.STREAM), 1), max_msgs=3)
    with NatsServer() as server:
        bus = await Bus.connect(BusSettings(url=server.url, name="test-provision"))
        try:
            await bus.js.add_stream(replace(wanted, max_msgs=-1))
            for _ in range(5):
                await bus.js.publish(jobs.subject("acme", "submitted"), b"{}")
            [change] = await converge(bus.js, [wanted])
            assert (change.action, change.fields) == ("left", ("max_msgs",))
            assert "it holds 5 messages, more than its new max_msgs 3" in change.fix
            # the documented purge (security.md, "What a tenant can still do"): the requests and
            # their copies in the slicer's merged stream, which purging the origin alone leaves
            for stream in (jobs.STREAM, jobs.IN_STREAM):
                assert f"`nats stream purge {stream} --subject <subject>`" in change.fix
            assert (await bus.js.stream_info(jobs.STREAM)).config.max_msgs == -1
        finally:
            await bus.close()


def _spec(name: str) -> StreamSpec:
    return next(s for s in STREAMS if s.name == name)


async def test_a_copys_header_stays_under_what_the_merged_stream_allows_for_it() -> None:
    """Review C1: every copy SEEDANCE_JOBS sources is larger than its original by the
    ``Nats-Stream-Source`` header (58 B of empty request stored as 175 B), so its bound counts
    `COPY_HEADER_MAX_BYTES` per message. Measured here on the pinned server for the widest
    subject of each origin (a 63-character tenant, the longest kind), at a 20-digit sequence
    (one byte a digit)."""
    server = shipped_auth_server(password, provisioned=False)
    admin = await _as(server.url, ADMIN)
    try:
        names = (jobs.STREAM, observed.STREAM, jobs.IN_STREAM)
        await admin.ensure_streams([s for s in STREAMS if s.name in names])
        widest = (
            (jobs.STREAM, jobs.subject("acme", "submitted")),
            (jobs.STREAM, jobs.subject("t" * 63, "cancelled")),
            (observed.STREAM, observed.subject("t" * 63, "move_refused")),
        )
        overheads = []
        for origin, subject in widest:
            before = (await admin.js.stream_info(origin)).state.bytes
            merged = (await admin.js.stream_info(jobs.IN_STREAM)).state.bytes
            ack = await admin.js.publish(subject, b"")
            await wait_copied(admin.js, jobs.IN_STREAM)
            stored = (await admin.js.stream_info(origin)).state.bytes - before
            copied = (await admin.js.stream_info(jobs.IN_STREAM)).state.bytes - merged
            overheads.append(copied - stored + 20 - len(str(ack.seq)))
        assert overheads[0] == 120 + 16  # the figure stream_limits quotes, at 4 digits
        assert max(overheads) <= COPY_HEADER_MAX_BYTES, overheads
    finally:
        await admin.close()
        server.stop()
