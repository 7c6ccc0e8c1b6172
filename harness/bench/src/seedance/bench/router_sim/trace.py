"""Loading request traces: the Azure LLM inference CSV format and the Mooncake JSONL format.

Owns parsing and format detection only; arrival times come back in seconds from the first
request. Must not do: sample, scale or reorder the trace (ties keep file order).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["PREFIX_BLOCK_TOKENS", "TraceRequest", "load_trace"]

# Mooncake's `hash_ids` name 512-token prompt blocks; block i's ID stands for the whole prefix up
# to and including block i, so equal leading IDs mean a shareable prefix KV.
PREFIX_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Prefix block IDs (PREFIX_BLOCK_TOKENS each, the last one possibly partial); empty when the
    # trace carries none (Azure format), which means no prefix can be shared.
    prefix_hashes: tuple[int, ...] = ()


def _azure_time_s(stamp: str) -> float:
    # Timestamps carry 7 fractional digits (100 ns); datetime takes 6.
    head, _, frac = stamp.strip().partition(".")
    # The trace has no zone; only differences matter, so read it as UTC.
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return base.timestamp() + (float("0." + frac) if frac else 0.0)


def _load_azure(path: Path) -> list[TraceRequest]:
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if reader.fieldnames is None or not need <= set(reader.fieldnames):
            raise ValueError(f"{path}: expected columns {sorted(need)}, got {reader.fieldnames}")
        rows.extend(
            (
                _azure_time_s(row["TIMESTAMP"]),
                int(row["ContextTokens"]),
                int(row["GeneratedTokens"]),
                (),
            )
            for row in reader
        )
    return _normalise(rows)


def _load_mooncake(path: Path) -> list[TraceRequest]:
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            obj = json.loads(line)
            rows.append(
                (
                    obj["timestamp"] / 1000.0,
                    int(obj["input_length"]),
                    int(obj["output_length"]),
                    tuple(int(h) for h in obj.get("hash_ids", ())),
                )
            )
    return _normalise(rows)


def _normalise(rows: list[tuple[float, int, int, tuple[int, ...]]]) -> list[TraceRequest]:
    if not rows:
        raise ValueError("empty trace")
    rows.sort(key=lambda r: r[0])  # stable: ties keep file order
    t0 = rows[0][0]
    # A request generates at least its first token; prompts have at least one token.
    return [
        TraceRequest(
            arrival_s=t - t0, prompt_tokens=max(p, 1), output_tokens=max(o, 1), prefix_hashes=h
        )
        for t, p, o, h in rows
    ]


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Load an Azure-format CSV or a Mooncake JSONL trace, detected from the first line."""
    p = Path(path)
    with p.open() as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return _load_mooncake(p)
    if first.startswith("TIMESTAMP"):
        return _load_azure(p)
    raise ValueError(f"{p}: neither an Azure CSV (TIMESTAMP,...) nor a Mooncake JSONL trace")
