"""Reader of the Alibaba GenAI serving trace 2026 (GenTD26): the base-model load latencies
(``basemodel_update_latency_anon.csv``), what a diffusion-serving replica's cold start is mostly
made of.

Owns the columns and their types; rows come back in file order, as written (milliseconds, as the
file has them). Must not do: filter, scale or sample them (the autoscaling bench scales them to
its replica profile's weight size, `seedance.bench.router_sim.startup`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LoadLatencyRow", "read_load_latencies"]

_COLUMNS = frozenset({"timestamp_anon", "value", "container_ip"})


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadLatencyRow:
    """One load: when (anonymised seconds), how long (ms), on which pod (hashed IP)."""

    timestamp_s: float
    latency_ms: float
    container: str


def read_load_latencies(path: Path) -> list[LoadLatencyRow]:
    """Every row of a GenTD26 load-latency CSV, in file order; a bad value names its line."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not set(reader.fieldnames) >= _COLUMNS:
            raise ValueError(
                f"{path}: expected columns {sorted(_COLUMNS)}, got {reader.fieldnames}"
            )
        out = []
        for line, row in enumerate(reader, start=2):
            try:
                ms = float(row["value"])
                ts = float(row["timestamp_anon"])
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: value/timestamp_anon: {exc}") from None
            if not ms >= 0.0:
                raise ValueError(f"{path}:{line}: value: {row['value']!r} (a latency is >= 0 ms)")
            out.append(LoadLatencyRow(timestamp_s=ts, latency_ms=ms, container=row["container_ip"]))
        return out
