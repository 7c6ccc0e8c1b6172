"""Reader of the Alibaba GenAI serving trace 2026 (GenTD26, `alibaba-genai-2026/`): the
base-model load latencies (``basemodel_update_latency_anon.csv``, what a diffusion-serving
replica's cold start is mostly made of) and the per-pod GPU duty cycle and memory, one sample a
minute (``pod_gpu_duty_cycle_anon.csv``, ``pod_gpu_memory_used_bytes_anon.csv``).

Owns the columns and their types. Load latencies come back in file order, as written
(milliseconds, as the file has them); per-pod samples merged by (pod, instant), memory in MiB.
A folder "shaped as" the trace holds the two per-pod files. Must not do: filter, scale or
sample rows, align samples to a grid, fill gaps or split history from future (the autoscaling
bench scales the latencies to its replica profile's weight size,
`seedance.bench.router_sim.startup`; the share bench makes its grid, `seedance.bench.share`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seedance.traces.files import parsed, read_csv

__all__ = [
    "BASEMODEL_FILE",
    "DUTY_FILE",
    "MEMORY_FILE",
    "LoadLatencyRow",
    "PodSample",
    "read_load_latencies",
    "read_pod_samples",
]

DUTY_FILE = "pod_gpu_duty_cycle_anon.csv"
MEMORY_FILE = "pod_gpu_memory_used_bytes_anon.csv"
BASEMODEL_FILE = "basemodel_update_latency_anon.csv"

_COLUMNS = frozenset({"timestamp_anon", "value", "container_ip"})
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadLatencyRow:
    """One load: when (anonymised seconds), how long (ms), on which pod (hashed IP)."""

    timestamp_s: float
    latency_ms: float
    container: str


def read_load_latencies(path: Path) -> list[LoadLatencyRow]:
    """Every row of a GenTD26 load-latency CSV, in file order; a bad value names its line."""

    def load(row: dict[str, str]) -> LoadLatencyRow:
        ms = parsed(row, "value", float)
        if not ms >= 0.0:
            raise ValueError(f"value: {row['value']!r} (a latency is >= 0 ms)")
        ts = parsed(row, "timestamp_anon", float)
        return LoadLatencyRow(timestamp_s=ts, latency_ms=ms, container=row["container_ip"])

    return read_csv(path, _COLUMNS, load)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodSample:
    """One pod's reading at one instant; a value the files do not hold for it is None."""

    pod: str
    #: The anonymised timestamp, seconds (shifted by the publisher; spacing kept).
    at_s: float
    duty_pct: float | None = None
    mem_mib: float | None = None


def _rows(path: Path) -> list[tuple[str, float, float]]:
    return read_csv(
        path,
        _COLUMNS,
        lambda row: (
            row["container_ip"],
            parsed(row, "timestamp_anon", float),
            parsed(row, "value", float),
        ),
    )


def read_pod_samples(folder: Path) -> list[PodSample]:
    """Every pod's samples in `folder`, duty cycle and memory of one instant merged into one
    sample, ordered by (pod, time). A file missing from the folder is an error naming it."""
    merged: dict[tuple[str, float], dict[str, float]] = {}
    for name, key, scale in ((DUTY_FILE, "duty_pct", 1.0), (MEMORY_FILE, "mem_mib", 1 / _MIB)):
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} has no {name} (a folder shaped as alibaba-genai-2026)"
            )
        for pod, at_s, value in _rows(path):
            merged.setdefault((pod, at_s), {})[key] = value * scale
    return [
        PodSample(pod=pod, at_s=at_s, duty_pct=v.get("duty_pct"), mem_mib=v.get("mem_mib"))
        for (pod, at_s), v in sorted(merged.items())
    ]
