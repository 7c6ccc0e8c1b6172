"""Exposition: dcgm-exporter's names, units and labels; absent fields export nothing."""

from __future__ import annotations

from constructed import a100_mig, h100_nvlink_xid
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.prometheus import DcgmExporterCollector
from seedance.telemetry_collector.recording import ReplayNvmlApi
from seedance.telemetry_collector.sample import GpuSample, NodeSample, merge_slow

LABELS = {"gpu", "UUID", "device", "modelName", "Hostname"}


def scrape(registry: CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def node_sample(recording: dict, host: str) -> tuple[NodeSample, object]:
    backend = NvmlBackend(host, ReplayNvmlApi(recording), costly_interval_s=0.0)
    inv = backend.inventory()
    backend.sample_slow(1.0)
    slow = {s.index: s for s in backend.sample_slow(2.0)}
    gpus = tuple(merge_slow(g, slow.get(g.index), 2.0) for g in backend.sample_fast())
    return NodeSample(node=host, sampled_at_unix_s=0.0, gpus=gpus), inv


def test_names_units_and_labels_match_dcgm_exporter() -> None:
    registry = CollectorRegistry()
    collector = DcgmExporterCollector(registry)
    sample, _ = node_sample(h100_nvlink_xid(), "host-b")
    collector.update(sample)
    m = scrape(registry)
    labels, value = m["DCGM_FI_DEV_FB_USED"][0]
    assert set(labels) == LABELS
    assert labels["gpu"] == "0"
    assert labels["device"] == "nvidia0"
    assert labels["modelName"] == "NVIDIA H100 NVL"
    assert labels["Hostname"] == "host-b"
    assert labels["UUID"].startswith("GPU-")
    assert value == 20480.0  # MiB
    assert m["DCGM_FI_DEV_POWER_USAGE"][0][1] == 352.12  # W
    assert m["DCGM_FI_DEV_GPU_UTIL"][0][1] == 97.0  # percent, as DCGM
    assert m["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0][1] == 5_000_352_120.0  # mJ
    assert m["DCGM_FI_PROF_SM_ACTIVE"][0][1] == 0.912  # ratio 0..1
    assert m["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"][0][1] == 0.889
    assert m["DCGM_FI_PROF_DRAM_ACTIVE"][0][1] == 0.171
    assert m["DCGM_FI_DEV_SM_CLOCK"][0][1] == 1785.0
    assert m["DCGM_FI_DEV_GPU_TEMP"][0][1] == 63.0
    assert {v for _, v in m["DCGM_FI_DEV_XID_ERRORS"]} == {79.0}
    assert len(m["DCGM_FI_DEV_FB_FREE"]) == 2  # one per GPU
    # Exactly dcgm-exporter's names: no "_total" or unit suffixes added.
    assert all(name.startswith("DCGM_FI_") for name in m)
    assert not any(name.endswith("_total") for name in m)


def test_absent_fields_are_not_exported_and_mig_gets_instance_labels() -> None:
    registry = CollectorRegistry()
    collector = DcgmExporterCollector(registry)
    sample, inv = node_sample(a100_mig(), "host-a")
    collector.update_inventory(inv)
    collector.update(sample)
    m = scrape(registry)
    assert "DCGM_FI_DEV_GPU_UTIL" not in m  # NotSupported under MIG: no zero stands in
    assert "DCGM_FI_PROF_SM_ACTIVE" not in m  # no GPM on Ampere
    used = m["DCGM_FI_DEV_FB_USED"]
    whole = [v for labels, v in used if "GPU_I_ID" not in labels]
    per_instance = {labels["GPU_I_ID"]: (labels["GPU_I_PROFILE"], v) for labels, v in used[1:]}
    assert whole == [5120.0]
    assert per_instance == {"1": ("20gb", 4096.0), "5": ("10gb", 1024.0)}


def test_many_nodes_and_forget() -> None:
    registry = CollectorRegistry()
    collector = DcgmExporterCollector(registry)
    for host in ("a", "b", "c"):
        g = GpuSample(index=0, uuid=f"SIM-{host}", model="T4", mem_used_mib=1.0)
        collector.update(NodeSample(node=host, sampled_at_unix_s=0.0, gpus=(g,), simulated=True))
    collector.forget("b")
    hosts = {labels["Hostname"] for labels, _ in scrape(registry)["DCGM_FI_DEV_FB_USED"]}
    assert hosts == {"a", "c"}
