"""Right-sizing that applies itself, with a guard, on the deployment's own server and users.

The shipped-auth server (``auth_url``): the slicer and its right-sizing loop run as the
``slicer`` user, composed as ``python -m seedance.slicer`` composes them; a tenant
(``tenant-acme``) submits a shared job through the SDK; the node agent's user publishes the
pod's measured shares of the node the job runs on; the collector's user the node's inventory.
The job measured at 10 % of its 500-milli share is lowered to 100 milli; when it then runs at
30 % the change is rolled back to exactly the previous share, with an alert naming the cost; a
restarted loop restores the rolled-back share and publishes nothing twice. A job lowered to a
share its history reached a sixth of the time, then held at that share (billed exactly it), is
rolled back on the SLO signal alone (its memory limit, set from the memory its readings
carried, put back with it). A reading on another node's subject is dead-lettered.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.kv import ensure_bucket
from seedance.events import decode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import Placement, PlacementKind, ShareAlert, ShareChanged
from seedance.events.subjects import dlq, slicing, telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory, PodShare, PodShares
from seedance.sdk import SeedanceClient
from seedance.slicer.autosize import (
    AutosizeDurable,
    AutosizeService,
    autosize_service,
    with_autosize,
)
from seedance.slicer.core.autosize import Phase
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.slow

TENANT = "acme"  # a tenant of the shipped users (`tenant-acme`)


def as_user(url: str, user: str) -> BusSettings:
    return BusSettings(url=url, user=user, password=shipped_password(user), name=user)


@contextlib.asynccontextmanager
async def slicer_with_autosize(url: str, pool: str, replica: str) -> AsyncIterator[Any]:
    settings = SlicerSettings(
        pool=pool,
        replica=replica,
        lease_ttl_s=1.5,
        autosize_tenants=TENANT,
        autosize_min_history_s=60,
        autosize_min_samples=6,
        autosize_guard_s=600,
        autosize_window_s=30,
    )
    runtime = ServiceRuntime("slicer", as_user(url, "slicer"))
    clock = WallClock()
    loop = autosize_service(runtime, clock, settings, replica)
    assert loop is not None
    slicer = SlicerService.build(runtime, clock, settings)
    async with serving(with_autosize(slicer, loop)):
        yield slicer, loop, runtime.registry


def shares(
    node: str, job: str, gpu: int, sm: float, at: datetime, mem: float | None = None
) -> PodShares:
    return PodShares(
        id=new_event_id(at=at),
        at=at,
        node=node,
        window_start=at - timedelta(seconds=10),
        shares=[
            PodShare(
                gpu_index=gpu,
                pod_uid=f"uid-{job}",
                tenant=TENANT,
                job_id=job,
                sm_share=sm,
                mem_share=0.0,
                periods=10,
                mem_used_mib=mem,
            )
        ],
    )


def a100_node(node: str) -> NodeInventory:
    """One A100-80GB as NVML names it, in the collector's inventory."""
    now = datetime.now(UTC)
    return NodeInventory(
        id=new_event_id(at=now), at=now, node=node, cpu_milli=32_000, memory_mib=131_072,
        gpus=[GpuInfo(index=0, model="NVIDIA A100-SXM4-80GB", mem_total_mib=81_920)],
    )  # fmt: skip


async def measured(
    agent: Bus,
    node: str,
    job: str,
    gpu: int,
    sm: float,
    base: datetime,
    tens: range,
    mem: float | None = None,
) -> None:
    """The node agent's readings of `job`, one per 10 s window ending at base + 10 s x i."""
    for i in tens:
        reading = shares(node, job, gpu, sm, base + timedelta(seconds=10 * i), mem)
        await agent.publish(telemetry.pod_share(node), reading)


