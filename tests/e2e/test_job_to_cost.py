"""A job's whole life across real processes: SDK → slicer → cost-ledger → the tenant's stream."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from seedance.core import Bus, BusSettings
from seedance.events import decode
from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.slicing import Placement
from seedance.events.subjects import slicing, telemetry
from seedance.sdk import SeedanceClient
from tests.e2e.conftest import wait_for_consumers, wait_until_consumed

pytestmark = pytest.mark.e2e


async def next_placement(bus: Bus, tenant: str, timeout_s: float = 30.0) -> Placement:
    sub = await bus.js.subscribe(slicing.subject(tenant, "placement"), ordered_consumer=True)
    try:
        msg = await sub.next_msg(timeout=timeout_s)
        return decode(msg.data, Placement)
    finally:
        await sub.unsubscribe()


async def collect(it: Any, n: int, timeout_s: float) -> list[Any]:
    out: list[Any] = []
    async with asyncio.timeout(timeout_s), contextlib.aclosing(it) as events:
        async for ev in events:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_submitted_job_is_placed_finishes_and_is_costed(
    nats_url: str, services: Any, node_csv: Any, unique: str
) -> None:
    tenant = f"e2e{unique}"
    services.start("telemetry-collector", node_csv=str(node_csv(4)), tick_s="5")
    services.start("slicer", replica=f"s-{unique}", pool=f"pool{unique}")
    services.start("cost-ledger", state_key=unique)
    await wait_for_consumers(
        nats_url,
        ("SEEDANCE_JOBS", "slicer-jobs"),
        ("SEEDANCE_JOBS", "ledger-jobs"),
        ("SEEDANCE_SLICING", "ledger-slicing"),
    )
    # The slicer places only on nodes it knows: the collector's inventory must be read first.
    for i in range(4):
        await wait_until_consumed(
            nats_url, "SEEDANCE_TELEMETRY", "slicer-inventory", telemetry.inventory(f"e2e-node-{i}")
        )
    bus = await Bus.connect(BusSettings(url=nats_url))
    client = await SeedanceClient.connect(nats_url)
    start = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    async with client:
        await client.submit_job(tenant, "train-1", gpus=2, at=start)
        placement = await next_placement(bus, tenant)
        assert placement.job_id == "train-1"
        assert [g.milli for g in placement.gpus] == [1000, 1000]
        assert placement.gpu_model == "T4"

        await client.finish_job(tenant, "train-1", at=start + timedelta(hours=3))
        events = await collect(client.costs(tenant), 2, timeout_s=30)
    await bus.close()
    entry = next(e for e in events if isinstance(e, CostEntry))
    report = next(e for e in events if isinstance(e, JobCostReport))
    # 2 T4 GPUs for 3 hours at the foundation price book's $0.35 per GPU-hour.
    assert entry.gpu_hours == pytest.approx(6.0)
    assert entry.cost_micro_usd == 2_100_000
    assert report.cost_micro_usd == entry.cost_micro_usd
    assert placement.id in entry.source_ids
    codes = services.stop_all()
    assert codes == {"telemetry-collector": 0, "slicer": 0, "cost-ledger": 0}, codes
