"""The collector's own metrics (``seedance_telemetry_collector_*``), on an injected registry.

Owns what the collector says about itself: ticks, GPU samples published, tick duration, NVML
errors, placements applied. The GPUs' own readings are dcgm-exporter-named and live in
``prometheus.py``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["CollectorMetrics"]

_P = "seedance_telemetry_collector"


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.ticks_total = Counter(
            f"{_P}_ticks_total",
            "Ticks by outcome: ok, or publish_failed (the samples of that tick are dropped).",
            ["outcome"],
            registry=registry,
        )
        self.gpu_samples_total = Counter(
            f"{_P}_gpu_samples_published_total",
            "GPU samples published (one per GPU per tick).",
            registry=registry,
        )
        self.node_events_total = Counter(
            f"{_P}_node_events_published_total",
            "Node events published, by kind (sample, inventory, health).",
            ["kind"],
            registry=registry,
        )
        self.tick_seconds = Histogram(
            f"{_P}_tick_duration_seconds",
            "Time to sample every GPU and publish the tick's events.",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.tick_overruns_total = Counter(
            f"{_P}_tick_overruns_total",
            "Ticks that took longer than the tick interval (the next tick starts late).",
            registry=registry,
        )
        self.nvml_errors_total = Counter(
            f"{_P}_nvml_errors_total",
            "NVML errors: GPUs whose sample hit an undocumented NVML error, or failed polls.",
            registry=registry,
        )
        self.placements_total = Counter(
            f"{_P}_placements_total",
            "Placements read by the replayed fleet, by outcome "
            "(applied, duplicate, foreign_node, no_gpus, released).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("ok", "publish_failed"):
            self.ticks_total.labels(outcome)
