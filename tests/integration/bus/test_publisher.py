"""The pipelined JetStream publisher against a real nats-server: acks, duplicates, refusals.

JetStream answers 10158 ("duplicate message id is in process") only while a clustered stream is
storing the same id for another publisher, which a test cannot time; a plain subscriber on the
same server speaks JetStream's side of that exchange (its JSON replies) for the re-send test.
"""

from __future__ import annotations

import asyncio
import itertools
import json

import nats.errors
import pytest

from seedance.core import Bus
from seedance.core.errors import NoStream
from seedance.core.publisher import Publisher, PublishRefused
from seedance.events import encode
from seedance.events.subjects import Header, jobs
from seedance.testing.waits import eventually
from tests.integration.bus.test_bus import submitted

IN_PROCESS = json.dumps(
    {"error": {"code": 409, "err_code": 10158, "description": "duplicate message id is in process"}}
).encode()


def message(subject: str, event_id: str, payload: bytes = b"{}") -> tuple[str, bytes, dict]:
    return subject, payload, {Header.MSG_ID.value: event_id}


async def test_acks_in_order_with_duplicates_flagged(bus: Bus, unique: str) -> None:
    tenant = f"t{unique}"
    events = [submitted(tenant, f"job-{i}") for i in range(3)]
    subject = jobs.subject(tenant, "submitted")
    first = await bus.publisher.publish([message(subject, e.id, encode(e)) for e in events])
    acks = await first.wait(timeout_s=5)
    assert [a.duplicate for a in acks] == [False, False, False]
    assert [a.seq for a in acks] == sorted(a.seq for a in acks)
    assert {a.stream for a in acks} == {jobs.STREAM}

    again = await bus.publisher.publish(
        [message(subject, events[1].id, encode(events[1])), message(subject, "new-" + unique)]
    )
    dup, new = await again.wait(timeout_s=5)
    assert dup.duplicate
    assert dup.seq == acks[1].seq
    assert not new.duplicate
    assert new.seq > acks[2].seq
    assert bus.publisher.unacked == 0


async def test_no_stream_for_the_subject_is_named(bus: Bus, unique: str) -> None:
    batch = await bus.publisher.publish([message(f"nowhere.{unique}", "x")])
    with pytest.raises(NoStream, match=f"nowhere.{unique}"):
        await batch.wait(timeout_s=5)


async def test_refusal_fails_the_batch_with_the_servers_words(bus: Bus, unique: str) -> None:
    subject = jobs.subject(f"t{unique}", "submitted")
    wrong = (subject, b"{}", {Header.MSG_ID.value: unique, "Nats-Expected-Stream": "OTHER"})
    batch = await bus.publisher.publish([message(subject, "ok-" + unique), wrong])
    with pytest.raises(PublishRefused, match="expected stream does not match") as info:
        await batch.wait(timeout_s=5)
    assert info.value.subject == subject
    assert info.value.err_code == 10060
    assert bus.publisher.unacked == 0  # the failed batch is not tracked any more


