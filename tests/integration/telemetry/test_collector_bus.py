"""The telemetry collector against a real nats-server: replayed fleet, recorded NVML, /metrics.

Each test runs its own collector in-process under its shipped user, with unique node names, on
a server of its own (``nats_url``): the collector binds the catalogue's durables, as deployed, so
tests do not see each other's fleets or steal each other's placements.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.events import new_event_id
from seedance.events.codec import decode
from seedance.events.dlq import DeadLetter
from seedance.events.node_permissions import FLEET_REPLAYER
from seedance.events.slicing import (
    EndOutcome,
    GpuAssignment,
    JobReleased,
    Placement,
    PlacementKind,
    Preempted,
)
from seedance.events.subjects import dlq, slicing, telemetry
from seedance.events.telemetry import GpuHealth, GpuSampleBatch, NodeInventory
from seedance.telemetry_collector.fleet import GPU_MODELS
from seedance.telemetry_collector.service import CollectorService
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import build_source
from seedance.testing.identities import as_user
from seedance.testing.waits import eventually, next_matching
from tests.conftest import own_server_url, serving
from tests.unit.telemetry.constructed import h100_nvlink_xid

RECORDINGS = Path(__file__).resolve().parents[2] / "unit" / "telemetry" / "recordings"
H200_RECORDING = RECORDINGS / "h200_recording.json"
T4 = GPU_MODELS["T4"]
E = TypeVar("E")


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_server_url(request)


@contextlib.asynccontextmanager
async def running(nats_url: str, settings: CollectorSettings) -> AsyncIterator[CollectorService]:
    clock = WallClock()
    # A replay as the replaying collector's user (the shipped telemetry-collector, a real
    # node's, follows no decision); NVML as the collector's own.
    bus_settings = BusSettings(url=nats_url, name="test-collector")
    if settings.source == "replay":
        bus_settings = as_user(nats_url, FLEET_REPLAYER, name="test-collector")
    runtime = ServiceRuntime("telemetry-collector", bus_settings, http_port=0)
    svc = CollectorService(runtime, build_source(settings, clock), clock, settings)
    async with serving(svc, 10):
        yield svc


class Watch:
    """An ordered consumer on one subject, read until an event satisfies a predicate."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub

    @classmethod
    async def open(cls, bus: Bus, subject: str) -> Watch:
        return cls(await bus.js.subscribe(subject, ordered_consumer=True))

    async def until(self, types: type[E], pred: Callable[[E], bool], timeout_s: float = 15.0) -> E:
        # The collector publishes every tick: a read bounded by one cancel could read on.
        msg = await next_matching(
            self.sub, lambda m: pred(decode(m.data, types)), timeout_s, what=types.__name__
        )
        return decode(msg.data, types)

    async def close(self) -> None:
        await self.sub.unsubscribe()


async def http_get(port: int, path: str) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    body = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    await writer.wait_closed()
    return body.decode()


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class OneNode:
    """The replayed node of the placement test: two T4s, watched, and the two tenants whose
    placements it follows (each check below is one step of that test, in order)."""

    bus: Bus
    node: str
    tenant: str
    other: str
    samples: Watch


async def _starts_idle(inventory: Watch, fleet: OneNode) -> None:
    inv = await inventory.until(NodeInventory, lambda e: True)
    assert (inv.simulated, inv.cpu_milli, inv.memory_mib) == (True, 32000, 131072)
    assert [(g.index, g.model, g.mem_total_mib) for g in inv.gpus] == [
        (0, "T4", int(T4.mem_total_mib)),
        (1, "T4", int(T4.mem_total_mib)),
    ]
    idle = await fleet.samples.until(GpuSampleBatch, lambda e: True)
    assert idle.simulated
    assert [g.power_w for g in idle.gpus] == [T4.idle_w, T4.idle_w]
    assert idle.gpus[0].util_gpu_pct == 0.0
    assert idle.gpus[0].sm_clock_mhz is None


async def _half_a_gpu_takes_half_its_memory(fleet: OneNode) -> None:
    # Half of GPU 1, no memory request: half of its memory.
    await fleet.bus.publish(
        slicing.subject(fleet.tenant, "placement"),
        Placement(
            id=new_event_id(), at=now(), job_id="half", tenant=fleet.tenant, node=fleet.node,
            gpu_model="T4", kind=PlacementKind.SHARED, gpus=[GpuAssignment(index=1, milli=500)],
        ),
    )  # fmt: skip
    busy = await fleet.samples.until(GpuSampleBatch, lambda e: e.gpus[1].util_gpu_pct == 50.0)
    g0, g1 = busy.gpus
    assert g1.mem_used_mib == pytest.approx(T4.mem_total_mib / 2, abs=0.01)
    assert g1.sm_active == pytest.approx(0.45)  # half a GPU at the 0.9 busy ratio
    assert T4.idle_w < g1.power_w < T4.tdp_w
    assert (g0.mem_used_mib, g0.power_w) == (0.0, T4.idle_w)


