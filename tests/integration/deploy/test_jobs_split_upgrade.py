"""An existing deployment's SEEDANCE_JOBS (tenants' requests and observers' events in one stream,
the slicer's ``slicer-jobs`` part-way through it) provisions to the split layout losing no unread
event and applying none twice, against the pinned nats-server with the shipped users.

How the slicer's position stays meaningful: the slicer's durable state records, per durable,
the stream sequences it applied (``seedance.core.durable``: a delivery whose sequence it holds
is a redelivery, acked and skipped). The upgrade keeps the stream and the durable: provision
updates SEEDANCE_JOBS in place (its subjects given up, the two new streams sourced), so the
stored events keep their sequences and the durable its ack floor, and every sourced event is
appended after them, at a sequence no snapshot can already hold.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from seedance.core import Bus, BusSettings
from seedance.core.drift import Change
from seedance.core.kv import provision
from seedance.events import new_event_id
from seedance.events.jobs import JobFinished, JobStarted
from seedance.events.provision_permissions import PROVISIONER, PROVISIONER_INBOX
from seedance.events.stream_limits import JOB_EVENT_MAX_BYTES
from seedance.events.subjects import CONSUMERS, inbox_prefix, jobs, observed
from seedance.testing.identities import as_user
from seedance.testing.nats_proxy import LosingProxy
from seedance.testing.servers import shipped_auth_server
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password

_DAY_S = 86_400.0
#: SEEDANCE_JOBS as the catalogue shipped it before the split (both families, refuse when full).
OLD_JOBS = js_api.StreamConfig(
    name=jobs.IN_STREAM,
    subjects=[jobs.ALL, observed.ALL],
    description="job requests (tenants) and observed job events (trusted observers)",
    retention=js_api.RetentionPolicy.LIMITS,
    storage=js_api.StorageType.FILE,
    max_age=30 * _DAY_S,
    max_bytes=512 * 1024**2,
    max_msg_size=JOB_EVENT_MAX_BYTES,
    discard=js_api.DiscardPolicy.NEW,
    num_replicas=1,
)


@pytest_asyncio.fixture
async def old_deployment() -> AsyncIterator[tuple[str, Bus]]:
    """A shipped-auth server holding the old SEEDANCE_JOBS and the slicer's durable on it."""
    with shipped_auth_server(shipped_password, provisioned=False) as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
        )
        try:
            await admin.js.add_stream(OLD_JOBS)
            await admin.ensure_consumer(CONSUMERS["slicer-jobs"])
            yield server.url, admin
        finally:
            await admin.close()


async def _events(tenant: Bus, observer: Bus, tag: str) -> list[str]:
    """A request of acme's (its own subject) and an observer's report: their ids, in order."""
    started = JobStarted(id=new_event_id(), at=datetime.now(UTC), job_id=f"j-{tag}", tenant="acme")
    ended = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id=f"j-{tag}", tenant="acme")
    await tenant.publish(jobs.subject("acme", "started"), started)
    await observer.publish(observed.subject("acme", "finished"), ended)
    return [started.id, ended.id]


def _id(msg: Any) -> str:
    return str(msg.headers["Nats-Msg-Id"])


async def test_an_old_jobs_stream_provisions_to_the_split_losing_and_repeating_nothing(
    old_deployment: tuple[str, Bus],
) -> None:
    url, admin = old_deployment
    acme = await Bus.connect(as_user(url, "tenant-acme", inbox_prefix=inbox_prefix("acme")))
    replayer = await Bus.connect(as_user(url, "replayer"))
    slicer = await Bus.connect(as_user(url, "slicer"))
    try:
        read, unread = await _events(acme, replayer, "a"), await _events(acme, replayer, "b")
        reader = await slicer.js.pull_subscribe_bind("slicer-jobs", jobs.IN_STREAM)
        applied = await reader.fetch(2, timeout=5)  # the slicer is part-way: these are applied
        assert [_id(m) for m in applied] == read
        for m in applied:
            await m.ack_sync()
        old_last = (await admin.js.stream_info(jobs.IN_STREAM)).state.last_seq

        changes = [str(c) for c in await provision(admin)]
        updated = next(c for c in changes if c.startswith(f"updated: stream {jobs.IN_STREAM} "))
        for new in (jobs.STREAM, observed.STREAM):
            assert changes.index(updated) < changes.index(f"created: stream {new}"), changes
        assert await provision(admin) == []  # converged: the catalogue's layout, once
        info = await admin.js.stream_info(jobs.IN_STREAM)
        assert not info.config.subjects
        assert info.state.last_seq == old_last  # the stored events stay, at their sequences

        after = await _events(acme, replayer, "c")
        got: list[Any] = []

        async def all_read() -> bool:
            with contextlib.suppress(TimeoutError):  # nothing yet within the second
                got.extend(await reader.fetch(4 - len(got), timeout=1))
            return len(got) >= 4

        # the server copies from the sources it was told of before they existed
        await eventually(all_read, 60, what="the unread and the new events", interval_s=0)
        ids = [_id(m) for m in got]
        assert ids[:2] == unread  # the unread old ones first, as stored
        assert sorted(ids[2:]) == sorted(after)  # then the new ones, sourced
        seqs = [m.metadata.sequence.stream for m in got]
        assert seqs[:2] == [old_last - 1, old_last]
        assert min(seqs[2:]) > old_last  # after every sequence a snapshot could hold
        for m in got:
            await m.ack_sync()
        pending = await reader.consumer_info()
        assert (pending.num_pending, pending.num_ack_pending) == (0, 0)  # none twice
    finally:
        for bus in (acme, replayer, slicer):
            await bus.close()


