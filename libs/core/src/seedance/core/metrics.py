"""Metrics shared by every service: what the bus runtime did. Built on an injected registry.

Each service adds its own metrics class beside this one (``seedance_<svc>_<what>_<unit>``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["BusMetrics"]


class BusMetrics:
    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        prefix = f"seedance_{service.replace('-', '_')}"
        self.messages_total = Counter(
            f"{prefix}_messages_total",
            "Messages settled, by durable consumer and outcome "
            "(ack, nak, dead_letter, dead_letter_failed, ignored).",
            ["durable", "outcome"],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            f"{prefix}_batch_duration_seconds",
            "Time to decode, handle and settle one fetched batch.",
            ["durable"],
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
        )
        self.published_total = Counter(
            f"{prefix}_published_total",
            "Events published, by event family.",
            ["family"],
            registry=registry,
        )