async def _another_tenants_job_of_the_same_id_takes_gpu_0(fleet: OneNode) -> None:
    # Another tenant's job of the same id, whole GPU 0: its part is all of the memory
    # (no tenant job event is read, so no memory request: the share's part).
    await fleet.bus.publish(
        slicing.subject(fleet.other, "placement"),
        Placement(
            id=new_event_id(), at=now(), job_id="half", tenant=fleet.other, node=fleet.node,
            kind=PlacementKind.WHOLE, gpus=[GpuAssignment(index=0, milli=1000)],
        ),
    )  # fmt: skip
    both = await fleet.samples.until(GpuSampleBatch, lambda e: e.gpus[0].util_gpu_pct == 100.0)
    assert both.gpus[0].mem_used_mib == pytest.approx(T4.mem_total_mib, abs=0.01)
    assert both.gpus[0].power_w == pytest.approx(T4.idle_w + (T4.tdp_w - T4.idle_w) * 0.9)


async def _a_forged_release_is_dead_lettered(fleet: OneNode) -> None:
    # A release on the other tenant's subject naming this tenant: dead-lettered by the
    # consumer (subject vs payload), nothing released.
    letters = await Watch.open(fleet.bus, dlq.subject("telemetry-collector"))
    forged = JobReleased(
        id=new_event_id(), at=now(), job_id="half", tenant=fleet.tenant,
        outcome=EndOutcome.FINISHED,
    )  # fmt: skip
    await fleet.bus.publish(slicing.subject(fleet.other, "released"), forged)
    try:
        letter = await letters.until(DeadLetter, lambda d: forged.id.encode() in d.payload)
    finally:
        await letters.close()
    assert letter.error_kind == "tenant_mismatch"


async def _release_and_preemption_free_the_gpus(fleet: OneNode) -> None:
    # This tenant's job is released (the slicer's JobReleased ends it, keyed by
    # (tenant, job): the other tenant's "half" keeps GPU 0), the other's is preempted.
    await fleet.bus.publish(
        slicing.subject(fleet.tenant, "released"),
        JobReleased(id=new_event_id(), at=now(), job_id="half", tenant=fleet.tenant,
                    outcome=EndOutcome.FINISHED),
    )  # fmt: skip
    one = await fleet.samples.until(GpuSampleBatch, lambda e: e.gpus[1].util_gpu_pct == 0.0)
    assert one.gpus[0].util_gpu_pct == 100.0
    await fleet.bus.publish(
        slicing.subject(fleet.other, "preempted"),
        Preempted(id=new_event_id(), at=now(), job_id="half", tenant=fleet.other, node=fleet.node),
    )
    back = await fleet.samples.until(
        GpuSampleBatch, lambda e: all(g.util_gpu_pct == 0.0 for g in e.gpus)
    )
    assert [g.mem_used_mib for g in back.gpus] == [0.0, 0.0]
    assert [g.power_w for g in back.gpus] == [T4.idle_w, T4.idle_w]
    assert back.gpus[0].energy_j > 0  # energy integrated over the busy ticks


