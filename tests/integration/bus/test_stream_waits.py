"""The test library's reads and waits on the bus against a real nats-server: ``read_stream``
returns what a stream holds on a subject, all of it, in order; ``wait_consumer_settled``
returns once a durable has handled a sequence and, when it does not in time, says what the
consumer was doing; ``wait_consumers_bound`` returns once each durable exists and otherwise
names those that do not; ``last_stored`` is None until a subject holds a message, then the last
one, so a wait on a stream that fills later waits instead of failing on its first poll;
``wait_sourced`` returns once a sourcing stream holds what its origins took, and otherwise
says how much it holds; a wait whose every read its deadline cut off still says what the
server holds."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from nats.js import api as js_api

from seedance.core import Bus
from seedance.events import decode, new_event_id
from seedance.events.jobs import JobSubmitted
from seedance.events.subjects import jobs, ledger, telemetry
from seedance.events.telemetry import GpuSample, GpuSampleBatch
from seedance.testing.waits import (
    last_stored,
    wait_consumer_settled,
    wait_consumers_bound,
    wait_copied,
    wait_sourced,
)
from seedance.testing.workloads import START, read_stream
from tests.integration.bus.test_bus import spec_for, submitted


async def test_read_stream_returns_every_message_on_its_subject_in_order(
    bus: Bus, unique: str
) -> None:
    mine, other = f"t{unique}", f"u{unique}"
    for i in range(30):
        await bus.publish(jobs.subject(mine, "submitted"), submitted(mine, f"j{i}"))
        await bus.publish(jobs.subject(other, "submitted"), submitted(other, f"j{i}"))
    msgs = await read_stream(bus, jobs.STREAM, 10, subject=jobs.tenant_wildcard(mine))
    events = [decode(m.data, JobSubmitted) for m in msgs]
    assert [(e.tenant, e.job_id) for e in events] == [(mine, f"j{i}") for i in range(30)]
    nobody = jobs.tenant_wildcard(f"x{unique}")
    assert await read_stream(bus, jobs.STREAM, 10, subject=nobody) == []


async def test_a_consumer_that_does_not_settle_is_described(bus: Bus, unique: str) -> None:
    tenant = f"t{unique}"
    spec = spec_for(tenant, unique)
    await bus.ensure_consumer(spec)
    ack = None
    for i in range(2):
        ack = await bus.publish(jobs.subject(tenant, "submitted"), submitted(tenant, f"j{i}"))
    assert ack is not None
    # Nobody fetches: both stay pending, and the timeout says so.
    with pytest.raises(TimeoutError, match=r"test-\w+ has not handled up to seq \d+ .*pending 2"):
        await wait_consumer_settled(bus, jobs.STREAM, spec.durable, ack.seq, 0.2)
    with pytest.raises(TimeoutError, match="the durable does not exist"):
        await wait_consumer_settled(bus, jobs.STREAM, f"absent-{unique}", 1, 0.2)
    # Handled (fetched and acknowledged): it returns.
    sub = await bus.js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
    try:
        for m in await sub.fetch(2, timeout=5):
            await m.ack_sync()
    finally:
        await sub.unsubscribe()
    await wait_consumer_settled(bus, jobs.STREAM, spec.durable, ack.seq, 10)


async def test_wait_consumers_bound_names_the_durables_that_are_missing(
    bus: Bus, unique: str
) -> None:
    spec = spec_for(f"t{unique}", unique)
    await bus.ensure_consumer(spec)
    absent = (jobs.STREAM, f"absent-{unique}")
    with pytest.raises(TimeoutError, match=rf"within 0.2 s: {jobs.STREAM}/absent-{unique}$"):
        await wait_consumers_bound(bus, (spec.stream, spec.durable), absent, timeout_s=0.2)
    await wait_consumers_bound(bus, (spec.stream, spec.durable), timeout_s=10)


async def test_last_stored_is_none_until_a_subject_holds_a_message(bus: Bus, unique: str) -> None:
    """The CI failure of test_push_deliver: a polled check read the last placement of a mirror
    that held none of that tenant's yet, and the server's 404 failed the wait at its first poll
    instead of letting it wait."""
    tenant = f"t{unique}"
    subject = jobs.subject(tenant, "submitted")
    assert await last_stored(bus.js, jobs.STREAM, subject) is None
    for job in ("j1", "j2"):
        await bus.publish(subject, submitted(tenant, job))
        last = await last_stored(bus.js, jobs.STREAM, subject)
        assert last is not None
        assert decode(last.data, JobSubmitted).job_id == job


async def test_wait_sourced_returns_once_the_merged_input_holds_what_the_origins_took(
    bus: Bus, unique: str
) -> None:
    """The ledger's merged input lagged the acknowledged publishes by hundreds of messages: a
    sequence read at once, then waited for, let a test compare a replica still stepping."""
    node = f"n{unique}"
    batches = [
        GpuSampleBatch(
            id=new_event_id(),
            at=START + timedelta(minutes=i),
            node=node,
            gpus=[GpuSample(index=0, sm_active=0.5)],
        )
        for i in range(200)
    ]
    before = (await bus.js.stream_info(ledger.IN_STREAM)).state.last_seq
    acks = await bus.publish_many([(telemetry.sample(node), b) for b in batches])
    taken = sum(not a.duplicate for a in acks)
    assert taken == len(batches)
    last = await wait_sourced(bus.js, ledger.IN_STREAM, taken, since_seq=before, timeout_s=10)
    assert last >= before + taken
    held = await last_stored(bus.js, ledger.IN_STREAM, telemetry.sample(node))
    assert held is not None
    assert held.seq <= last
    assert decode(held.data, GpuSampleBatch).id == batches[-1].id  # the last one copied too
    with pytest.raises(TimeoutError, match=rf"holds {taken} of the {taken + 1} messages"):
        await wait_sourced(bus.js, ledger.IN_STREAM, taken + 1, since_seq=before, timeout_s=0.2)


async def test_wait_copied_returns_once_the_merged_stream_holds_all_its_origins_hold(
    bus: Bus, unique: str
) -> None:
    """The slicer's SEEDANCE_JOBS sources the requests' and the observers' streams: a driver
    that waited for ``slicer-jobs`` to settle right after its publishes saw nothing pending
    while the copies were on the way. The same shape on streams of the test's own: 100
    publishes into two origins, all copied once it returns. It follows each source's progress,
    not counts: a merged stream that keeps fewer (here its own bound evicts 40) has still
    copied everything (counting, it timed out: review L6)."""
    origins = (f"ORIG_A_{unique}", f"ORIG_B_{unique}")
    sources = [js_api.StreamSource(name=o, filter_subject=f"t{unique}.{o}.>") for o in origins]
    merged, short = f"MERGED_{unique}", f"SHORT_{unique}"
    for name in origins:
        await bus.js.add_stream(js_api.StreamConfig(name=name, subjects=[f"t{unique}.{name}.>"]))
    await bus.js.add_stream(js_api.StreamConfig(name=merged, sources=sources))
    await bus.js.add_stream(js_api.StreamConfig(name=short, sources=sources, max_msgs=60))
    try:
        for i in range(50):
            for o in origins:
                await bus.js.publish(f"t{unique}.{o}.x", b"%d" % i)
        await wait_copied(bus.js, merged, timeout_s=10)
        assert (await bus.js.stream_info(merged)).state.messages == 100
        await wait_copied(bus.js, short, timeout_s=10)  # every copy made, 40 evicted
        assert (await bus.js.stream_info(short)).state.messages == 60
    finally:
        for name in (merged, short, *origins):
            await bus.js.delete_stream(name)


class FirstReadStalls:
    """A JetStream context whose first ``stream_info`` / ``consumer_info`` never answers until
    cancelled (a loaded machine stalled it past a short wait's deadline); the rest go through."""

    def __init__(self, js: Any) -> None:
        self._js = js
        self.stalled = 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._js, name)
        if name not in ("stream_info", "consumer_info"):
            return real

        async def read(*args: Any, **kwargs: Any) -> Any:
            if not self.stalled:
                self.stalled += 1
                await asyncio.get_running_loop().create_future()  # cancelled at the deadline
            return await real(*args, **kwargs)

        return read


