"""Reader of the H200 serving recording (``h200-llm-telemetry``): NVML and server telemetry
sampled every 100 ms, and the request log of the same run; also the recordings made since in
the same formats (`tools/record/h200_serving.py`, recordings/), plain or gzip-compressed.

Owns the columns; each file comes back as one array per column, in file order. Must not do:
align the two files' clocks (they do not share an origin; the KV-forecast bench derives the
offset) or map rows to a forecaster's types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from seedance.traces.files import read_csv

__all__ = ["H200Requests", "H200Telemetry", "read_requests", "read_telemetry"]

Column = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class H200Telemetry:
    """``h200_conv_x6_telemetry.csv``: one entry per sample (README of the recording)."""

    t_s: Column
    mem_used_mib: Column
    mem_reserved_torch_mib: Column
    util_gpu_pct: Column
    util_mem_pct: Column
    power_w: Column
    temp_c: Column
    sm_clock_mhz: Column
    mem_clock_mhz: Column
    active_reqs: Column
    queued_reqs: Column
    kv_cache_mib: Column
    arrived_total: Column
    done_total: Column
    prefill_tokens_total: Column
    decode_tokens_total: Column


@dataclass(frozen=True, slots=True, kw_only=True)
class H200Requests:
    """``h200_conv_x6_requests.csv``: one entry per request, NaN where a time is missing."""

    id: Column
    arrival_s: Column
    admit_s: Column
    first_token_s: Column
    finish_s: Column
    context_tokens: Column
    generated_tokens: Column


def _columns(path: Path, names: tuple[str, ...]) -> dict[str, Column]:
    """Each of ``names`` as a column; gzip-compressed files (the committed recordings under
    recordings/ are) read as they are (`files.open_text`)."""

    def value(text: str) -> float:
        return float(text) if text not in ("", "nan") else math.nan

    rows = read_csv(path, names, lambda r: [value(r[n]) for n in names])
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    return {n: np.ascontiguousarray(table[:, i]) for i, n in enumerate(names)}


def read_telemetry(path: Path) -> H200Telemetry:
    names = tuple(H200Telemetry.__dataclass_fields__)
    return H200Telemetry(**_columns(path, names))


def read_requests(path: Path) -> H200Requests:
    names = tuple(H200Requests.__dataclass_fields__)
    return H200Requests(**_columns(path, names))