async def test_in_process_reply_is_resent_until_stored(bus: Bus, unique: str) -> None:
    subject = f"fake-js.{unique}"
    seen: list[tuple[bytes, str]] = []

    async def jetstream_side(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append((msg.data, msg.headers[Header.MSG_ID.value]))
        if len(seen) < 3:
            await msg.respond(IN_PROCESS)
        else:
            await msg.respond(b'{"stream": "FAKE", "seq": 7, "duplicate": true}')

    sub = await bus.nc.subscribe(subject, cb=jetstream_side)
    publisher = Publisher(bus.nc, retry_in_process_s=0.01)
    try:
        batch = await publisher.publish([message(subject, "id-1", b"payload")])
        [ack] = await batch.wait(timeout_s=5)
    finally:
        await publisher.close()
        await sub.unsubscribe()
    assert (ack.stream, ack.seq, ack.duplicate) == ("FAKE", 7, True)
    assert seen == [(b"payload", "id-1")] * 3  # the same message, re-sent twice


TOO_MANY = json.dumps(
    {"error": {"code": 429, "err_code": 10167, "description": "too many requests"}}
).encode()


async def test_a_full_ingest_queue_is_waited_out_not_fatal(bus: Bus, unique: str) -> None:
    """nats-server 2.11+ answers 429 (10167) while a stream's ingest queue is full; a ledger
    replica catching up once exited on it. The message is re-sent after a growing pause."""
    subject = f"fake-js.{unique}"
    seen: list[float] = []

    async def busy_stream(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append(asyncio.get_running_loop().time())
        if len(seen) < 4:
            await msg.respond(TOO_MANY)
        else:
            await msg.respond(b'{"stream": "FAKE", "seq": 9}')

    sub = await bus.nc.subscribe(subject, cb=busy_stream)
    publisher = Publisher(bus.nc, retry_too_many_s=0.02)
    try:
        batch = await publisher.publish([message(subject, "id-1")])
        [ack] = await batch.wait(timeout_s=5)
    finally:
        await publisher.close()
        await sub.unsubscribe()
    assert (ack.stream, ack.seq) == ("FAKE", 9)
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert len(gaps) == 3
    assert gaps[2] > gaps[0]  # the pause grows with each try


async def test_a_queue_that_stays_full_fails_the_batch_with_the_servers_words(
    bus: Bus, unique: str
) -> None:
    subject = f"fake-js.{unique}"

    async def always_busy(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(TOO_MANY)

    sub = await bus.nc.subscribe(subject, cb=always_busy)
    publisher = Publisher(bus.nc, retry_too_many_s=0.001, max_too_many_retries=3)
    try:
        batch = await publisher.publish([message(subject, "id-1")])
        with pytest.raises(PublishRefused, match=r"too many requests \(10167\)"):
            await batch.wait(timeout_s=5)
    finally:
        await publisher.close()
        await sub.unsubscribe()


async def test_in_process_retries_are_bounded(bus: Bus, unique: str) -> None:
    subject = f"fake-js.{unique}"

    async def always_in_process(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(IN_PROCESS)

    sub = await bus.nc.subscribe(subject, cb=always_in_process)
    publisher = Publisher(bus.nc, retry_in_process_s=0.001, max_in_process_retries=3)
    try:
        batch = await publisher.publish([message(subject, "id-1")])
        with pytest.raises(PublishRefused, match=r"in process \(10158\)"):
            await batch.wait(timeout_s=5)
    finally:
        await publisher.close()
        await sub.unsubscribe()


async def test_timeout_names_the_missing_acks_and_forgets_them(bus: Bus, unique: str) -> None:
    subject = f"silent.{unique}"
    sub = await bus.nc.subscribe(subject)  # a responder that never answers
    publisher = Publisher(bus.nc)
    try:
        batch = await publisher.publish([message(subject, "a"), message(subject, "b")])
        with pytest.raises(TimeoutError, match=f"2 of 2 publish acks.*'silent.{unique}'"):
            await batch.wait(timeout_s=0.3)
        assert publisher.unacked == 0  # late acks would find nothing to complete
    finally:
        await publisher.close()
        await sub.unsubscribe()


async def test_no_responders_is_retried_until_the_stream_exists(bus: Bus, unique: str) -> None:
    subject = f"late.{unique}"
    publisher = Publisher(bus.nc, retry_no_responders_s=0.1, max_no_responders_retries=50)
    try:
        batch = await publisher.publish([message(subject, "x-" + unique)])
        # Refused at least once before the stream exists (a sleep "long enough" could end
        # before the first answer came on a loaded machine, and the retry went untested).

        def refused_once() -> bool:
            return any(retries >= 1 for _, _, retries in publisher._pending.values())

        await eventually(refused_once, 10, what="a no-responders answer, retried")
        await bus.js.add_stream(name=f"LATE_{unique}", subjects=[subject])
        [ack] = await batch.wait(timeout_s=10)
        assert ack.stream == f"LATE_{unique}"
        assert not ack.duplicate
    finally:
        await publisher.close()
        await bus.js.delete_stream(f"LATE_{unique}")


async def test_an_unanswered_message_is_sent_again_while_awaited(bus: Bus, unique: str) -> None:
    subject = f"fake-js.{unique}"
    seen: list[str] = []

    async def answers_the_second_copy(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append(msg.headers[Header.MSG_ID.value])
        if len(seen) == 2:  # the first copy's reply "lost in a reconnect"
            await msg.respond(b'{"stream": "FAKE", "seq": 3}')

    sub = await bus.nc.subscribe(subject, cb=answers_the_second_copy)
    publisher = Publisher(bus.nc, resend_after_s=0.1)
    try:
        batch = await publisher.publish([message(subject, "id-9")])
        [ack] = await batch.wait(timeout_s=5)
    finally:
        await publisher.close()
        await sub.unsubscribe()
    assert ack.seq == 3
    assert seen == ["id-9", "id-9"]


async def test_a_batch_that_fails_to_go_out_is_not_left_tracked(bus: Bus, unique: str) -> None:
    subject = jobs.subject(f"t{unique}", "submitted")
    too_big = (subject, b"x" * (bus.nc.max_payload + 1), {Header.MSG_ID.value: "big"})
    publisher = Publisher(bus.nc)
    try:
        with pytest.raises(nats.errors.MaxPayloadError):
            await publisher.publish([message(subject, "ok-" + unique), too_big])
        assert publisher.unacked == 0
    finally:
        await publisher.close()
