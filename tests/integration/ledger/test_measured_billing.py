"""Shared GPUs billed by measured share, through a real nats-server: the node agent's
``gpu.pod_share.v1`` reaches the ledger through its merged input stream, the job reports carry
both bills, a re-sent reading counts once, a reading on another node's subject is refused, and
a restarted replica goes on to the same totals as the offline recompute."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from importlib import resources

from prometheus_client import CollectorRegistry

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.cost_ledger import core
from seedance.cost_ledger.core.replica import LedgerReplica, ledger_inputs
from seedance.cost_ledger.service import LedgerService
from seedance.events import Event, decode
from seedance.events.cost import JobCostReport
from seedance.events.dlq import DeadLetter
from seedance.events.slicing import EndOutcome, GpuAssignment, JobReleased, Placement, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import (
    GpuInfo,
    GpuSample,
    GpuSampleBatch,
    NodeInventory,
    PodShare,
    PodShares,
)
from seedance.testing.servers import NatsServer
from tests.conftest import serving
from tests.integration.ledger.test_ledger_service import CONFIG, caught_up, read_all

# The bundled prices, shared GPUs billed by measured share.
_BUNDLED = resources.files(core).joinpath("default_price_book.toml").read_text("utf-8")
assert 'billing = "allocation"' in _BUNDLED
BOOK = core.parse_price_book(_BUNDLED.replace('billing = "allocation"', 'billing = "measured"'))
NODE = "h-1"


def _uid(n: int) -> str:
    return f"0190c000-0000-7000-8000-{n:012d}"


def _start() -> datetime:
    """An hour ago on a window boundary: every fact is in the server's past."""
    w = CONFIG.window_s
    return datetime.fromtimestamp((int(time.time()) // w) * w - 3600, UTC)


def _ledger(url: str, name: str) -> LedgerService:
    runtime = ServiceRuntime("cost-ledger", BusSettings(url=url), registry=CollectorRegistry())
    replica = LedgerReplica(BOOK, CONFIG)
    return LedgerService.build(runtime, replica, name=name, checkpoint_key=name)


def _subject(e: Event) -> str:
    if isinstance(e, Placement):
        return slicing.subject(e.tenant, "placement")
    if isinstance(e, JobReleased):
        return slicing.subject(e.tenant, "released")
    if isinstance(e, PodShares):
        return telemetry.pod_share(e.node)
    if isinstance(e, NodeInventory):
        return telemetry.inventory(e.node)
    assert isinstance(e, GpuSampleBatch)
    return telemetry.sample(e.node)


def _workload(t0: datetime) -> tuple[list[Event], GpuSampleBatch]:
    def at(s: float) -> datetime:
        return t0 + timedelta(seconds=s)

    inv = NodeInventory(
        id=_uid(1), at=at(0), node=NODE, cpu_milli=1000, memory_mib=1024,
        gpus=[GpuInfo(index=0, model="H100", mem_total_mib=81_559)],
    )  # fmt: skip
    places = [
        Placement(
            id=_uid(10 + i),
            at=at(0),
            job_id=job,
            tenant="acme",
            node=NODE,
            gpu_model="H100",
            kind=PlacementKind.SHARED,
            gpus=[GpuAssignment(index=0, milli=500)],
        )
        for i, job in enumerate(("a", "b"))
    ]
    # One reading per minute of the first window: a at 60 %, b at 10 % of the GPU.
    shares = [
        PodShares(
            id=_uid(100 + m),
            at=at(60 * m + 60),
            node=NODE,
            window_start=at(60 * m),
            shares=[
                PodShare(
                    gpu_index=0,
                    pod_uid=f"uid-{j}",
                    tenant="acme",
                    job_id=j,
                    sm_share=v,
                    mem_share=0.1,
                )
                for j, v in (("a", 0.6), ("b", 0.1))
            ],
        )
        for m in range(5)
    ]
    samples = [
        GpuSampleBatch(id=_uid(200 + m), at=at(60 * m + 30), node=NODE,
                       gpus=[GpuSample(index=0, sm_active=0.7, mem_used_mib=20_000)])
        for m in range(5)
    ]  # fmt: skip
    ends = [
        JobReleased(
            id=_uid(300 + i),
            at=at(CONFIG.window_s),
            job_id=job,
            tenant="acme",
            outcome=EndOutcome.FINISHED,
        )
        for i, job in enumerate(("a", "b"))
    ]
    closer = GpuSampleBatch(
        id=_uid(400), at=at(3 * CONFIG.window_s), node=NODE, gpus=[GpuSample(index=0, sm_active=0)]
    )
    return [inv, *places, *shares, *samples, *ends], closer


async def test_job_reports_carry_the_measured_and_the_allocation_bill(
    bus: Bus, server: NatsServer
) -> None:
    events, closer = _workload(_start())
    shares = [e for e in events if isinstance(e, PodShares)]
    forged = PodShares(
        id=_uid(500), at=shares[0].at, node="h-2", window_start=shares[0].window_start,
        shares=shares[0].shares,
    )  # fmt: skip
    half = len(events) // 2
    async with serving(_ledger(server.url, "measured")) as service:
        for e in events[:half]:
            await bus.publish(_subject(e), e)
        await caught_up(bus, service, half)
    # A restart half way: the replica resumes from its checkpoint and replays the rest.
    async with serving(_ledger(server.url, "measured")) as service:
        for e in events[half:]:
            await bus.publish(_subject(e), e)
        await bus.js.publish(  # a re-send after the duplicate window: the same id, counted once
            telemetry.pod_share(NODE), (await read_all(bus, "SEEDANCE_TELEMETRY",
                                                       telemetry.pod_share(NODE)))[0].data,
        )  # fmt: skip
        await bus.publish(telemetry.pod_share(NODE), forged)  # h-2's reading on h-1's subject
        await bus.publish(_subject(closer), closer)
        await caught_up(bus, service, len(events) + 3)
        totals = service.replica.totals()
        clock_ms = service.replica.clock_ms

    assert clock_ms is not None
    expected = core.recompute(ledger_inputs([*events, closer], BOOK), BOOK, clock_ms, CONFIG)
    assert totals == expected
    reports = {
        r.job_id: r
        for r in (decode(m.data) for m in await read_all(bus, "SEEDANCE_COSTS"))
        if isinstance(r, JobCostReport)
    }
    # H100 $6.88/GPU-hour, 5 minutes: a used 60 %, b 10 %; each held half by allocation.
    assert reports["a"].cost_micro_usd == 344_000
    assert reports["b"].cost_micro_usd == 57_333
    assert reports["a"].allocation_cost_micro_usd == reports["b"].allocation_cost_micro_usd
    assert reports["a"].allocation_cost_micro_usd == 286_667
    letters = [
        decode(m.data, DeadLetter)
        for m in await read_all(bus, "SEEDANCE_DLQ", "seedance.dlq.cost-ledger")
    ]
    assert [d.error_kind for d in letters] == ["subject_mismatch"]
    assert "seedance.telemetry.h-2.pod_share" in letters[0].reason
