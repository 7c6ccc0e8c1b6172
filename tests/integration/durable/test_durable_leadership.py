"""`seedance.core.durable.DurableRuntime` with a leadership handed in (the k8s-bridge's
Kubernetes Lease) and no core (its state changed only through `transact`), against a real
nats-server: it leads only while the leadership is held, commits and publishes while leading,
steps down (``on_step_down``) once it is lost, and gives it up on the way out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime, VirtualClock, WallClock
from seedance.core.durable import DurableRuntime, DurableSpec, Outbox
from seedance.core.kv import Lease, ensure_bucket
from seedance.core.publisher import AckedBatch, PubAck
from seedance.core.state_store import StateStore
from seedance.events.base import derived_event_id
from seedance.events.slicing import JobRejected, RejectionReason
from seedance.events.subjects import slicing
from seedance.testing.identities import password
from seedance.testing.waits import eventually
from tests.integration.bus.test_lease import Hangs
from tests.integration.durable.test_durable_runtime import T0, Metrics, Tally, rejections


class Held:
    """A leadership the test takes and drops (`Leadership`)."""

    def __init__(self) -> None:
        self.acquired = asyncio.Event()
        self.kept = asyncio.Event()
        self.released = 0

    @property
    def held(self) -> bool:
        return self.acquired.is_set()

    async def keep(self) -> None:
        self.kept.set()
        await asyncio.Event().wait()  # until cancelled

    async def release(self) -> None:
        self.released += 1
        self.acquired.clear()


async def test_a_handed_in_leadership_leads_commits_and_steps_down_without_a_core(
    nats_url: str, unique: str, bus: Bus
) -> None:
    rt = ServiceRuntime("slicer", BusSettings(url=nats_url, name="test-durable-leadership"))
    lead = Held()
    terms: list[str] = []

    async def on_lead() -> None:
        terms.append("lead")

    async def on_step_down() -> None:
        terms.append("down")

    key, tenant = f"pool.l{unique}", f"t{unique}"
    spec = DurableSpec(bucket="seedance-slicer-state", key=key, lease_key="", lease_ttl_s=0.6)
    durable = DurableRuntime(
        rt, WallClock(), spec, state=Tally, metrics=Metrics(), leadership=lead,
        on_lead=on_lead, on_step_down=on_step_down,
    )  # fmt: skip
    with pytest.raises(TypeError):
        durable.handler("slicer-pauses")  # no core: nothing to consume with

    def change() -> Outbox:
        state = durable.state
        assert isinstance(state, Tally)
        state.counts[tenant] = 1
        state._changed.add(tenant)
        ev = JobRejected(
            id=derived_event_id(unique, "leadership"), at=T0, tenant=tenant, job_id="pause-1",
            reason=RejectionReason.INVALID_REQUEST,
        )  # fmt: skip
        return [(slicing.subject(tenant, "rejected"), ev)]

    await rt.start()
    try:
        await durable.start()
        runner = asyncio.create_task(durable.run())
        try:
            await eventually(lead.kept.is_set, 5, what="the leadership kept")
            assert not durable.leading
            assert terms == []
            lead.acquired.set()
            await eventually(lambda: durable.leading, 5, what="leading once it is held")
            assert await durable.transact(change)
            lead.acquired.clear()
            await eventually(lambda: terms == ["lead", "down"], 5, what="stepped down once lost")
            assert not durable.leading
        finally:
            durable.stop()
            await runner
        assert await rejections(bus, tenant) == ["pause-1"]
        again = Tally(await StateStore.open(bus, "seedance-slicer-state", key))
        await again.load()
        assert again.counts == {tenant: 1}
    finally:
        await durable.close()
        await rt.close()
    assert lead.released >= 1


@contextlib.asynccontextmanager
async def _stalled_leader(
    nats_url: str, unique: str, terms: list[str], *, leads: bool = True
) -> AsyncIterator[tuple[DurableRuntime, Held, ServiceRuntime, list[AckedBatch], list[Any]]]:
    """A runtime leading under `Held` whose effects are sent but never acknowledged (a stream
    that does not answer); yields it, its leadership, its service runtime, the batches whose
    acks never come and those the publisher was told to forget. Not ``leads``: its state
    loaded, no leadership loop (the test drives it alone)."""
    rt = ServiceRuntime("slicer", BusSettings(url=nats_url, name="test-durable-stalled"))
    lead = Held()

    async def on_step_down() -> None:
        terms.append("down")

    spec = DurableSpec(
        bucket="seedance-slicer-state", key=f"pool.s{unique}", lease_key="", lease_ttl_s=0.6
    )
    durable = DurableRuntime(
        rt, WallClock(), spec, state=Tally, metrics=Metrics(), leadership=lead,
        on_step_down=on_step_down,
    )  # fmt: skip
    stalled: list[AckedBatch] = []
    forgotten: list[Any] = []
    await rt.start()
    try:

        async def unanswered(items: Sequence[tuple[str, Any]], **kw: Any) -> AckedBatch:
            done: asyncio.Future[list[PubAck]] = asyncio.get_running_loop().create_future()
            stalled.append(
                AckedBatch(
                    messages=list(items),
                    acks=[None] * len(items),
                    done=done,
                    publisher=rt.bus.publisher,
                )
            )
            return stalled[-1]

        rt.bus.send_many = unanswered  # type: ignore[method-assign]
        forget = rt.bus.publisher.forget
        rt.bus.publisher.forget = lambda b: (forgotten.append(b), forget(b))[1]  # type: ignore[method-assign]
        await durable.start()
        if not leads:
            await durable.state.load()
            yield durable, lead, rt, stalled, forgotten
            return
        runner = asyncio.create_task(durable.run())
        try:
            await eventually(lead.kept.is_set, 5, what="the leadership kept")
            lead.acquired.set()
            await eventually(lambda: durable.leading, 5, what="leading once it is held")
            yield durable, lead, rt, stalled, forgotten
        finally:
            durable.stop()
            await runner
    finally:
        await durable.close()
        await rt.close()


def _rejected(durable: DurableRuntime, tenant: str, what: str) -> Callable[[], Outbox]:
    def change() -> Outbox:
        state = durable.state
        assert isinstance(state, Tally)
        state.counts[tenant] = state.counts.get(tenant, 0) + 1
        state._changed.add(tenant)
        ev = JobRejected(
            id=derived_event_id(tenant, what), at=T0, tenant=tenant, job_id=what,
            reason=RejectionReason.INVALID_REQUEST,
        )  # fmt: skip
        return [(slicing.subject(tenant, "rejected"), ev)]

    return change


async def test_a_lost_leadership_steps_down_at_once_without_waiting_for_the_effects_acks(
    nats_url: str, unique: str
) -> None:
    # The outbox is durable: the next leader publishes it. Waiting for its acks first (up to
    # twice the publish timeout) kept a k8s-bridge acting on the cluster after losing the Lease.
    terms: list[str] = []
    async with _stalled_leader(nats_url, unique, terms) as (durable, lead, _, stalled, forgotten):
        assert await durable.transact(_rejected(durable, f"t{unique}", "pause-1"))
        await eventually(lambda: stalled, 5, what="the effects sent")
        lead.acquired.clear()
        # well inside the publish timeout (10 s) the acks would have been waited for
        await eventually(lambda: terms == ["down"], 3, what="stepped down once lost")
        assert stalled[0] in forgotten  # no longer tracked by the publisher
        assert durable.state.outbox  # still owed: the next leader's


async def test_acks_of_an_outbox_a_reload_replaced_are_no_longer_tracked(
    nats_url: str, unique: str, bus: Bus
) -> None:
    tenant = f"t{unique}"
    async with _stalled_leader(nats_url, unique, [], leads=False) as (
        durable,
        _,
        rt,
        stalled,
        forgotten,
    ):
        assert await durable.transact(_rejected(durable, tenant, "pause-1"))
        await durable._reload()  # as after a conflict: the outbox read back, a new list
        assert durable._sender.sent is not None
        assert durable._sender.sent[1] is not durable.state.outbox
        del rt.bus.send_many  # the stream answers again
        await durable._sender.flush()
        assert stalled[0] in forgotten  # else tracked by the publisher for ever
        assert durable._sender.sent is None
        assert not durable.state.outbox
    assert await rejections(bus, tenant) == ["pause-1"]


async def test_a_leader_whose_lease_refresh_hangs_steps_down_at_the_lease_s_ttl(
    nats_url: str, unique: str, bus: Bus
) -> None:
    # The KV lease (`seedance.core.kv.Lease`, the slicer's) whose refresh neither fails nor
    # returns: the runtime once went on leading until the call came back, while the key could
    # expire and a standby lead beside it. Its clock is virtual: the TTL passes when told.
    kv = await ensure_bucket(bus, "seedance-leases")
    hung, clock = Hangs(kv), VirtualClock()
    lease = Lease(hung, f"slicer.h{unique}", "a", clock, ttl_s=3.0)  # type: ignore[arg-type]
    rt = ServiceRuntime("slicer", BusSettings(url=nats_url, name="test-durable-hung-lease"))
    terms: list[str] = []

    async def on_lead() -> None:
        terms.append("lead")

    async def on_step_down() -> None:
        terms.append("down")

    spec = DurableSpec(
        bucket="seedance-slicer-state", key=f"pool.h{unique}", lease_key="", lease_ttl_s=0.6
    )
    durable = DurableRuntime(
        rt, WallClock(), spec, state=Tally, metrics=Metrics(), leadership=lease,
        on_lead=on_lead, on_step_down=on_step_down,
    )  # fmt: skip
    await rt.start()
    try:
        await durable.start()
        runner = asyncio.create_task(durable.run())
        try:
            await eventually(lambda: durable.leading, 5, what="leading once the lease is held")
            hung.hanging = True
            await clock.advance(1.0)  # the refresh at 1 s hangs
            await eventually(lambda: hung.entered == 1, 5, what="the refresh in flight")
            await clock.advance(1.0)
            assert durable.leading  # 2 s since the last refresh that succeeded
            await clock.advance(1.0)
            assert not durable.leading  # 3 s: by the clock, the refresh still in flight
            await eventually(lambda: terms == ["lead", "down"], 5, what="stepped down")
            await eventually(lambda: hung.cancelled == 1, 5, what="the refresh cancelled")
        finally:
            durable.stop()
            await runner
    finally:
        await durable.close()
        await rt.close()


_ROOT = Path(__file__).resolve().parents[3]
# A second process: its runtime holds a lease under the default name and prints what the
# key holds (argv: the server's URL, the state key, the lease key).
_HOLD_IN_ANOTHER_PROCESS = """
import asyncio, os, sys
from seedance.core import BusSettings, ServiceRuntime, WallClock
from seedance.core.durable import DurableRuntime, DurableSpec
from seedance.core.kv import ensure_bucket
from tests.integration.durable.test_durable_runtime import Metrics, Tally

