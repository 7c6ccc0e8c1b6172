"""A share change dated past the right-sizing loop's bound is dead-lettered by the slicer
(`seedance.slicer.intake`, `MAX_AHEAD_S`), on the deployment's own server and users: the
slicer as ``slicer`` (the only user that may publish ``seedance.slicing.>``, as its loop does),
a tenant (``tenant-acme``) submitting a shared job, the collector publishing the node.

Failed before the change: the slicer took a `ShareChanged` dated a day ahead of its receive
time as it took any other (no dead letter came) and lowered the job's share, dating the job's
later decisions, its release among them, a day ahead: the ledger bills the job that long.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from seedance.core import Bus, ServiceRuntime, WallClock
from seedance.events import decode, new_event_id
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import Placement, ShareChanged, ShareChangeReason
from seedance.events.subjects import dlq, slicing, telemetry
from seedance.sdk import SeedanceClient
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.slicer.test_autosize_rollback import TENANT, a100_node, as_user
from tests.integration.slicer.test_share_rollback import slicer_share

pytestmark = pytest.mark.slow


async def test_a_share_change_dated_a_day_ahead_is_dead_lettered_and_changes_nothing(
    auth_url: str,
) -> None:
    admin = await Bus.connect(as_user(auth_url, "admin"))
    loop = await Bus.connect(as_user(auth_url, "slicer"))  # the loop publishes as the slicer
    collector = await Bus.connect(as_user(auth_url, "telemetry-collector"))
    tenant = await SeedanceClient.connect(
        auth_url, user=f"tenant-{TENANT}", password=shipped_password(f"tenant-{TENANT}")
    )
    u = uuid.uuid4().hex[:6]
    node, job = f"bound-{u}", f"serve-{u}"
    letters: list[DeadLetter] = []

    async def collect(msg: Any) -> None:
        letter = decode(msg.data, DeadLetter)
        if f"node {node!r}" in letter.reason:
            letters.append(letter)

    sub = await admin.nc.subscribe(dlq.subject("slicer"), cb=collect)
    runtime = ServiceRuntime("slicer", as_user(auth_url, "slicer"))
    svc = SlicerService.build(
        runtime, WallClock(), SlicerSettings(pool=f"bound-{u}", replica="a", lease_ttl_s=1.5)
    )
    try:
        await admin.ensure_streams()
        await collector.publish(telemetry.inventory(node), a100_node(node))
        async with serving(svc):
            await eventually(lambda: node in svc.scheduler.node_names, 20, what="inventory")
            placed = await tenant.submit_job(TENANT, job, gpu_milli=500, wait_s=20)
            assert isinstance(placed.decision, Placement)
            ahead = ShareChanged(
                id=new_event_id(), at=datetime.now(UTC) + timedelta(days=1), job_id=job,
                tenant=TENANT, node=node, gpu_index=placed.decision.gpus[0].index,
                from_milli=500, to_milli=200, reason=ShareChangeReason.RIGHTSIZED,
            )  # fmt: skip
            await loop.publish(slicing.subject(TENANT, "share"), ahead)
            await eventually(lambda: bool(letters), 20, what="the change dead-lettered")
            (letter,) = letters
            assert letter.error_kind == "future_time"
            assert letter.subject == slicing.subject(TENANT, "share")
            assert "s after the server's receive time" in letter.reason
            assert "the right-sizing loop's bound = 300 s" in letter.reason
            refused = runtime.registry.get_sample_value(
                "seedance_slicer_refused_node_facts_total", {"reason": "future_time"}
            )
            assert refused == 1.0
            assert slicer_share(svc, f"{TENANT}/{job}") == 500  # nothing changed
    finally:
        await sub.unsubscribe()
        await tenant.close()
        for bus in (admin, loop, collector):
            await bus.close()