async def test_replayed_fleet_follows_placements_and_falls_back(
    nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    node = f"tw-{unique}-0"
    csv = tmp_path / "nodes.csv"
    csv.write_text(f"sn,cpu_milli,memory_mib,gpu,model\n{node},32000,131072,2,T4\n")
    settings = CollectorSettings(source="replay", node_csv=str(csv), tick_s=0.1, http_port=0)
    samples = await Watch.open(bus, telemetry.sample(node))
    inventory = await Watch.open(bus, telemetry.inventory(node))
    fleet = OneNode(bus, node, tenant=f"t{unique}", other=f"o{unique}", samples=samples)
    try:
        async with running(nats_url, settings) as svc:
            await _starts_idle(inventory, fleet)
            await _half_a_gpu_takes_half_its_memory(fleet)
            await _another_tenants_job_of_the_same_id_takes_gpu_0(fleet)
            await _a_forged_release_is_dead_lettered(fleet)
            await _release_and_preemption_free_the_gpus(fleet)
            counts = {
                s.labels["outcome"]: s.value
                for m in svc.metrics.placements_total.collect()
                for s in m.samples
                if s.name.endswith("_total")
            }
            assert counts["applied"] == 2
            assert counts["released"] == 2
    finally:
        await samples.close()
        await inventory.close()


async def test_recorded_nvml_publishes_samples_and_an_xid_as_unhealthy(
    nats_url: str, bus: Bus, tmp_path: Path, unique: str
) -> None:
    node = f"nv-{unique}"
    recording = tmp_path / "h100_nvlink_xid.json"
    recording.write_text(json.dumps(h100_nvlink_xid()))
    settings = CollectorSettings(
        source="nvml",
        node_name=node,
        nvml_recording=str(recording),
        tick_s=0.1,
        slow_interval_s=0.1,
        costly_interval_s=0.1,
        http_port=0,
    )
    samples = await Watch.open(bus, telemetry.sample(node))
    health = await Watch.open(bus, telemetry.health(node))
    inventory = await Watch.open(bus, telemetry.inventory(node))
    try:
        async with running(nats_url, settings):
            inv = await inventory.until(NodeInventory, lambda e: True)
            assert not inv.simulated
            assert inv.cpu_milli > 0
            assert inv.memory_mib > 0
            assert [g.model for g in inv.gpus] == ["NVIDIA H100 NVL"] * 2
            # The two boards are bridged by NVLink: one domain.
            domains = {g.nvlink_domain for g in inv.gpus}
            assert len(domains) == 1
            assert None not in domains

            first = await samples.until(GpuSampleBatch, lambda e: True)
            assert not first.simulated
            assert (first.gpus[0].util_gpu_pct, first.gpus[0].power_w) == (97.0, 352.12)
            # Temperature and clock-event reasons come with the first slow read merged.
            merged = await samples.until(GpuSampleBatch, lambda e: e.gpus[0].temp_c is not None)
            g = merged.gpus[0]
            assert (g.util_gpu_pct, g.util_mem_pct, g.power_w, g.temp_c) == (97.0, 41.0, 352.12, 63)
            assert g.mem_used_mib == pytest.approx(20480.0)
            assert g.throttle_reasons == 0x4

            event = await health.until(GpuHealth, lambda e: True)
            assert (event.gpu_index, event.healthy, event.xid) == (1, False, 79)
            assert "xid_79" in event.reason
            # The collector carries on: later samples still come, GPU 1 marked unhealthy,
            # GPU 0 healthy with its GPM activity (a 0..1 ratio) from the slow path.
            later = await samples.until(
                GpuSampleBatch, lambda e: not e.gpus[1].healthy and e.gpus[0].sm_active is not None
            )
            assert later.gpus[0].healthy
            assert later.gpus[0].sm_active == pytest.approx(0.912)
    finally:
        for w in (samples, health, inventory):
            await w.close()


async def test_metrics_expose_dcgm_names_and_the_collector_own(
    nats_url: str, bus: Bus, unique: str
) -> None:
    node = f"h200-{unique}"
    settings = CollectorSettings(
        source="nvml",
        node_name=node,
        nvml_recording=str(H200_RECORDING),
        tick_s=0.1,
        slow_interval_s=0.2,
        costly_interval_s=0.2,
        http_port=0,
    )
    samples = await Watch.open(bus, telemetry.sample(node))
    try:
        async with running(nats_url, settings) as svc:
            sample = await samples.until(GpuSampleBatch, lambda e: e.gpus[0].energy_j is not None)
            assert sample.gpus[0].mem_total_mib == pytest.approx(143771, rel=0.01)
            port = svc._rt.http_port
            assert port

            async def scraped() -> bool:
                text = await http_get(port, "/metrics")
                return "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text

            await eventually(scraped, timeout_s=15)
            text = await http_get(port, "/metrics")
    finally:
        await samples.close()
    fb_used = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FB_USED{")]
    assert len(fb_used) == 1, fb_used
    line = fb_used[0]
    assert f'Hostname="{node}"' in line
    assert 'gpu="0"' in line
    assert 'device="nvidia0"' in line
    assert 'modelName="NVIDIA H200"' in line
    assert 'UUID="GPU-' in line
    for name in ("DCGM_FI_DEV_POWER_USAGE{", "DCGM_FI_DEV_GPU_TEMP{", "DCGM_FI_DEV_GPU_UTIL{"):
        assert name in text
    ticks = [ln for ln in text.splitlines() if ln.startswith("seedance_telemetry_collector_ticks")]
    assert any('outcome="ok"' in ln and float(ln.rsplit(" ", 1)[1]) >= 1 for ln in ticks), ticks
    assert "seedance_telemetry_collector_gpu_samples_published_total" in text
    assert "seedance_telemetry_collector_tick_duration_seconds_bucket" in text
    assert "seedance_telemetry_collector_nvml_errors_total 0.0" in text
