"""The collector's settings (``SEEDANCE_TELEMETRY_COLLECTOR_*``)."""

from __future__ import annotations

import msgspec

__all__ = ["CollectorSettings"]


class CollectorSettings(msgspec.Struct, frozen=True, kw_only=True):
    #: ``replay`` (a fleet from a node list) or ``nvml`` (this node's GPUs).
    source: str = "replay"
    #: Node list in the Alibaba trace's format, for ``source=replay``.
    node_csv: str = ""
    #: Replay only the first N nodes (0: all).
    max_nodes: int = 0
    tick_s: float = 1.0
    node_name: str = ""
    http_port: int = 9400
