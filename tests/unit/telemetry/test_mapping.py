"""Mapping to the bus events, placement shares, the replay source, and the settings' checks."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from seedance.core import VirtualClock
from seedance.core.errors import RetryableError
from seedance.core.settings import SettingsError, load_settings
from seedance.events import decode, encode, new_event_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.events.telemetry import GpuSampleBatch
from seedance.events.telemetry import NodeState as NodeStateWire
from seedance.events.tokens import kube_node_token
from seedance.telemetry_collector.fleet import GPU_MODELS, FleetNode, FleetSim
from seedance.telemetry_collector.mapping import (
    NOT_CARRIED,
    gpu_health_event,
    inventory_event,
    nvlink_domains,
    placement_shares,
    sample_batch_event,
    xid_of,
)
from seedance.telemetry_collector.sample import (
    GpuInventory,
    GpuLink,
    GpuSample,
    HealthChange,
    NodeInventory,
    NodeSample,
)
from seedance.telemetry_collector.settings import CollectorSettings
from seedance.telemetry_collector.sources import ReplaySource, build_source

AT = datetime(2026, 3, 1, tzinfo=UTC)


def test_ratios_become_percent_where_the_event_says_percent_and_absent_stays_absent() -> None:
    g = GpuSample(
        index=0,
        uuid="GPU-a",
        mem_used_mib=100.5,
        gpu_util_ratio=0.13,
        mem_util_ratio=0.4,
        sm_active_ratio=0.00015,
        sm_clock_mhz=1980,
        clock_event_reasons=4,
    )
    ev = sample_batch_event(NodeSample(node="n1", sampled_at_unix_s=0.0, gpus=(g,)), AT)
    out = decode(encode(ev), GpuSampleBatch).gpus[0]
    assert (out.util_gpu_pct, out.util_mem_pct) == (13.0, 40.0)
    assert out.sm_active == 0.00015  # a ratio in the event too
    assert (out.sm_clock_mhz, out.throttle_reasons, out.mem_used_mib) == (1980.0, 4, 100.5)
    # Absent fields are None on the wire, never zero.
    assert (out.power_w, out.energy_j, out.tensor_active, out.temp_c) == (None, None, None, None)
    assert ev.simulated is False


def test_nvlink_domains_join_linked_gpus_and_leave_unknown_as_none() -> None:
    gpus = [
        GpuInventory(index=0, uuid="a", nvlink_links_active=2),
        GpuInventory(index=1, uuid="b", nvlink_links_active=2),
        GpuInventory(index=2, uuid="c", nvlink_links_active=0),
        GpuInventory(index=3, uuid="d"),
    ]
    links = [GpuLink(gpu_a=0, gpu_b=1, nvlink_links=2), GpuLink(gpu_a=0, gpu_b=2, nvlink_links=0)]
    d = nvlink_domains("n", gpus, links)
    assert d[0] == d[1]
    assert d[2] not in (None, d[0])
    assert d[3] is None


def test_inventory_event_carries_host_resources_and_names_unreadable_gpus() -> None:
    inv = NodeInventory(
        node="n",
        gpus=(
            GpuInventory(index=0, uuid="a", model="NVIDIA H200", mem_total_mib=143771.4),
            GpuInventory(index=1, uuid="lost-1", healthy=False),
        ),
    )
    ev = inventory_event(inv, AT, cpu_milli=16000, memory_mib=128000, pool="p1")
    assert (ev.cpu_milli, ev.memory_mib, ev.pool) == (16000, 128000, "p1")
    assert [(g.model, g.mem_total_mib) for g in ev.gpus] == [
        ("NVIDIA H200", 143771),
        ("unknown", 0),
    ]


def test_health_event_reads_the_xid_from_the_reasons() -> None:
    change = HealthChange(
        node="n", index=1, uuid="u", healthy=False, reasons=("xid_79",), at_unix_s=0.0
    )
    ev = gpu_health_event(change, AT)
    assert (ev.gpu_index, ev.healthy, ev.xid, ev.reason) == (1, False, 79, "xid_79")
    assert xid_of(("gpu_lost",)) is None
    back = HealthChange(node="n", index=1, uuid="u", healthy=True, reasons=(), at_unix_s=1.0)
    assert gpu_health_event(back, AT).reason == "recovered"


def test_shares_group_by_milli_and_memory_follows_share_unless_the_job_asks() -> None:
    total, free = [16000.0, 16000.0, 16000.0], [16000.0, 16000.0, 3000.0]
    gpus = [GpuAssignment(index=0, milli=500), GpuAssignment(index=1, milli=500)]
    (s,) = placement_shares(gpus, total, free)
    assert (s.gpu_indices, s.gpu_milli, s.mem_mib_per_gpu) == ((0, 1), 500, 8000.0)
    (s,) = placement_shares(gpus, total, free, gpu_mem_mib=4000)
    assert s.mem_mib_per_gpu == 4000.0
    # Capped by what is free: never more than the GPU has left.
    (s,) = placement_shares([GpuAssignment(index=2, milli=1000)], total, free)
    assert s.mem_mib_per_gpu == 3000.0
    mixed = placement_shares(
        [GpuAssignment(index=0, milli=1000), GpuAssignment(index=1, milli=250)], total, free
    )
    assert [(m.gpu_indices, m.gpu_milli) for m in mixed] == [((0,), 1000), ((1,), 250)]
    with pytest.raises(ValueError, match="gpu index 5"):
        placement_shares([GpuAssignment(index=5)], total, free)


def placement(job: str, node: str, *gpus: tuple[int, int], tenant: str = "acme") -> Placement:
    return Placement(
        id=new_event_id(),
        at=AT,
        job_id=job,
        tenant=tenant,
        node=node,
        kind=PlacementKind.SHARED,
        gpus=[GpuAssignment(index=i, milli=m) for i, m in gpus],
    )


def test_replay_source_applies_once_retries_when_held_and_releases_per_tenant() -> None:
    src = ReplaySource(FleetSim([FleetNode("n1", "T4", 2, 8000, 32768)]), VirtualClock())
    assert src.apply(placement("j", "n1", (0, 600))) == "applied"
    assert src.apply(placement("j", "n1", (0, 600))) == "duplicate"
    assert src.apply(placement("x", "elsewhere", (0, 600))) == "foreign_node"
    assert src.apply(placement("cpu", "n1")) == "no_gpus"
    # Same job id, other tenant: another job. GPU 0 is still 600 milli held.
    with pytest.raises(RetryableError):
        src.apply(placement("j", "n1", (0, 600), tenant="other"))
    assert src.fleet.free_milli("n1") == [400, 1000]
    assert not src.release("other", "j")
    assert src.release("acme", "j")
    assert src.fleet.free_milli("n1") == [1000, 1000]
    assert src.apply(placement("j", "n1", (0, 600), tenant="other")) == "applied"
    (inv,) = src.inventories()
    assert (inv.cpu_milli, inv.memory_mib, inv.inventory.simulated) == (8000, 32768, True)


def test_replay_source_gives_a_share_its_part_of_the_gpu_memory() -> None:
    # No tenant job event is read (trusted facts only): the share's part of the GPU's memory.
    src = ReplaySource(FleetSim([FleetNode("n1", "T4", 2)]), VirtualClock())
    src.apply(placement("j", "n1", (1, 500)))
    total = GPU_MODELS["T4"].mem_total_mib
    assert src.fleet.free_mem_mib("n1") == [total, total / 2]


def test_settings_errors_name_the_variable() -> None:
    env = {"SEEDANCE_TELEMETRY_COLLECTOR_NODE_CSV": "x.csv"}
    assert load_settings(CollectorSettings, "telemetry-collector", env).tick_s == 1.0
    bad = [
        ({**env, "SEEDANCE_TELEMETRY_COLLECTOR_TICK_S": "0"}, "TICK_S must be > 0"),
        ({}, "NODE_CSV is required"),
        ({"SEEDANCE_TELEMETRY_COLLECTOR_SOURCE": "dcgm"}, "source"),
        (
            {
                "SEEDANCE_TELEMETRY_COLLECTOR_SOURCE": "nvml",
                "SEEDANCE_TELEMETRY_COLLECTOR_NODE_NAME": "a.>",
            },
            "NODE_NAME",
        ),
        ({**env, "SEEDANCE_TELEMETRY_COLLECTOR_NVML_RECORDING": "r.json"}, "only to SOURCE=nvml"),
        ({**env, "SEEDANCE_TELEMETRY_COLLECTOR_HTTP_PORT": "70000"}, "HTTP_PORT"),
    ]
    for e, message in bad:
        with pytest.raises(SettingsError, match=message):
            load_settings(CollectorSettings, "telemetry-collector", e)
    # A Kubernetes node name, dots and all (the DaemonSet's spec.nodeName): the same node as
    # the token the bridge and the node agent write (`:` for `.`).
    nvml = {"SEEDANCE_TELEMETRY_COLLECTOR_SOURCE": "nvml"}
    name = {"SEEDANCE_TELEMETRY_COLLECTOR_NODE_NAME": "ip-10-0-0-7.ec2.internal"}
    settings = load_settings(CollectorSettings, "telemetry-collector", {**nvml, **name})
    assert kube_node_token(settings.node_name) == "ip-10-0-0-7:ec2:internal"


def test_build_source_names_missing_files(tmp_path: Path) -> None:
    clock = VirtualClock()
    with pytest.raises(ValueError, match=r"NODE_CSV='nope\.csv': no such file"):
        build_source(CollectorSettings(node_csv="nope.csv"), clock)
    empty = tmp_path / "cpu_only.csv"
    empty.write_text("sn,cpu_milli,memory_mib,gpu,model\ncpu-0,1000,1024,0,\n")
    with pytest.raises(ValueError, match="no GPU nodes"):
        build_source(CollectorSettings(node_csv=str(empty)), clock)
    with pytest.raises(ValueError, match="NVML_RECORDING"):
        build_source(
            CollectorSettings(source="nvml", node_name="n", nvml_recording="nope.json"), clock
        )


class _Reads:
    """A stand-in for a source struct that records which of its fields the mapping reads
    (structs inside it, like a node's GPUs, are stood in for too: ``every``)."""

    def __init__(self, real: msgspec.Struct) -> None:
        self._real = real
        self.read: set[str] = set()
        self.inner: list[_Reads] = []

    def __getattr__(self, name: str) -> object:
        self.read.add(name)
        value = getattr(self._real, name)
        if isinstance(value, tuple) and value and isinstance(value[0], msgspec.Struct):
            inner = tuple(_Reads(v) for v in value)
            self.inner.extend(inner)
            return inner
        return value


def _populated(cls: type[msgspec.Struct], **given: Any) -> Any:
    """An instance with every optional scalar set to something other than its default."""
    by_type: dict[str, Any] = {"float | None": 0.5, "int | None": 3, "bool | None": True}
    values = {
        f.name: by_type[str(f.type)]
        for f in msgspec.structs.fields(cls)
        if f.name not in given and str(f.type) in by_type
    }
    return cls(**values, **given)


def _left_at_default(event: msgspec.Struct) -> set[str]:
    return {
        f.name
        for f in msgspec.structs.fields(event)
        if f.default is not msgspec.NODEFAULT and getattr(event, f.name) == f.default
    }


def _unaccounted(cls: type, refused: dict[str, str], read: set[str]) -> set[str]:
    """Fields of ``cls`` neither read by the mapping nor refused with a reason."""
    names = {f.name for f in msgspec.structs.fields(cls)}
    assert all(refused.values()), f"{cls.__name__}: a reason is empty"
    assert read.isdisjoint(refused), f"{cls.__name__}: read and refused: {read & set(refused)}"
    assert set(refused) <= names, f"{cls.__name__}: refuses what it lacks: {set(refused) - names}"
    return names - read - set(refused)


def test_every_sample_field_is_carried_or_refused_with_a_reason() -> None:
    gpu = _populated(GpuSample, index=0, uuid="GPU-a", healthy=False)
    node = _Reads(NodeSample(node="n1", sampled_at_unix_s=0.0, gpus=(gpu,), simulated=True))
    event = sample_batch_event(node, AT)  # type: ignore[arg-type]
    (gpu_reads,) = node.inner
    assert _unaccounted(NodeSample, NOT_CARRIED[NodeSample], node.read) == set()
    assert _unaccounted(GpuSample, NOT_CARRIED[GpuSample], gpu_reads.read) == set()
    # And the other way: every field of the wire event is filled from the sample.
    assert _left_at_default(event) == set()
    assert _left_at_default(event.gpus[0]) == set()


def test_every_inventory_and_health_field_is_carried_or_refused_with_a_reason() -> None:
    gpu = _populated(GpuInventory, index=0, uuid="a", model="NVIDIA H200", mig_capable=True)
    link = GpuLink(gpu_a=0, gpu_b=0, common_ancestor="single", nvlink_links=2)
    inv = _Reads(NodeInventory(node="n", gpus=(gpu,), links=(link,), simulated=True))
    event = inventory_event(
        inv,  # type: ignore[arg-type]
        AT,
        cpu_milli=1,
        memory_mib=1,
        pool="p",
        state=NodeStateWire.CORDONED,
    )

    def read_of(cls: type) -> set[str]:  # a GPU is read twice: for its domain, then itself
        return set().union(*(r.read for r in inv.inner if type(r._real) is cls))

    assert _unaccounted(NodeInventory, NOT_CARRIED[NodeInventory], inv.read) == set()
    assert _unaccounted(GpuInventory, NOT_CARRIED[GpuInventory], read_of(GpuInventory)) == set()
    assert _unaccounted(GpuLink, NOT_CARRIED[GpuLink], read_of(GpuLink)) == set()
    assert _left_at_default(event) == set()
    assert _left_at_default(event.gpus[0]) == set()
    change = _Reads(
        HealthChange(node="n", index=0, uuid="u", healthy=False, reasons=("xid_79",), at_unix_s=0)
    )
    health = gpu_health_event(change, AT)  # type: ignore[arg-type]
    assert _unaccounted(HealthChange, NOT_CARRIED[HealthChange], change.read) == set()
    assert _left_at_default(health) == set()


def test_a_field_added_without_saying_whether_it_is_carried_fails_the_check() -> None:
    class Wider(GpuSample, frozen=True, kw_only=True):
        fan_speed_ratio: float | None = None

    node = _Reads(NodeSample(node="n1", sampled_at_unix_s=0.0, gpus=(Wider(index=0, uuid="a"),)))
    sample_batch_event(node, AT)  # type: ignore[arg-type]
    (gpu_reads,) = node.inner
    assert _unaccounted(Wider, NOT_CARRIED[GpuSample], gpu_reads.read) == {"fan_speed_ratio"}
