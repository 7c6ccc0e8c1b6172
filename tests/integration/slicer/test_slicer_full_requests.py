"""A tenant filling its requests' stream never stops a trusted observer's report of a job's end
reaching the slicer (docs/security.md, "What a tenant can still do"), against the pinned
nats-server running the shipped authorization, each writer as its shipped user.

Before the split, requests and observed events shared SEEDANCE_JOBS (discard new): once
``tenant-acme`` filled it, the ``replayer``'s ``seedance.observed.acme.finished`` was refused
(err_code 10077, "maximum bytes exceeded"), the slicer never heard the job end and kept its GPU.
Now the observers write SEEDANCE_OBSERVED, which no tenant writes, and the slicer reads both
through SEEDANCE_JOBS, which sources both and takes every copy.

The catalogue is scaled down (every reservation / 1024) on a server whose ``max_file_store`` is
scaled the same way (as ``tests/integration/bus/test_store_limits.py``), so that it fills in
kilobytes; the message bound is the catalogue's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import nats.js.errors
import pytest

from seedance.core import Bus
from seedance.core.errors import StreamRefused
from seedance.core.kv import ensure_bucket
from seedance.events import new_event_id
from seedance.events.jobs import JobFinished, JobSubmitted, ResourceRequest
from seedance.events.slicing import JobReleased, Placement
from seedance.events.specs import StreamSpec
from seedance.events.subjects import BUCKETS, STREAMS, inbox_prefix, jobs, observed
from seedance.testing.identities import ADMIN, as_user, password
from seedance.testing.servers import shipped_auth_server
from tests.integration.slicer.test_slicer_claims import live_node, of
from tests.integration.slicer.test_slicer_service import Decisions, slicer

_SCALE = 1024
_SMALL_STORE = "31M"


def _scaled(spec: StreamSpec) -> StreamSpec:
    """``spec`` with its bytes and message bounds / 1024 (the copies' headers, per message,
    scale with the messages)."""
    msgs = spec.max_msgs // _SCALE if spec.max_msgs > 0 else spec.max_msgs
    return replace(spec, max_bytes=spec.max_bytes // _SCALE, max_msgs=msgs)


@pytest.fixture
async def small_store() -> AsyncIterator[str]:
    """A shipped-auth server with a small store, the scaled catalogue and the KV buckets created
    by the operator (the object stores, which the slicer does not use, would not fit)."""
    server = shipped_auth_server(password, provisioned=False, max_file_store=_SMALL_STORE)
    try:
        admin = await Bus.connect(as_user(server.url, ADMIN))
        try:
            await admin.ensure_streams([_scaled(s) for s in STREAMS])
            for name in BUCKETS:  # the slicer's state, leases, policy (no byte reservation)
                await ensure_bucket(admin, name)
        finally:
            await admin.close()
        yield server.url
    finally:
        server.stop()


async def _fill(acme: Bus) -> list[Any]:
    """acme's junk on its own request subject until refused, large then smaller into what is
    left (under the message bound: only the stream's bytes stop it): the refusals."""
    refusals: list[Any] = []
    for size in (60_000, 4096, 256):
        for _ in range(1000):
            try:
                await acme.js.publish(jobs.subject("acme", "submitted"), b"j" * size)
            except nats.js.errors.APIError as exc:
                refusals.append(exc)
                break
        else:
            refusals.append(None)
    return refusals


async def test_a_tenant_filling_its_stream_never_stops_the_observers_end_of_a_job(
    small_store: str, unique: str
) -> None:
    url = small_store
    admin = await Bus.connect(as_user(url, ADMIN))
    acme = await Bus.connect(as_user(url, "tenant-acme", inbox_prefix=inbox_prefix("acme")))
    replayer = await Bus.connect(as_user(url, "replayer"))
    d = await Decisions.open(admin, "acme", "globex")
    try:
        async with slicer(url, unique) as svc:
            await live_node(admin, svc, f"n0-{unique}", 1)
            ask = ResourceRequest(gpus=1)
            now = datetime.now(UTC)
            run = JobSubmitted(id=new_event_id(), at=now, job_id="run", tenant="acme", request=ask)
            await acme.publish(jobs.subject("acme", "submitted"), run)
            await d.wait(lambda: bool(of(d, Placement, "acme", "run")))

            refusals = await _fill(acme)
            assert all(r is not None and r.err_code == StreamRefused.FULL for r in refusals)

            # The observer's report of the job's end is taken, by its own stream...
            end = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id="run", tenant="acme")
            ack = await replayer.publish(observed.subject("acme", "finished"), end)
            assert ack.stream == observed.STREAM
            # ...reaches the slicer, which releases the GPU: an observed job takes it.
            await d.wait(lambda: bool(of(d, JobReleased, "acme", "run")), timeout_s=30)
            next_job = JobSubmitted(
                id=new_event_id(), at=datetime.now(UTC), job_id="next", tenant="globex",
                request=ask,
            )  # fmt: skip
            await replayer.publish(observed.subject("globex", "submitted"), next_job)
            await d.wait(lambda: bool(of(d, Placement, "globex", "next")), timeout_s=30)
            # What a tenant can still do: other tenants' new requests wait, refused.
            late = JobSubmitted(
                id=new_event_id(), at=datetime.now(UTC), job_id="late", tenant="globex",
                request=ask,
            )  # fmt: skip
            with pytest.raises(StreamRefused, match="stream full"):
                await admin.publish(jobs.subject("globex", "submitted"), late)
    finally:
        await d.close()
        for bus in (admin, acme, replayer):
            await bus.close()


