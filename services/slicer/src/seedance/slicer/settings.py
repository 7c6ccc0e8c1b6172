"""The slicer's settings (``SEEDANCE_SLICER_*``)."""

from __future__ import annotations

import msgspec

__all__ = ["SlicerSettings"]


class SlicerSettings(msgspec.Struct, frozen=True, kw_only=True):
    pool: str = "default"
    #: This replica's name in the leader lease (defaults to the host name).
    replica: str = ""
    lease_ttl_s: float = 10.0
    http_port: int = 9401
    #: Jobs handled per fetched batch; one state snapshot is written per batch.
    batch: int = 100
