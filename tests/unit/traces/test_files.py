"""Each reader takes a real recording's copy as real copies come: saved again by a spreadsheet
(a byte-order mark), compressed under its usual name, columns in another order; and refuses
one it cannot read naming the file (and line). Before: a BOM gave a bare ``KeyError: 'sn'``
(or "missing columns ['t_s']" with the column there, or "neither an Azure CSV" for an Azure
CSV), a gzip'd copy a ``UnicodeDecodeError`` naming no file, an Azure CSV with its columns
reordered was refused, and an empty trace named no file.

The inputs are the first 40 rows of the shared recordings themselves (skipped without them).
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seedance.bench.scale_fleet import read_fleet
from seedance.traces import alibaba, genai, h200, llm_requests
from seedance.traces.files import TraceFileError
from tests.unit.traces.conftest import recording

#: (reader, the recording under the data folder); each reader's result compared whole.
READERS: dict[str, tuple[Callable[[Path], Any], str]] = {
    "nodes": (alibaba.read_nodes, "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"),
    "pods": (alibaba.read_pods, "alibaba-gpu-v2023/openb_pod_list_default.csv"),
    "azure": (llm_requests.load_trace, "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"),
    "loads": (genai.read_load_latencies, "alibaba-genai-2026/basemodel_update_latency_anon.csv"),
    "h200": (
        lambda p: h200.read_telemetry(p).t_s.tolist(),
        "h200-llm-telemetry/h200_conv_x6_telemetry.csv",
    ),
    "fleet": (read_fleet, "alibaba-spot-gpu-2026/node_info_df.csv"),
}


def _head(path: Path, rows: int = 40) -> str:
    with path.open(newline="") as f:
        return "".join(f.readlines()[: rows + 1])


def _reversed_columns(text: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(r[::-1] for r in csv.reader(io.StringIO(text)))
    return out.getvalue()


QUIRKS: dict[str, Callable[[str], bytes]] = {
    "a byte-order mark (Excel's CSV UTF-8)": lambda t: ("\ufeff" + t).encode(),
    "gzip'd under its usual name": lambda t: gzip.compress(t.encode()),
    "CRLF line ends": lambda t: t.replace("\n", "\r\n").encode(),
    "columns reversed": lambda t: _reversed_columns(t).encode(),
}


@pytest.fixture(params=sorted(READERS))
def real(request: pytest.FixtureRequest, data_dir: Path) -> tuple[Callable[[Path], Any], str]:
    read, name = READERS[request.param]
    return read, _head(recording(data_dir / name))


@pytest.mark.parametrize("quirk", sorted(QUIRKS))
def test_a_real_copy_reads_as_the_original(
    real: tuple[Callable[[Path], Any], str], quirk: str, tmp_path: Path
) -> None:
    read, text = real
    original, copy = tmp_path / "original.csv", tmp_path / "copy.csv"
    original.write_text(text, newline="")
    copy.write_bytes(QUIRKS[quirk](text))
    expected = read(original)
    assert expected, "the real file's head read as nothing: the test compares nothing"
    assert read(copy) == expected


def test_an_empty_file_and_a_binary_one_are_named(
    real: tuple[Callable[[Path], Any], str], tmp_path: Path
) -> None:
    read, _ = real
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    with pytest.raises(TraceFileError, match=r"empty\.csv: "):
        read(empty)
    binary = tmp_path / "zstd.csv"  # another compressor's magic, then bytes no UTF-8 holds
    binary.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(128, 256)) * 64)
    with pytest.raises(TraceFileError, match=r"zstd\.csv: not UTF-8 text"):
        read(binary)


def test_a_bad_value_names_the_file_line_and_column(data_dir: Path, tmp_path: Path) -> None:
    text = _head(recording(data_dir / READERS["pods"][1]), rows=3)
    header, *rows = text.splitlines(keepends=True)
    gpu_milli = header.strip().split(",").index("gpu_milli")
    cells = rows[1].rstrip("\n").split(",")
    cells[gpu_milli] = "half"
    bad = tmp_path / "pods.csv"
    bad.write_text(header + rows[0] + ",".join(cells) + "\n")
    with pytest.raises(TraceFileError, match=r"pods\.csv:3: gpu_milli: 'half'"):
        alibaba.read_pods(bad)
    short = tmp_path / "short.csv"
    short.write_text(header + rows[0].split(",")[0] + "\n")
    with pytest.raises(TraceFileError, match=r"short\.csv:2: "):
        alibaba.read_pods(short)


def test_a_header_alone_is_no_trace_and_says_which_file(data_dir: Path, tmp_path: Path) -> None:
    azure = _head(recording(data_dir / READERS["azure"][1]), rows=0)
    path = tmp_path / "conv.csv"
    path.write_text(azure)
    with pytest.raises(TraceFileError, match=r"conv\.csv: no requests in the trace"):
        llm_requests.load_trace(path)


def test_a_mooncake_line_that_is_no_request_names_its_number(
    data_dir: Path, tmp_path: Path
) -> None:
    lines = _head(recording(data_dir / "mooncake-fast25-conversation/conversation_trace.jsonl"), 2)
    path = tmp_path / "trace.jsonl"
    path.write_text(lines + '{"timestamp": 5}\n')
    with pytest.raises(TraceFileError, match=r"trace\.jsonl:4: no value for column 'input_length'"):
        llm_requests.load_trace(path)