async def _fill_empty(acme: Bus) -> tuple[int, nats.js.errors.APIError]:
    """acme's empty requests (no headers either: the smallest a stream stores) until refused:
    how many were taken, and the refusal."""
    accepted = 0
    while True:
        try:
            await acme.js.publish(jobs.subject("acme", "submitted"), b"")
        except nats.js.errors.APIError as exc:
            return accepted, exc
        accepted += 1


async def test_the_smallest_requests_never_evict_an_unread_observed_end(
    small_store: str, unique: str
) -> None:
    """Review C1: the slicer is down when the observer reports the job's end; acme then fills its
    stream with the smallest requests there are (empty, no headers: 58 B stored, 178 B as a copy
    in SEEDANCE_JOBS). Sized by bytes alone, their copies overran SEEDANCE_JOBS, which evicted
    the unread end (the GPU was never released); bounded in messages too, they fit."""
    url = small_store
    admin = await Bus.connect(as_user(url, ADMIN))
    acme = await Bus.connect(as_user(url, "tenant-acme", inbox_prefix=inbox_prefix("acme")))
    replayer = await Bus.connect(as_user(url, "replayer"))
    d = await Decisions.open(admin, "acme")
    try:
        async with slicer(url, unique) as svc:
            await live_node(admin, svc, f"n0-{unique}", 1)
            run = JobSubmitted(
                id=new_event_id(), at=datetime.now(UTC), job_id="run", tenant="acme",
                request=ResourceRequest(gpus=1),
            )  # fmt: skip
            await acme.publish(jobs.subject("acme", "submitted"), run)
            await d.wait(lambda: bool(of(d, Placement, "acme", "run")))
        end = JobFinished(id=new_event_id(), at=datetime.now(UTC), job_id="run", tenant="acme")
        await replayer.publish(observed.subject("acme", "finished"), end)
        accepted, refused = await _fill_empty(acme)
        assert refused.err_code == StreamRefused.FULL
        assert accepted > 0
        async with slicer(url, unique):
            await d.wait(lambda: bool(of(d, JobReleased, "acme", "run")))
    finally:
        await d.close()
        for bus in (admin, acme, replayer):
            await bus.close()
