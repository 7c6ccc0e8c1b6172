"""Simulated GPUs of a development cluster (``core.simulated``): devices in NVML's UUID form,
derived from the node's name (every agent of the node agrees, across restarts); the node's
inventory with the model as NVML names it and its memory from the GPU identity; samples that
follow the slicer's placements on the node."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from seedance.events.base import new_event_id
from seedance.events.codec import decode, encode
from seedance.events.gpus import identify
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.telemetry import GpuSampleBatch, NodeInventory
from seedance.node_agent.core.simulated import SimulatedGpus, simulated_uuid

T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)
NVML_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_the_devices_are_nvml_uuids_of_this_node_stable_across_restarts() -> None:
    a = SimulatedGpus(node="kind-worker", model="NVIDIA A100-SXM4-80GB", count=2).devices()
    again = SimulatedGpus(node="kind-worker", model="NVIDIA A100-SXM4-80GB", count=2).devices()
    other = SimulatedGpus(node="kind-worker2", model="NVIDIA A100-SXM4-80GB", count=2).devices()
    assert a == again
    assert sorted(a.gpus) == [0, 1]
    assert all(NVML_UUID.match(u) for u in a.gpus.values())
    assert len(set(a.gpus.values())) == 2
    assert not set(a.gpus.values()) & set(other.gpus.values())
    assert a.gpus[1] == simulated_uuid("kind-worker", 1)
    assert a.mig == {}


def test_the_inventory_names_the_model_as_nvml_does_and_resolves_it() -> None:
    gpus = SimulatedGpus(node="kind.worker", model="NVIDIA H100 80GB HBM3", count=3, pool="dev")
    inv = gpus.inventory(T0, cpu_milli=7910, memory_mib=32128)
    assert decode(encode(inv), NodeInventory) == inv
    assert (inv.node, inv.pool, inv.simulated) == ("kind:worker", "dev", True)
    assert (inv.cpu_milli, inv.memory_mib) == (7910, 32128)
    assert [g.model for g in inv.gpus] == ["NVIDIA H100 80GB HBM3"] * 3
    assert identify(inv.gpus[0].model).model == "H100-SXM5-80GB"
    assert [g.mem_total_mib for g in inv.gpus] == [80 * 1024] * 3
    assert [g.uuid for g in inv.gpus] == list(gpus.devices().gpus.values())
    # A retried publish of the same inventory has the same id (the stream drops it).
    assert gpus.inventory(T0, cpu_milli=7910, memory_mib=32128).id == inv.id


def placed(kind: PlacementKind, *gpus: GpuAssignment) -> Placement:
    return Placement(
        id=new_event_id(), at=T0, job_id="j", tenant="acme", node="kind-worker", kind=kind,
        gpus=list(gpus),
    )  # fmt: skip


def test_samples_follow_the_placements_on_the_node() -> None:
    gpus = SimulatedGpus(node="kind-worker", model="Tesla T4", count=3)
    total = 16 * 1024
    batch = gpus.samples(
        T0,
        [
            placed(PlacementKind.WHOLE, GpuAssignment(index=0)),
            placed(PlacementKind.SHARED, GpuAssignment(index=1, milli=250)),
            placed(PlacementKind.SHARED, GpuAssignment(index=1, milli=500)),
            placed(PlacementKind.WHOLE, GpuAssignment(index=7)),  # not a GPU of the node
        ],
    )
    assert decode(encode(batch), GpuSampleBatch) == batch
    assert (batch.node, batch.simulated) == ("kind-worker", True)
    got = [(g.index, g.util_gpu_pct, g.mem_used_mib, g.mem_total_mib) for g in batch.gpus]
    assert got == [
        (0, 100.0, float(total), float(total)),
        (1, 75.0, float(total * 750 // 1000), float(total)),
        (2, 0.0, 0.0, float(total)),
    ]
    assert all(g.power_w is None and g.energy_j is None for g in batch.gpus)  # not simulated


@pytest.mark.parametrize("model", ["NVIDIA B999", "", "G7"])
def test_a_model_the_identity_does_not_know_is_refused(model: str) -> None:
    with pytest.raises(ValueError, match="no GPU model Seedance knows"):
        SimulatedGpus(node="n", model=model, count=1)