async def test_a_create_refused_mid_upgrade_leaves_every_job_subject_a_stream() -> None:
    """Review H1: provision updated the old SEEDANCE_JOBS (its subjects given up), created
    SEEDANCE_JOB_REQUESTS, then the server refused SEEDANCE_OBSERVED's reservation (10047, past
    ``max_file_store``): no stream took ``seedance.observed.>`` and the observers' publishes got
    no stream. Now provision puts back the old config for what no new stream took, sourcing
    the requests' new stream, and raises the refusal."""
    # room for the updated SEEDANCE_JOBS and the requests' 512 MiB, not the observers' 256 MiB
    with shipped_auth_server(shipped_password, provisioned=False, max_file_store="2500M") as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
        )
        acme = await Bus.connect(
            as_user(server.url, "tenant-acme", inbox_prefix=inbox_prefix("acme"))
        )
        replayer = await Bus.connect(as_user(server.url, "replayer"))
        try:
            await admin.js.add_stream(OLD_JOBS)
            with pytest.raises(APIError) as refused:
                await provision(admin)
            assert refused.value.err_code == 10047, refused.value
            info = await admin.js.stream_info(jobs.IN_STREAM)
            assert info.config.subjects == [observed.ALL]
            assert [s.name for s in info.config.sources or ()] == [jobs.STREAM]

            ended = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id="j", tenant="acme")
            assert (await replayer.publish(observed.subject("acme", "finished"), ended)).stream == (
                jobs.IN_STREAM
            )
            started = JobStarted(id=new_event_id(), at=datetime.now(UTC), job_id="j", tenant="acme")
            assert (await acme.publish(jobs.subject("acme", "started"), started)).stream == (
                jobs.STREAM
            )
        finally:
            for bus in (acme, replayer, admin):
                await bus.close()


def _create_reply(stream: str) -> Callable[[bytes], bool]:
    """Picks the server's answer to the create of ``stream``."""

    def picked(payload: bytes) -> bool:
        with contextlib.suppress(ValueError):
            reply = json.loads(payload)
            return bool(
                isinstance(reply, dict)
                and reply.get("type") == "io.nats.jetstream.api.v1.stream_create_response"
                and (reply.get("config") or {}).get("name") == stream
            )
        return False

    return picked


async def test_a_create_made_but_never_answered_leaves_each_job_subject_one_stream() -> None:
    """The server makes SEEDANCE_JOB_REQUESTS but its answer is lost (a proxy drops it), so
    the provisioner's create times out after the old SEEDANCE_JOBS gave up its subjects.
    Provision reads the stream back: the requests stay in the new stream and the old one gets
    back the observers' events, sourcing the new one. Before, it was given both back, the server
    refused the overlap (err_code 10065), and ``seedance.observed.>`` had no stream."""
    with shipped_auth_server(shipped_password, provisioned=False) as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
        )
        try:
            await admin.js.add_stream(OLD_JOBS)
            async with LosingProxy(server.url, _create_reply(jobs.STREAM)) as proxy:
                with pytest.raises(NatsTimeoutError):
                    await _provision_as_provisioner(proxy.url)
            assert len(proxy.lost) == 1
            held = (await admin.js.stream_info(jobs.STREAM)).config
            assert held.subjects == [jobs.ALL]  # made, though never answered
            info = await admin.js.stream_info(jobs.IN_STREAM)
            assert info.config.subjects == [observed.ALL]
            assert [s.name for s in info.config.sources or ()] == [jobs.STREAM]

            acme = await Bus.connect(
                as_user(server.url, "tenant-acme", inbox_prefix=inbox_prefix("acme"))
            )
            replayer = await Bus.connect(as_user(server.url, "replayer"))
            try:
                ended = JobFinished(
                    id=new_event_id(), at=datetime.now(UTC), job_id="j", tenant="acme"
                )
                ack = await replayer.publish(observed.subject("acme", "finished"), ended)
                assert ack.stream == jobs.IN_STREAM
                started = JobStarted(
                    id=new_event_id(), at=datetime.now(UTC), job_id="j", tenant="acme"
                )
                assert (await acme.publish(jobs.subject("acme", "started"), started)).stream == (
                    jobs.STREAM
                )
            finally:
                for bus in (acme, replayer):
                    await bus.close()

            # run again, it converges from there: the made stream is not made twice
            changes = [str(c) for c in await provision(admin)]
            assert f"created: stream {observed.STREAM}" in changes
            assert not any(c.startswith(f"created: stream {jobs.STREAM}") for c in changes)
            assert await provision(admin) == []
        finally:
            await admin.close()