async def main(url, key, lease_key):
    bus = BusSettings(
        url=url, name="test-durable-holder-2", user="slicer", password=os.environ["PASSWORD"]
    )
    rt = ServiceRuntime("slicer", bus)
    spec = DurableSpec(bucket="seedance-slicer-state", key=key, lease_key=lease_key)
    durable = DurableRuntime(rt, WallClock(), spec, state=Tally, metrics=Metrics())
    await rt.start()
    try:
        await durable.start()
        assert await durable._lease.try_acquire()
        entry = await (await ensure_bucket(rt.bus, "seedance-leases")).get(durable._lease._key)
        print(entry.value.decode())
        await durable._lease.release()
    finally:
        await durable.close()
        await rt.close()

asyncio.run(main(*sys.argv[1:]))
"""


async def _held_under(nats_url: str, key: str, lease_key: str, holder: str) -> str:
    """The name the key of a lease held by a runtime of this process (`holder` configured, or
    "" for the default) holds."""
    bus = BusSettings(
        url=nats_url, name="test-durable-holder", user="slicer", password=password("slicer")
    )  # the shipped user the slicer runs as (the lease's key and the state bucket it may use)
    rt = ServiceRuntime("slicer", bus)
    spec = DurableSpec(bucket="seedance-slicer-state", key=key, lease_key=lease_key, holder=holder)
    durable = DurableRuntime(rt, WallClock(), spec, state=Tally, metrics=Metrics())
    await rt.start()
    try:
        await durable.start()
        lease = durable._lease
        assert isinstance(lease, Lease)
        assert await lease.try_acquire()
        entry = await (await ensure_bucket(rt.bus, "seedance-leases")).get(lease._key)
        await lease.release()
        return entry.value.decode()
    finally:
        await durable.close()
        await rt.close()


async def test_two_runtimes_of_one_host_hold_their_lease_under_names_that_differ(
    nats_url: str, unique: str
) -> None:
    """With no holder configured, two processes of one host (this one and a child) held their
    leases under the host name alone, so their logs and the key could not tell which one led.
    The default now names the host, the pid and a random suffix (one per process: the
    slicer's two leases log one name); a configured holder is kept as it is."""
    here = await _held_under(nats_url, f"pool.n{unique}", f"slicer.n{unique}", "")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _HOLD_IN_ANOTHER_PROCESS, nats_url, f"pool.c{unique}",
        f"slicer.c{unique}", cwd=_ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PASSWORD": password("slicer")},
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(child.communicate(), 60)
    finally:
        if child.returncode is None:  # timed out (or cancelled): no child left running
            child.kill()
            await child.wait()
    assert child.returncode == 0, err.decode()
    there = out.decode().strip().splitlines()[-1]
    assert here != there  # the bug: both were socket.gethostname()
    for name, pid in ((here, os.getpid()), (there, child.pid)):
        host, its_pid, suffix = name.rsplit("-", 2)
        assert (host, its_pid) == (socket.gethostname(), str(pid))
        assert len(suffix) == 4
        assert int(suffix, 16) >= 0
    configured = await _held_under(nats_url, f"pool.r{unique}", f"slicer.r{unique}", "replica-b")
    assert configured == "replica-b"
