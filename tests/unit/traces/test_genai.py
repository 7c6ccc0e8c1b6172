"""The GenTD26 load-latency reader: rows in file order, bad values refused by line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.traces.genai import read_load_latencies
from tests.unit.traces.conftest import recording

HEADER = "timestamp_anon,value,container_ip\n"


def test_rows_come_back_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "lat.csv"
    path.write_text(HEADER + "1662859290.0,2639.0,086b\n1662859404.0,39010.0,47d9\n")
    rows = read_load_latencies(path)
    assert [r.latency_ms for r in rows] == [2639.0, 39010.0]
    assert [r.container for r in rows] == ["086b", "47d9"]
    assert rows[0].timestamp_s == 1662859290.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("1.0,abc,x\n", "lat.csv:2: value/timestamp_anon"),
        ("1.0,-5,x\n", "lat.csv:2: value: '-5'"),
        ("1.0,nan,x\n", "lat.csv:2: value: 'nan'"),
    ],
)
def test_bad_values_name_the_line_and_field(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "lat.csv"
    path.write_text(HEADER + body)
    with pytest.raises(ValueError, match=message):
        read_load_latencies(path)


def test_missing_columns_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "lat.csv"
    path.write_text("t,v\n1,2\n")
    with pytest.raises(ValueError, match="expected columns"):
        read_load_latencies(path)


def test_the_real_recording(data_dir: Path) -> None:
    rows = read_load_latencies(
        recording(data_dir / "alibaba-genai-2026" / "basemodel_update_latency_anon.csv")
    )
    ms = sorted(r.latency_ms for r in rows)
    assert len(ms) == 7531
    # The README's figures: p50 22.7 s, p95 45.4 s.
    assert ms[len(ms) // 2] == pytest.approx(22_718, rel=0.01)
    assert ms[int(0.95 * len(ms))] == pytest.approx(45_445, rel=0.01)