async def read(admin: Bus, stream: str, subject: str, job: str | None = None) -> list[Any]:
    """Every event `stream` holds on `subject` now (the operator's view), only `job`'s when
    given (the subject is the tenant's, which other tests' jobs may share): as many as the
    stream counts there, each awaited with a deadline (no guess at when the last one came)."""
    info = await admin.js.stream_info(stream, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    if count == 0:
        return []
    sub = await admin.js.subscribe(subject, ordered_consumer=True)
    try:
        events = [decode((await sub.next_msg(timeout=10)).data) for _ in range(count)]
        return [e for e in events if job is None or getattr(e, "job_id", None) == job]
    finally:
        await sub.unsubscribe()


async def outbox(admin: Bus, pool: str) -> list[tuple[str, bytes]]:
    """The events the loop of `pool` keeps to re-send, as its durable state holds them."""
    state = await (await ensure_bucket(admin, "seedance-slicer-state")).get(f"autosize.{pool}")
    return msgspec.msgpack.decode(state.value or b"", type=AutosizeDurable).outbox


async def restarted(auth_url: str, admin: Bus, pool: str, job: str) -> list[Any]:
    """Another replica's loop of `pool`, once it has restored `job`'s rolled-back share: what
    the tenant's share subject then holds of `job`."""
    key = f"{TENANT}/{job}"
    async with slicer_with_autosize(auth_url, pool, "b") as (_, again, _):
        await eventually(lambda: key in again.autosizer.state.tracks, 20, what="restored")
        track = again.autosizer.state.tracks[key]
        assert (track.milli, track.phase) == (500, Phase.ROLLED_BACK)
        return await read(admin, "SEEDANCE_SLICING", slicing.subject(TENANT, "share"), job)


async def test_a_rollback_restores_the_previous_share(auth_url: str) -> None:
    admin = await Bus.connect(as_user(auth_url, "admin"))
    agent = await Bus.connect(as_user(auth_url, "node-agent"))
    collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
    tenant = await SeedanceClient.connect(
        auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
    )
    node, job, pool = f"as-{uuid.uuid4().hex[:6]}", f"serve-{uuid.uuid4().hex[:6]}", "autosize"
    share_subject = slicing.subject(TENANT, "share")
    alert_subject = slicing.subject(TENANT, "alert")
    try:
        await admin.ensure_streams()
        await collector.publish(telemetry.inventory(node), a100_node(node))
        async with slicer_with_autosize(auth_url, pool, "a") as (slicer, loop, registry):
            await eventually(lambda: node in slicer.scheduler.node_names, 20, what="inventory")
            placed = await tenant.submit_job(TENANT, job, gpu_milli=500, wait_s=20)
            assert isinstance(placed.decision, Placement)
            assert placed.decision.kind is PlacementKind.SHARED
            gpu = placed.decision.gpus[0].index
            key = f"{TENANT}/{job}"
            # The placement reaches the loop through the merged stream, sourced apart from the
            # readings: measure only once the loop tracks the job (a reading before is no one's).
            await eventually(lambda: key in loop.autosizer.state.tracks, 20, what="job tracked")
            base = datetime.now(UTC)
            await measured(agent, node, job, gpu, 0.10, base, range(1, 7))  # 60 s at 10 %
            await eventually(
                lambda: loop.autosizer.state.tracks[key].phase is Phase.GUARDING,
                20,
                what="share lowered",
            )
            # then a 30 s window at 30 %: 3x what was predicted
            await measured(agent, node, job, gpu, 0.30, base, range(7, 10))

            async def rolled_back() -> bool:  # decided, made durable and published
                changed = await read(admin, "SEEDANCE_SLICING", share_subject, job)
                alerted = await read(admin, "SEEDANCE_SLICING", alert_subject, job)
                return (len(changed), len(alerted)) == (2, 1)

            await eventually(rolled_back, 20, what="share rolled back and published")
            track = loop.autosizer.state.tracks[key]
            assert (track.milli, track.phase) == (500, Phase.ROLLED_BACK)
            for reason in ("rightsized", "rolled_back"):
                counted = registry.get_sample_value(
                    "seedance_slicer_autosize_changes_total", {"reason": reason}
                )
                assert counted == 1, reason
            published = await read(admin, "SEEDANCE_SLICING", share_subject, job)
            alerts = await read(admin, "SEEDANCE_SLICING", alert_subject, job)
        changes = [e for e in published if isinstance(e, ShareChanged)]
        assert [(c.reason.value, c.from_milli, c.to_milli) for c in changes] == [
            ("rightsized", 500, 100),
            ("rolled_back", 100, 500),
        ]
        assert changes[1].to_milli == placed.decision.gpus[0].milli  # the previous share, exactly
        assert (changes[0].node, changes[0].gpu_index) == (node, gpu)
        assert changes[1].at == base + timedelta(seconds=90)  # the reading that decided it
        (alert,) = [a for a in alerts if isinstance(a, ShareAlert) and a.job_id == job]
        assert (alert.applied_milli, alert.restored_milli, alert.bound_ppm) == (100, 500, 50_000)
        assert alert.deviation_ppm == pytest.approx(2_000_000, abs=1)
        assert alert.signal == "cost"
        assert alert.cause_id == changes[1].cause_id

        # Stopped gracefully, the loop left nothing to re-send: the outbox it keeps until its
        # events are out is empty (else a successor's re-send would be dropped only inside the
        # stream's 2-minute duplicate window, a bound on the clock, not on the protocol).
        assert await outbox(admin, pool) == []

        # A restarted loop (another replica) restores the rolled-back share from its state and
        # publishes nothing twice (the outbox's ids are derived from the readings).
        again_published = await restarted(auth_url, admin, pool, job)
        assert [e.id for e in again_published] == [e.id for e in published]
    finally:
        await tenant.close()
        for b in (admin, agent, collector):
            await b.close()


async def test_a_job_held_at_its_new_share_is_rolled_back_on_the_slo_signal(
    auth_url: str,
) -> None:
    admin = await Bus.connect(as_user(auth_url, "admin"))
    agent = await Bus.connect(as_user(auth_url, "node-agent"))
    collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
    tenant = await SeedanceClient.connect(
        auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
    )
    node, job = f"slo-{uuid.uuid4().hex[:6]}", f"serve-{uuid.uuid4().hex[:6]}"
    share_subject = slicing.subject(TENANT, "share")
    alert_subject = slicing.subject(TENANT, "alert")
    try:
        await admin.ensure_streams()
        await collector.publish(telemetry.inventory(node), a100_node(node))
        async with slicer_with_autosize(auth_url, "autosize-slo", "a") as (slicer, loop, registry):
            await eventually(lambda: node in slicer.scheduler.node_names, 20, what="inventory")
            placed = await tenant.submit_job(TENANT, job, gpu_milli=500, wait_s=20)
            assert isinstance(placed.decision, Placement)
            gpu, key = placed.decision.gpus[0].index, f"{TENANT}/{job}"
            await eventually(lambda: key in loop.autosizer.state.tracks, 20, what="job tracked")
            base = datetime.now(UTC)
            # 60 s of history: one window at 10 %, five at 4 %: its p95 is 10 %, reached 1/6
            # of the time. Lowered to 100 milli.
            await measured(agent, node, job, gpu, 0.10, base, range(1, 2), 30_000.0)
            await measured(agent, node, job, gpu, 0.04, base, range(2, 7), 28_000.0)
            await eventually(
                lambda: loop.autosizer.state.tracks[key].phase is Phase.GUARDING,
                20,
                what="share lowered",
            )
            # Then a 30 s window pinned at the new limit: billed the share exactly (cost +0 %),
            # held there all the time where its history was 1/6 of it.
            await measured(agent, node, job, gpu, 0.10, base, range(7, 10))

            async def alerted() -> list[Any]:
                return [
                    a
                    for a in await read(admin, "SEEDANCE_SLICING", alert_subject, job)
                    if isinstance(a, ShareAlert)
                ]

            await eventually(alerted, 20, what="the alert published")
            (alert,) = await alerted()
            changes = await read(admin, "SEEDANCE_SLICING", share_subject, job)
            trips = {
                signal: registry.get_sample_value(
                    "seedance_slicer_autosize_guard_trips_total", {"signal": signal}
                )
                for signal in ("cost", "slo")
            }
        # With the memory each reading carried: the limit at its 30,000 MiB peak + 5 %, and
        # back to the placement's own with the rollback.
        assert [(c.reason.value, c.from_milli, c.to_milli, c.mem_limit_mib) for c in changes] == [
            ("rightsized", 500, 100, 31_500),
            ("rolled_back", 100, 500, 0),
        ]
        assert (alert.signal, alert.applied_milli, alert.restored_milli) == ("slo", 100, 500)
        assert (alert.deviation_ppm, alert.bound_ppm) == (833_333, 50_000)
        assert trips == {"cost": None, "slo": 1.0}
    finally:
        await tenant.close()
        for b in (admin, agent, collector):
            await b.close()


async def test_a_reading_on_another_nodes_subject_is_dead_lettered(auth_url: str) -> None:
    admin = await Bus.connect(as_user(auth_url, "admin"))
    agent = await Bus.connect(as_user(auth_url, "node-agent"))
    try:
        await admin.ensure_streams()
        async with slicer_with_autosize(auth_url, "autosize-dlq", "a"):
            now = datetime.now(UTC)
            forged = shares("node-b", "victim", 0, 0.99, now)
            await agent.publish(telemetry.pod_share("node-a"), forged)

            async def lettered() -> bool:
                letters = await read(admin, "SEEDANCE_DLQ", dlq.subject("slicer"))
                return any(
                    isinstance(d, DeadLetter)
                    and d.error_kind == "subject_mismatch"
                    and forged.id.encode() in d.payload
                    for d in letters
                )

            await eventually(lettered, 20, what="the forged reading dead-lettered")
    finally:
        for b in (admin, agent):
            await b.close()


async def test_the_loop_makes_the_schedulers_share_reader_before_it_publishes(
    auth_url: str,
) -> None:
    """`slicer-shares` starts at its creation (deliver policy new): the loop makes it at its
    own start, so no change it publishes can come before the scheduler's reader exists (the
    slicer makes it only when it first leads)."""
    admin = await Bus.connect(as_user(auth_url, "admin"))
    settings = SlicerSettings(pool="autosize-mk", replica="a", autosize_tenants=TENANT)
    runtime = ServiceRuntime("slicer", as_user(auth_url, "slicer"))
    try:
        await admin.ensure_streams()
        with contextlib.suppress(NotFoundError):
            await admin.js.delete_consumer("SEEDANCE_SLICING", "slicer-shares")
        loop = autosize_service(runtime, WallClock(), settings, "a")
        assert loop is not None
        try:
            await loop.start()
        finally:
            await loop.close()
        info = await admin.js.consumer_info("SEEDANCE_SLICING", "slicer-shares")
        assert info.config.deliver_policy == DeliverPolicy.NEW
    finally:
        await runtime.close()
        await admin.close()


def test_no_loop_without_a_tenant_that_opted_in() -> None:
    runtime = ServiceRuntime("slicer", BusSettings(url="nats://127.0.0.1:1"))
    assert autosize_service(runtime, WallClock(), SlicerSettings(), "a") is None
    loop = autosize_service(
        runtime, WallClock(), SlicerSettings(autosize_tenants=" acme , globex "), "a"
    )
    assert isinstance(loop, AutosizeService)
    slicer = object()
    assert with_autosize(slicer, None) is slicer
