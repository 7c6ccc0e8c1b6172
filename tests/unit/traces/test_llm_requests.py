"""The Azure and Mooncake readers, format detection and the normalised request list."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from seedance.traces.llm_requests import (
    TraceRequest,
    load_trace,
    read_azure,
    read_mooncake,
    trace_format,
)
from tests.unit.traces.conftest import recording

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:46.6805900,374,0
"""
MOONCAKE = """{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1]}

{"timestamp": 1500, "input_length": 0, "output_length": 3}
"""


def test_azure_rows_keep_the_stamp_and_read_100ns_digits(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    first, second = read_azure(path)
    assert first.timestamp == "2023-11-16 18:15:50.9951690"
    assert first.time_s - second.time_s == pytest.approx(4.314579)
    assert (second.context_tokens, second.generated_tokens) == (374, 0)


def test_azure_loads_sorted_from_zero_with_at_least_one_token(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    assert trace_format(path) == "azure"
    first, second = load_trace(path)
    assert first == TraceRequest(arrival_s=0.0, prompt_tokens=374, output_tokens=1)
    assert second.arrival_s == pytest.approx(4.314579)
    assert second.prefix_hashes == ()


def test_mooncake_rows_and_prefix_blocks(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(MOONCAKE)
    rows = read_mooncake(path)
    assert [r.hash_ids for r in rows] == [(0, 1), ()]
    assert trace_format(path) == "mooncake"
    reqs = load_trace(path)
    assert [r.arrival_s for r in reqs] == [0.0, 1.5]
    assert reqs[0].prefix_hashes == (0, 1)
    assert reqs[1].prompt_tokens == 1


def test_unknown_format_and_missing_columns_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("time,tokens\n1,2\n")
    with pytest.raises(ValueError, match="neither an Azure CSV"):
        load_trace(bad)
    with pytest.raises(ValueError, match="missing columns"):
        read_azure(bad)


def test_the_real_traces_load(data_dir: Path) -> None:
    azure = load_trace(
        recording(data_dir / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv")
    )
    assert azure[0].arrival_s == 0.0
    assert 3500 < azure[-1].arrival_s < 3700  # one hour
    moon = load_trace(
        recording(data_dir / "mooncake-fast25-conversation" / "conversation_trace.jsonl")
    )
    assert all(r.prefix_hashes for r in moon[:100])
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(moon))
