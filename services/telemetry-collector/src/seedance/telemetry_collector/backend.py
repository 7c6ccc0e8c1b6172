"""The shape every GPU source has: real NVML, a replayed NVML recording, or a simulated fleet.

Owns the ``GpuBackend`` protocol only. Backends are synchronous and may block (NVML calls
take microseconds to milliseconds); the ``Poller`` runs them off the event loop.
"""

from __future__ import annotations

from typing import Protocol

from seedance.telemetry_collector.sample import GpuSample, GpuSlowReading, NodeInventory

__all__ = ["GpuBackend"]


class GpuBackend(Protocol):
    def inventory(self) -> NodeInventory:
        """The node's GPUs and the links between them (read at start and on change)."""
        ...

    def sample_fast(self, now_monotonic_s: float | None = None) -> tuple[GpuSample, ...]:
        """Cheap fields of every GPU (memory, utilisation, power, health); ``now_monotonic_s``
        lets a backend pace a field that changes slower than the tick (NVML's power)."""
        ...

    def sample_slow(self, now_monotonic_s: float) -> tuple[GpuSlowReading, ...]:
        """Expensive fields of every GPU (energy, ECC, XID events, GPM activity)."""
        ...

    def close(self) -> None: ...