async def _provision_as_provisioner(url: str) -> list[Change]:
    """`seedance admin provision` as the shipped provisioner, connected at ``url``."""
    provisioner = await Bus.connect(as_user(url, PROVISIONER, inbox_prefix=PROVISIONER_INBOX))
    try:
        return await provision(provisioner)
    finally:
        await provisioner.close()


def _reads_after_create(stream: str, *, lose_create: bool) -> Callable[[str], bool]:
    """Picks the provisioner's requests for the info of ``stream`` once its create went up
    (the create too, and then only the first info, where ``lose_create``)."""
    create, info = (f"$JS.API.STREAM.{op}.{stream}" for op in ("CREATE", "INFO"))
    asked: list[str] = []

    def picked(subject: str) -> bool:
        if subject == create and not asked:
            asked.append(subject)
            return lose_create
        if subject == info and asked and not (lose_create and len(asked) > 1):
            asked.append(subject)
            return True
        return False

    return picked


def _holders(configs: list[js_api.StreamConfig]) -> dict[str, list[str]]:
    """Each job subject and the streams of ``configs`` that hold it."""
    return {
        subject: [c.name or "" for c in configs if subject in (c.subjects or ())]
        for subject in (jobs.ALL, observed.ALL)
    }


async def _job_streams(admin: Bus) -> list[js_api.StreamConfig]:
    found = []
    for name in (jobs.IN_STREAM, jobs.STREAM, observed.STREAM):
        with contextlib.suppress(NotFoundError):
            found.append((await admin.js.stream_info(name)).config)
    return found


async def test_a_refused_create_is_not_read_back_and_its_subjects_go_back() -> None:
    """Review HIGH-1: the server refuses SEEDANCE_OBSERVED (10047) and would not answer an info
    of it (a proxy drops those requests). A refusal is an answer: read back, the info's time-out
    had it taken as made, the old stream given no subject back and ``seedance.observed.>`` left
    with no stream; now it is not asked, and the old stream gets the observers' events back."""
    with shipped_auth_server(shipped_password, provisioned=False, max_file_store="2500M") as server:
        admin = await Bus.connect(
            BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
        )
        try:
            await admin.js.add_stream(OLD_JOBS)
            picked = _reads_after_create(observed.STREAM, lose_create=False)
            async with LosingProxy(server.url, lambda _: False, picked) as proxy:
                with pytest.raises(APIError) as refused:
                    await _provision_as_provisioner(proxy.url)
            assert refused.value.err_code == 10047, refused.value
            assert _holders(await _job_streams(admin)) == {
                jobs.ALL: [jobs.STREAM],
                observed.ALL: [jobs.IN_STREAM],
            }
            assert proxy.lost_requests == []  # never read back
        finally:
            await admin.close()


async def test_a_create_not_made_and_not_read_gives_every_subject_back(
    old_deployment: tuple[str, Bus],
) -> None:
    """Review HIGH-2: the create of SEEDANCE_JOB_REQUESTS never reaches the server, nor the
    info that reads it back (a proxy drops both requests). Taken as made, the old stream got
    back only the observers' events and tenants' requests found no stream; now it gets back
    every subject, and the next run converges with every stored event read once."""
    url, admin = old_deployment
    acme = await Bus.connect(as_user(url, "tenant-acme", inbox_prefix=inbox_prefix("acme")))
    replayer = await Bus.connect(as_user(url, "replayer"))
    slicer = await Bus.connect(as_user(url, "slicer"))
    try:
        sent = await _events(acme, replayer, "before")
        picked = _reads_after_create(jobs.STREAM, lose_create=True)
        async with LosingProxy(url, lambda _: False, picked) as proxy:
            with pytest.raises(NatsTimeoutError):
                await _provision_as_provisioner(proxy.url)
        assert proxy.lost_requests == [
            f"$JS.API.STREAM.{op}.{jobs.STREAM}" for op in ("CREATE", "INFO")
        ]
        assert _holders(await _job_streams(admin)) == {
            jobs.ALL: [jobs.IN_STREAM],
            observed.ALL: [jobs.IN_STREAM],
        }
        sent += await _events(acme, replayer, "between")  # each has a stream

        await _provision_as_provisioner(url)
        assert await _provision_as_provisioner(url) == []  # converged
        assert _holders(await _job_streams(admin)) == {
            jobs.ALL: [jobs.STREAM],
            observed.ALL: [observed.STREAM],
        }
        sent += await _events(acme, replayer, "after")
        reader = await slicer.js.pull_subscribe_bind("slicer-jobs", jobs.IN_STREAM)
        got: list[Any] = []

        async def all_read() -> bool:
            with contextlib.suppress(TimeoutError):  # nothing yet within the second
                got.extend(await reader.fetch(len(sent) - len(got), timeout=1))
            return len(got) >= len(sent)

        await eventually(all_read, 60, what="every stored event", interval_s=0)
        assert sorted(_id(m) for m in got) == sorted(sent)  # none lost, none twice
    finally:
        for bus in (acme, replayer, slicer):
            await bus.close()
