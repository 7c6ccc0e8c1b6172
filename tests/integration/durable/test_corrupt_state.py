"""A state key that does not decode is refused by name, never read past nor skipped.

The secaudit's F1: tenant-acme had the cost-ledger answer its allocation request on the
slicer's journal keys (``$KV.seedance-slicer-state.<pool>.j.<n>``), and the slicer, restarted,
crash-looped on a zlib traceback. Here an operator writes the same bytes (the server no longer
lets the ledger) over a committed pool's journal record, and next over the slot after it; the
slicer's shipped user loads the pool with its own store.
"""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.durable import DurableRuntime, DurableSpec, Outbox
from seedance.core.errors import StartRefused
from seedance.core.kv import ensure_bucket
from seedance.core.state_store import CorruptState, StateStore
from seedance.events.cost import PauseRequest
from seedance.events.subjects import costs
from seedance.k8s_bridge.records import JOBS_BUCKET, BridgeRecords, state_key
from seedance.testing.waits import eventually, stop_task
from tests.integration.conftest import shipped_password
from tests.integration.durable.test_durable_runtime import (
    Metrics,
    Tally,
    TallyCore,
    deliveries,
    pause,
)
from tests.integration.durable.test_slicer_restore_lease import an_earlier_leaders_pool, state

#: What the ledger wrote there (its refusal of an empty query).
LEDGER_ANSWER = b'{"type":"allocation.refusal.v1","parameter":"query","message":"not an'
#: What the server writes on a key a tenant names as its publish's reply (review-reply p10).
PUB_ACK = b'{"stream":"SEEDANCE_JOBS","seq":1}'


def _slicer_tally(
    auth_url: str, name: str
) -> tuple[ServiceRuntime, TallyCore, DurableRuntime, str]:
    """A durable runtime as the slicer's user runs one (its state bucket and lease), on the
    tally core, keyed ``pool.<name>``: the runtime, the core, the durable runtime, the key."""
    settings = BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer"))
    rt = ServiceRuntime("slicer", settings)
    core = TallyCore()
    spec = DurableSpec(bucket="seedance-slicer-state", key=f"pool.{name}",
                       lease_key=f"slicer.{name}", holder="a", lease_ttl_s=1.5)  # fmt: skip
    durable = DurableRuntime(rt, WallClock(), spec, state=Tally, core=core, metrics=Metrics())
    core.durable = durable
    return rt, core, durable, spec.key


@pytest.mark.parametrize("slot", [0, 1])
async def test_a_journal_record_that_does_not_decode_refuses_naming_its_key(
    auth_url: str, admin: Bus, unique: str, slot: int
) -> None:
    settings = BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer"))
    rt = ServiceRuntime("slicer", settings)
    await rt.start()
    try:
        key = f"pool.c{unique}"
        await an_earlier_leaders_pool(rt, key)  # one commit: journal record j.0
        bucket = await ensure_bucket(admin, "seedance-slicer-state")
        await bucket.put(f"{key}.j.{slot}", LEDGER_ANSWER)
        restarted = await state(rt, key)
        try:
            with pytest.raises(CorruptState) as refused:
                await restarted.load()
        finally:
            await restarted.store.close()
    finally:
        await rt.close()
    assert isinstance(refused.value, StartRefused)
    assert f"state key '{key}.j.{slot}' does not decode" in str(refused.value)
    assert repr(LEDGER_ANSWER[:24]) in str(refused.value)


async def test_a_running_leader_ends_on_a_journal_record_that_does_not_decode(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """review-reply p12: the next journal slot overwritten while the slicer ran; its commit
    conflicted, the reload met the record, and the batch was retried at info level
    ("batch not made durable: CorruptState(...)") for ever. It must end the batch (and the
    service: `serve`, exit 78) as the refusal it is; a change (`transact`) likewise, and
    never commit after the failed reload (it wrote from record 0 over the committed one)."""
    rt, core, durable, key = _slicer_tally(auth_url, f"r{unique}")
    await rt.start()
    try:
        await durable.start()
        await durable.state.load()
        t = f"t{unique}"
        assert await durable.handler("slicer-pauses")(deliveries([pause(t)], 1)) == [None]
        bucket = await ensure_bucket(admin, "seedance-slicer-state")
        await bucket.put(f"{key}.j.1", LEDGER_ANSWER)  # the slot the next commit writes
        with pytest.raises(CorruptState, match=rf"state key '{key}.j.1' does not decode"):
            await durable.handler("slicer-pauses")(deliveries([pause(t, minute=1)], 2))
        committed = (await bucket.get(f"{key}.j.0")).revision

        def change() -> Outbox:
            core.tally.counts[t] += 1
            core.tally._changed.add(t)
            return []

        with pytest.raises(CorruptState, match=rf"state key '{key}.j.1' does not decode"):
            await durable.transact(change)
        # Not written over the committed record (a commit after the failed load did, from 0).
        assert (await bucket.get(f"{key}.j.0")).revision == committed
    finally:
        durable.stop()
        await durable.close()
        await rt.close()


async def test_a_leader_whose_consumer_meets_a_record_that_does_not_decode_ends(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """The same, as the slicer runs it (`run`: the lease, the consumers bound while leading):
    the refusal ends `run` (then `serve`: exit 78), not only the consumer's task, which left
    the leader holding the lease and reading nothing."""
    rt, core, durable, key = _slicer_tally(auth_url, f"l{unique}")
    c = rt.consume("slicer-pauses", PauseRequest, managed=False,
                   batch_handler=durable.handler("slicer-pauses"))  # fmt: skip
    durable.consume([c])
    await rt.start()
    task: asyncio.Task[None] | None = None
    try:
        await durable.start()
        task = asyncio.create_task(durable.run())
        await eventually(lambda: durable.leading, 15, what="leads")
        t = f"t{unique}"
        await admin.publish(costs.subject(t, "pause"), pause(t))
        await eventually(lambda: core.tally.counts == {t: 1}, 15, what="applied")
        bucket = await ensure_bucket(admin, "seedance-slicer-state")
        await bucket.put(f"{key}.j.1", LEDGER_ANSWER)
        await admin.publish(costs.subject(t, "pause"), pause(t, minute=1))
        await eventually(task.done, 15, what="run ended")
        with pytest.raises(CorruptState, match=rf"state key '{key}.j.1' does not decode"):
            await task
    finally:
        durable.stop()
        if task is not None and not task.done():
            await stop_task(task)
        await durable.close()
        await rt.close()


async def test_an_older_bridges_record_that_is_no_count_refuses_naming_its_key(
    auth_url: str, admin: Bus, unique: str
) -> None:
    """The k8s-bridge's first load moves older bridges' one-key records into its state: a
    value there that is no count (a publish ack the server wrote on the key) ended the start
    in a raw ``ValueError: invalid literal for int()``; it is refused by name."""
    settings = BusSettings(url=auth_url, user="k8s-bridge", password=shipped_password("k8s-bridge"))
    rt = ServiceRuntime("k8s-bridge", settings)
    await rt.start()
    try:
        scope = f"l{unique}"
        bucket = await ensure_bucket(admin, JOBS_BUCKET)
        await bucket.put(f"{scope}.acme.job=1", PUB_ACK)
        store = await StateStore.open(rt.bus, JOBS_BUCKET, state_key(scope))
        try:
            with pytest.raises(CorruptState, match=rf"record key '{scope}\.acme\.job=1' is not"):
                await BridgeRecords(store, scope=scope).load()
        finally:
            await store.close()
    finally:
        await rt.close()