async def test_a_wait_whose_every_read_the_deadline_cut_off_says_what_the_server_holds(
    bus: Bus, unique: str
) -> None:
    """The 0.2 s waits above, their only read stalled past the deadline: each error was built
    from no read ("holds 0", "the durable does not exist", a bound durable named missing)
    and the tests matching it failed. One read after the deadline says what the server holds."""
    node, tenant = f"n{unique}", f"t{unique}"
    before = (await bus.js.stream_info(ledger.IN_STREAM)).state.last_seq
    sample = GpuSampleBatch(
        id=new_event_id(), at=START, node=node, gpus=[GpuSample(index=0, sm_active=0.5)]
    )
    await bus.publish(telemetry.sample(node), sample)
    await wait_sourced(bus.js, ledger.IN_STREAM, 1, since_seq=before, timeout_s=10)
    js = FirstReadStalls(bus.js)
    with pytest.raises(TimeoutError, match=r"holds 1 of the 2 messages"):
        await wait_sourced(js, ledger.IN_STREAM, 2, since_seq=before, timeout_s=0.2)
    assert js.stalled == 1

    spec = spec_for(tenant, unique)
    await bus.ensure_consumer(spec)
    ack = await bus.publish(jobs.subject(tenant, "submitted"), submitted(tenant, "j0"))
    stalls = SimpleNamespace(js=FirstReadStalls(bus.js))
    with pytest.raises(TimeoutError, match=r"has not handled up to seq \d+ .*pending 1,"):
        await wait_consumer_settled(stalls, jobs.STREAM, spec.durable, ack.seq, 0.2)
    absent = (jobs.STREAM, f"absent-{unique}")
    stalls = SimpleNamespace(js=FirstReadStalls(bus.js))
    with pytest.raises(TimeoutError, match=rf"within 0.2 s: {jobs.STREAM}/absent-{unique}$"):
        await wait_consumers_bound(stalls, (spec.stream, spec.durable), absent, timeout_s=0.2)
    assert stalls.js.stalled == 1
