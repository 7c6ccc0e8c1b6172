"""Hourly billing of an honest 8-GPU node sampled each second is published and billed, against
a real nats-server running the shipped users and permissions; a replica refuses to start on a
server whose ``max_payload`` cannot carry the ledger's output bound.

Before: a cost line listed every GPU reading of its window in ``source_ids``, so with
``window_s`` = 3600 the node's idle line encoded to 1,181,497 bytes, over the server's 1 MiB
``max_payload``: the publish failed (``MaxPayloadError``), and the replica with it, at that
window's close on every restart. A line now lists its facts, then each sample batch once, at
most ``MAX_SOURCE_IDS`` entries (the last naming the rest by count and digest), so every output
is under ``MAX_OUTPUT_BYTES`` (64 KiB) whatever the window and the sampling rate.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import (
    MAX_OUTPUT_BYTES,
    OUTPUT_HEADERS_BYTES,
    LedgerReplica,
    ledger_inputs,
)
from seedance.cost_ledger.service import LedgerService
from seedance.events import decode
from seedance.events.cost import MAX_SOURCE_IDS, CostEntry, CostKind, source_count
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import GpuInfo, GpuSample, GpuSampleBatch, NodeInventory
from seedance.testing.identities import password
from seedance.testing.servers import SHIPPED_AUTH, NatsServer, auth_server
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import caught_up, read_all

WINDOW_S = 3600  # hourly billing: SEEDANCE_COST_LEDGER_WINDOW_S=3600
CONFIG = core.LedgerConfig(window_s=WINDOW_S, retention_windows=48)
BOOK = core.default_price_book()
GPUS = 8
NODE = "h-8"


def bus_as(url: str, user: str) -> BusSettings:
    return BusSettings(url=url, user=user, password=password(user), name=user)


def _ledger(url: str, name: str) -> LedgerService:
    settings = bus_as(url, "cost-ledger")
    runtime = ServiceRuntime("cost-ledger", settings, registry=CollectorRegistry())
    return LedgerService.build(runtime, LedgerReplica(BOOK, CONFIG), name=name, checkpoint_key=name)


def _uid(kind: int, n: int) -> str:
    return f"0190c000-0000-7000-{8000 + kind:04d}-{n:012d}"


def _batch(n: int, at: datetime) -> GpuSampleBatch:
    gpus = [GpuSample(index=i, sm_active=0.5, energy_j=300.0 * n) for i in range(GPUS)]
    return GpuSampleBatch(id=_uid(1, n), at=at, node=NODE, gpus=gpus)


async def test_an_hourly_window_of_an_8_gpu_node_sampled_each_second_is_billed(
    server: NatsServer,
) -> None:
    # Three to four hours ago, on an hour's boundary: every fact is in the server's past.
    now_s = int(time.time())
    start = datetime.fromtimestamp((now_s // WINDOW_S) * WINDOW_S - 3 * WINDOW_S, UTC)
    inventory = NodeInventory(
        id=_uid(0, 1), at=start, node=NODE, cpu_milli=64_000, memory_mib=512_000,
        gpus=[GpuInfo(index=i, model="H100", mem_total_mib=81_920) for i in range(GPUS)],
    )  # fmt: skip
    place = Placement(
        id=_uid(0, 2), at=start, job_id="train-1", tenant="acme", node=NODE, gpu_model="H100",
        kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0)],
    )  # fmt: skip
    # The collector's 1 s tick for the whole hour, then one past its close (end + lateness).
    batches = [_batch(k, start + timedelta(seconds=k)) for k in range(WINDOW_S)]
    closer = _batch(WINDOW_S + CONFIG.lateness_s + 1, start + timedelta(seconds=3661))
    service = _ledger(server.url, "hourly")
    buses: list[Bus] = []  # each closed in the finally, those connected before a failure too
    try:
        for user in ("admin", "slicer", "telemetry-collector"):
            buses.append(await Bus.connect(bus_as(server.url, user)))  # noqa: PERF401
        admin, slicer, collector = buses
        await admin.ensure_streams()
        async with serving(service):
            # The window's facts before its samples: sourced apart into the merged stream,
            # either one sourced after the close would be a late fact (a revision).
            await collector.publish(telemetry.inventory(NODE), inventory)
            await slicer.publish(slicing.subject("acme", "placement"), place)
            await caught_up(admin, service, 2)
            for b in batches:
                await collector.publish(telemetry.sample(NODE), b)
            await caught_up(admin, service, 2 + len(batches))
            await collector.publish(telemetry.sample(NODE), closer)
            # every input stepped and every output acked: the window's lines are published
            await caught_up(admin, service, 3 + len(batches))
            clock_ms = service.replica.clock_ms
            totals = service.replica.totals()
            msgs = await read_all(admin, "SEEDANCE_COSTS")
    finally:
        for b in buses:
            await b.close()
    sizes = [len(m.data) for m in msgs]
    entries = [e for e in (decode(m.data) for m in msgs) if isinstance(e, CostEntry)]
    first = [e for e in entries if e.period_start == start]
    assert {e.kind for e in first} == {CostKind.IDLE, CostKind.COMPUTE}, entries
    assert max(sizes) <= MAX_OUTPUT_BYTES
    idle = next(e for e in first if e.kind == CostKind.IDLE)
    # its facts listed first, then the hour's batches, 3,602 sources in all, each counted
    assert idle.source_ids[:2] == [inventory.id, place.id]
    assert len(idle.source_ids) == MAX_SOURCE_IDS
    assert source_count(idle.source_ids) == 2 + WINDOW_S
    # Billed: as the offline recompute bills the same inputs, the acme job's line included.
    assert clock_ms is not None
    inputs = ledger_inputs([inventory, place, *batches, closer], BOOK)
    assert totals == core.recompute(inputs, BOOK, clock_ms, CONFIG)
    acme = sum(e.cost_micro_usd for e in entries if e.tenant == "acme")
    assert acme == totals.by_tenant["acme"].total_usd_micro > 0
    idle_usd = sum(e.cost_micro_usd for e in entries if e.kind == CostKind.IDLE)
    assert idle_usd == totals.idle.total_usd_micro > 0


async def test_a_replica_refuses_to_start_on_a_server_that_cannot_carry_its_bound() -> None:
    # 64 KiB: the outputs' bound, but not the headers' allowance beside it
    server = auth_server("max_payload: 65536\n" + SHIPPED_AUTH.read_text(), password)
    try:
        service = _ledger(server.url, "too-small")
        try:
            with pytest.raises(RuntimeError) as info:
                await service.start()
        finally:
            await service.close()
    finally:
        server.stop()
    message = str(info.value)
    assert "max_payload = 65536" in message
    assert f"MAX_OUTPUT_BYTES = {MAX_OUTPUT_BYTES} + {OUTPUT_HEADERS_BYTES}" in message
