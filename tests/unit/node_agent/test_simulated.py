"""Simulated GPUs of a development cluster (``core.simulated``): devices in NVML's UUID form,
derived from the node's name (every agent of the node agrees, across restarts); the node's
inventory with the model as NVML names it and its memory from the GPU identity; samples that
follow the slicer's placements on the node."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
import pytest
from prometheus_client import CollectorRegistry

from seedance.core.clock import VirtualClock
from seedance.events.base import new_event_id
from seedance.events.codec import decode, encode
from seedance.events.gpus import identify
from seedance.events.slicing import (
    GpuAssignment,
    MigInstanceChange,
    MigLayoutPlan,
    Placement,
    PlacementKind,
)
from seedance.events.telemetry import GpuSampleBatch, NodeInventory
from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.core.simulated import (
    SimulatedGpus,
    parse_mig_layout,
    simulated_mig_uuid,
    simulated_uuid,
)
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.mig import MigApplier, MigOutcome
from seedance.node_agent.service import advertised
from seedance.node_agent.simulated import SimulatedTelemetry

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


def test_the_ids_are_no_other_nodes_to_compute() -> None:
    """Random, with the event's time in their time bits: derived from the node and the
    millisecond, another node could publish them first on its own subject and have these
    dropped from the telemetry stream (docs/security.md, "Nats-Msg-Id"). A re-send is of the
    same event (``SimulatedTelemetry``), so it keeps its id."""
    gpus = SimulatedGpus(node="kind-worker", model="NVIDIA A100-SXM4-80GB", count=2)
    ms = int(T0.timestamp() * 1000)
    invs = [gpus.inventory(T0), gpus.inventory(T0)]
    batches = [gpus.samples(T0, []), gpus.samples(T0, [])]
    for a, b in (invs, batches):
        assert a.id != b.id
        assert int(a.id.replace("-", "")[:12], 16) == ms


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


def mig_node() -> SimulatedGpus:
    return SimulatedGpus(
        node="kind-worker", model="NVIDIA A100-SXM4-80GB", count=3, mig_gpus=1,
        mig_layout=parse_mig_layout("1g.10gb:0,1,2,3,4,5,6"),
    )  # fmt: skip


def test_the_last_gpus_are_in_mig_mode_cut_into_the_layout_and_served_as_instances() -> None:
    gpus = mig_node()
    d = gpus.devices()
    assert d.mig_enabled == frozenset({2})
    assert sorted(d.mig) == [(d.gpus[2], "1g.10gb", s) for s in range(7)]
    assert d.mig[(d.gpus[2], "1g.10gb", 3)] == simulated_mig_uuid("kind-worker", 2, "1g.10gb", 3)
    assert all(u.startswith("MIG-") for u in d.mig.values())
    inv = gpus.inventory(T0)
    assert [(g.mig_capable, g.mig_enabled) for g in inv.gpus] == [(False, False)] * 2 + [
        (True, True)
    ]
    # NVIDIA's mixed strategy: whole GPUs only where not in MIG mode; instances as
    # seedance.io/mig (any profile) and nvidia.com/mig-<profile>.
    assert [p.uuid for p in advertised("nvidia.com/gpu", d)] == [d.gpus[0], d.gpus[1]]
    assert len(advertised("seedance.io/mig", d)) == 7
    assert len(advertised("nvidia.com/mig-1g.10gb", d)) == 7
    assert advertised("nvidia.com/mig-3g.40gb", d) == []


def test_a_slicer_plan_re_cuts_a_simulated_mig_gpu_through_the_nvml_path() -> None:
    gpus = mig_node()
    applier = MigApplier(gpus.mig, allocated=lambda gpu: [])
    plan = MigLayoutPlan(
        id=new_event_id(), at=T0, node="kind-worker", gpu_index=2,
        destroy=[MigInstanceChange(profile="1g.10gb", start_slot=s) for s in range(4, 7)],
        create=[MigInstanceChange(profile="3g.40gb", start_slot=4)],
    )  # fmt: skip
    assert applier.apply(plan).outcome is MigOutcome.APPLIED
    d = gpus.devices()
    assert sorted((p, s) for _g, p, s in d.mig) == [("1g.10gb", s) for s in range(4)] + [
        ("3g.40gb", 4)
    ]
    refused = MigApplier(gpus.mig, allocated=lambda gpu: []).apply(
        MigLayoutPlan(id=new_event_id(), at=T0, node="kind-worker", gpu_index=0)
    )
    assert refused.outcome is MigOutcome.REFUSED  # GPU 0 is not in MIG mode


@pytest.mark.parametrize(
    "text", ["1g.10gb", "1g.10gb:8", "1g.10gb:0,0", ":0", "1g.10gb:x"]
)  # fmt: skip
def test_a_mig_layout_that_does_not_read_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="MIG layout"):
        parse_mig_layout(text)


class _FlakyBus:
    """Refuses the first publish as a bus that is down would, then records each one."""

    def __init__(self) -> None:
        self.tried: list[NodeInventory] = []
        self.sent: list[NodeInventory] = []
        self._failures = 1

    async def publish(self, subject: str, event: NodeInventory) -> None:
        self.tried.append(event)
        if self._failures:
            self._failures -= 1
            raise nats.errors.TimeoutError
        self.sent.append(event)


class _Node:
    name = "kind-worker"

    async def get(self) -> dict[str, Any]:
        return {"status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}}


async def test_an_inventory_that_failed_is_re_sent_as_the_same_event() -> None:
    """Its id is random: a retry built anew would be a second inventory under another id, and
    the first, if stored after all, would not be dropped as its duplicate."""
    bus, clock = _FlakyBus(), VirtualClock(T0)
    gpus = SimulatedGpus(node="kind-worker", model="NVIDIA A100-SXM4-80GB", count=2)
    agent = SimulatedTelemetry(
        bus, gpus, _Node(), list,  # type: ignore[arg-type]  # fakes of the bus and the Node
        clock=clock, metrics=NodeAgentMetrics(CollectorRegistry()), sample_interval_s=5.0,
    )  # fmt: skip
    with pytest.raises(nats.errors.TimeoutError):
        await agent.publish_inventory()
    await clock.advance(5.0)  # the next tick
    await agent.publish_inventory()
    await clock.advance(5.0)
    await agent.publish_inventory()  # sent: the next one is new
    failed, first, again = bus.tried
    assert bus.sent == [first, again]
    assert first.id == failed.id
    assert first.at == T0
    assert first.cpu_milli == 8000
    assert again.id != first.id
    assert again.at == T0 + timedelta(seconds=10)


def test_a_media_extension_profile_is_served_under_the_device_plugin_s_resource_name() -> None:
    """A resource name has no ``+``: NVIDIA's device plugin serves ``1g.10gb+me`` as
    ``nvidia.com/mig-1g.10gb.me``, and an agent configured with that resource served nothing
    (it compared ``1g.10gb.me`` with NVML's ``1g.10gb+me``)."""
    d = NodeDevices(
        gpus={0: "GPU-0"},
        mig={("GPU-0", "1g.10gb+me", 0): "MIG-a", ("GPU-0", "1g.10gb", 1): "MIG-b"},
        mig_enabled=frozenset({0}),
    )
    assert [p.uuid for p in advertised("nvidia.com/mig-1g.10gb.me", d)] == ["MIG-a"]
    assert [p.uuid for p in advertised("nvidia.com/mig-1g.10gb", d)] == ["MIG-b"]
