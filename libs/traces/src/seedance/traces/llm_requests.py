"""Readers of the LLM request recordings: the Azure LLM inference trace 2023 (CSV) and the
Mooncake FAST'25 conversation trace (JSONL), and the one replayable form both load into.

Owns parsing, format detection and the normalised request list (arrival times in seconds from
the first request). Must not do: sample, scale or reorder a trace (ties keep file order), or
know what replays it.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from seedance.traces.files import TraceFileError, open_text, parsed, read_csv, row_error

__all__ = [
    "PREFIX_BLOCK_TOKENS",
    "AzureRow",
    "MooncakeRow",
    "TraceRequest",
    "load_trace",
    "read_azure",
    "read_mooncake",
    "trace_format",
]

# Mooncake's `hash_ids` name 512-token prompt blocks; block i's ID stands for the whole prefix up
# to and including block i, so equal leading IDs mean a shareable prefix KV.
PREFIX_BLOCK_TOKENS = 512

_AZURE_COLUMNS = frozenset({"TIMESTAMP", "ContextTokens", "GeneratedTokens"})


@dataclass(frozen=True, slots=True, kw_only=True)
class AzureRow:
    """One row of an Azure-format CSV, as written."""

    #: The stamp as written (``2023-11-16 18:15:46.6805900``: 100 ns digits, no zone).
    timestamp: str
    #: The stamp in seconds since the epoch, read as UTC (only differences matter).
    time_s: float
    context_tokens: int
    generated_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MooncakeRow:
    """One line of a Mooncake JSONL trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    #: Prefix block IDs, PREFIX_BLOCK_TOKENS tokens each (the last one possibly partial).
    hash_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    # Prefix block IDs (PREFIX_BLOCK_TOKENS each, the last one possibly partial); empty when the
    # trace carries none (Azure format), which means no prefix can be shared.
    prefix_hashes: tuple[int, ...] = ()


def _azure_time_s(stamp: str) -> float:
    text = stamp.strip()
    try:
        return float(text)  # a derived trace may carry plain seconds
    except ValueError:
        pass
    # Timestamps carry 7 fractional digits (100 ns); datetime takes 6.
    head, _, frac = text.partition(".")
    # The trace has no zone; only differences matter, so read it as UTC.
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return base.timestamp() + (float("0." + frac) if frac else 0.0)


def read_azure(path: Path) -> list[AzureRow]:
    """Every row of an Azure-format CSV, in file order (columns in any order)."""

    def row_of(row: dict[str, str]) -> AzureRow:
        return AzureRow(
            timestamp=row["TIMESTAMP"],
            time_s=parsed(row, "TIMESTAMP", _azure_time_s),
            context_tokens=parsed(row, "ContextTokens", int),
            generated_tokens=parsed(row, "GeneratedTokens", int),
        )

    return read_csv(path, sorted(_AZURE_COLUMNS), row_of)


def read_mooncake(path: Path) -> list[MooncakeRow]:
    """Every line of a Mooncake JSONL trace, in file order (blank lines skipped); a line that
    is no JSON object with the trace's fields names its number."""
    out: list[MooncakeRow] = []
    with open_text(path) as f:
        for line, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
                out.append(
                    MooncakeRow(
                        timestamp_ms=float(obj["timestamp"]),
                        input_length=int(obj["input_length"]),
                        output_length=int(obj["output_length"]),
                        hash_ids=tuple(int(h) for h in obj.get("hash_ids", ())),
                    )
                )
            except (KeyError, ValueError, TypeError, AttributeError) as exc:
                raise TraceFileError(f"{path}:{line}: {row_error(exc)}") from None
    return out


def _normalise(
    path: Path, rows: list[tuple[float, int, int, tuple[int, ...]]]
) -> list[TraceRequest]:
    if not rows:
        raise TraceFileError(f"{path}: no requests in the trace (a header or blank lines only)")
    rows.sort(key=lambda r: r[0])  # stable: ties keep file order
    t0 = rows[0][0]
    # A request generates at least its first token; prompts have at least one token.
    return [
        TraceRequest(
            arrival_s=t - t0, prompt_tokens=max(p, 1), output_tokens=max(o, 1), prefix_hashes=h
        )
        for t, p, o, h in rows
    ]


def trace_format(path: Path) -> str:
    """``"azure"`` or ``"mooncake"``, from the first line: a JSON object, or a CSV header with
    the Azure columns (in any order)."""
    with open_text(path) as f:
        first = f.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    if {c.strip() for c in next(csv.reader([first]), [])} >= _AZURE_COLUMNS:
        return "azure"
    raise TraceFileError(
        f"{path}: neither an Azure CSV (a header with {sorted(_AZURE_COLUMNS)}) nor a Mooncake "
        f"JSONL trace (a JSON object per line); its first line: {first[:80]!r}"
    )


def load_trace(path: str | Path) -> list[TraceRequest]:
    """Load an Azure-format CSV or a Mooncake JSONL trace, detected from the first line."""
    p = Path(path)
    if trace_format(p) == "mooncake":
        return _normalise(
            p,
            [
                (r.timestamp_ms / 1000.0, r.input_length, r.output_length, r.hash_ids)
                for r in read_mooncake(p)
            ],
        )
    return _normalise(
        p, [(r.time_s, r.context_tokens, r.generated_tokens, ()) for r in read_azure(p)]
    )
