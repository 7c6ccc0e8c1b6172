"""`seedance.core.durable.DurableRuntime` with a leadership handed in (the k8s-bridge's
Kubernetes Lease) and no core (its state changed only through `transact`), against a real
nats-server: it leads only while the leadership is held, commits and publishes while leading,
steps down (``on_step_down``) once it is lost, and gives it up on the way out."""

from __future__ import annotations

import asyncio

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.durable import DurableRuntime, DurableSpec, Outbox
from seedance.core.state_store import StateStore
from seedance.events.base import derived_event_id
from seedance.events.slicing import JobRejected, RejectionReason
from seedance.events.subjects import slicing
from seedance.testing.waits import eventually
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
