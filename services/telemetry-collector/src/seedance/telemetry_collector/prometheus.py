"""Prometheus exposition with dcgm-exporter's metric names, units and labels.

Owns the mapping from ``GpuSample`` fields to dcgm-exporter series (``DCGM_FI_DEV_FB_USED`` in
MiB, ``DCGM_FI_DEV_POWER_USAGE`` in W, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` in mJ, the
``DCGM_FI_PROF_*`` ratios 0..1, ...) and their labels (``gpu``, ``UUID``, ``device``,
``modelName``, ``Hostname``; ``GPU_I_ID`` / ``GPU_I_PROFILE`` on MIG instances), so existing
Grafana dashboards work unchanged. This is the one place where Seedance's own metric naming
gives way to an existing convention. A field that is absent in the sample is not exported (no
zero stands in for "unknown"). It must not read NVML or the bus: the service hands it samples.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CollectorRegistry, Metric
from prometheus_client.registry import Collector

from seedance.telemetry_collector.sample import GpuSample, NodeInventory, NodeSample

__all__ = ["DCGM_GPU_METRICS", "DcgmExporterCollector"]

_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
_MIG_LABELS = (*_LABELS, "GPU_I_ID", "GPU_I_PROFILE")


def _pct(v: float | None) -> float | None:
    return None if v is None else round(v * 100.0, 3)


# name → (prometheus type, help as dcgm-exporter's default-counters.csv words it, value getter).
# dcgm-exporter types the energy and ECC totals as counters, but prometheus_client renames a
# counter family to ``<name>_total`` in the text format, which would break the names that
# dashboards query; they are exposed untyped under dcgm-exporter's exact names instead.
DCGM_GPU_METRICS: dict[str, tuple[str, str, Callable[[GpuSample], float | None]]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    "DCGM_FI_DEV_MEM_CLOCK": (
        "gauge",
        "Memory clock frequency (in MHz).",
        lambda g: g.mem_clock_mhz,
    ),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C).", lambda g: g.temp_c),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W).", lambda g: g.power_w),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (
        "unknown",
        "Total energy consumption since boot (in mJ).",
        lambda g: None if g.energy_j is None else g.energy_j * 1000.0,
    ),
    "DCGM_FI_DEV_GPU_UTIL": (
        "gauge",
        "GPU utilization (in %).",
        lambda g: _pct(g.gpu_util_ratio),
    ),
    "DCGM_FI_DEV_MEM_COPY_UTIL": (
        "gauge",
        "Memory utilization (in %).",
        lambda g: _pct(g.mem_util_ratio),
    ),
    "DCGM_FI_DEV_XID_ERRORS": (
        "gauge",
        "Value of the last XID error encountered.",
        lambda g: g.xid_last,
    ),
    "DCGM_FI_DEV_FB_FREE": (
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda g: g.mem_free_mib,
    ),
    "DCGM_FI_DEV_FB_USED": (
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda g: g.mem_used_mib,
    ),
    "DCGM_FI_DEV_FB_RESERVED": (
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        lambda g: g.mem_reserved_mib,
    ),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (
        "unknown",
        "Total number of double-bit volatile ECC errors.",
        lambda g: g.ecc_uncorrected_volatile,
    ),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": (
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda g: g.gr_engine_active_ratio,
    ),
    "DCGM_FI_PROF_SM_ACTIVE": (
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        lambda g: g.sm_active_ratio,
    ),
    "DCGM_FI_PROF_SM_OCCUPANCY": (
        "gauge",
        "The ratio of number of warps resident on an SM.",
        lambda g: g.sm_occupancy_ratio,
    ),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda g: g.tensor_active_ratio,
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        lambda g: g.dram_active_ratio,
    ),
}

# MIG instances get their own framebuffer series, as dcgm-exporter exports them.
_MIG_FB = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")


class DcgmExporterCollector(Collector):
    """A custom collector: ``registry.register(collector)``, then ``update()`` on every tick.

    It keeps the latest sample of each node (one per node for a real collector; many for the
    replayed fleet) and renders them on scrape. ``update`` and ``collect`` may run on different
    threads (the event loop and the scrape server).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._lock = threading.Lock()
        self._samples: dict[str, NodeSample] = {}
        self._mig_profiles: dict[tuple[str, str], str] = {}
        if registry is not None:
            registry.register(self)

    def update(self, sample: NodeSample) -> None:
        with self._lock:
            self._samples[sample.node] = sample

    def update_inventory(self, inventory: NodeInventory) -> None:
        """MIG profile names come from the inventory (``GPU_I_PROFILE``), where known."""
        with self._lock:
            for gpu in inventory.gpus:
                for m in gpu.mig_instances:
                    if m.uuid and m.mem_total_mib:
                        # NVML gives no profile name on the device handle: label by memory.
                        gib = round(m.mem_total_mib / 1024)
                        self._mig_profiles[(inventory.node, m.uuid)] = f"{gib}gb"

    def forget(self, node: str) -> None:
        with self._lock:
            self._samples.pop(node, None)

    def describe(self) -> list[Metric]:
        # Register by name without calling collect() at registration time.
        return [Metric(name, doc, kind) for name, (kind, doc, _) in DCGM_GPU_METRICS.items()]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples = list(self._samples.values())
            profiles = dict(self._mig_profiles)
        for name, (kind, doc, get) in DCGM_GPU_METRICS.items():
            metric = Metric(name, doc, kind)
            for node in samples:
                for g in node.gpus:
                    value = get(g)
                    if value is None:
                        continue
                    metric.add_sample(name, _labels(node.node, g), float(value))
                    if name in _MIG_FB:
                        self._mig_samples(metric, name, node.node, g, profiles)
            yield metric

    @staticmethod
    def _mig_samples(
        metric: Metric, name: str, node: str, g: GpuSample, profiles: dict[tuple[str, str], str]
    ) -> None:
        for m in g.mig_instances:
            if m.mem_used_mib is None or m.mem_total_mib is None:
                continue
            value = (
                m.mem_used_mib
                if name == "DCGM_FI_DEV_FB_USED"
                else (m.mem_total_mib - m.mem_used_mib)
            )
            labels = _labels(node, g)
            labels["GPU_I_ID"] = "" if m.gpu_instance_id is None else str(m.gpu_instance_id)
            labels["GPU_I_PROFILE"] = profiles.get((node, m.uuid or ""), "")
            metric.add_sample(name, labels, float(value))


def _labels(node: str, g: GpuSample) -> dict[str, str]:
    return {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "device": f"nvidia{g.index}",
        "modelName": g.model or "",
        "Hostname": node,
    }
