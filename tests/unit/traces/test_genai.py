"""The GenTD26 readers: load latencies in file order, bad values refused by line and field;
per-pod samples merged by (pod, instant) in MiB, a missing file named."""

from __future__ import annotations

from pathlib import Path

import pytest

from seedance.traces.genai import (
    DUTY_FILE,
    MEMORY_FILE,
    PodSample,
    read_load_latencies,
    read_pod_samples,
)
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
        ("1.0,abc,x\n", "lat.csv:2: value: 'abc'"),
        ("x,1.0,y\n", "lat.csv:2: timestamp_anon: 'x'"),
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
    with pytest.raises(ValueError, match=r"lat.csv: missing columns \['container_ip'"):
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


def test_duty_and_memory_of_one_instant_are_one_sample(tmp_path: Path) -> None:
    (tmp_path / DUTY_FILE).write_text(
        "value,timestamp_anon,container_ip\n12.5,1662858720.0,p1\n0.0,1662858777.0,p1\n"
    )
    (tmp_path / MEMORY_FILE).write_text(
        "timestamp_anon,value,container_ip\n1662858720.0,2147483648.0,p1\n"
        "1662858720.0,1048576.0,p0\n"
    )
    assert read_pod_samples(tmp_path) == [
        PodSample(pod="p0", at_s=1662858720.0, mem_mib=1.0),
        PodSample(pod="p1", at_s=1662858720.0, duty_pct=12.5, mem_mib=2048.0),
        PodSample(pod="p1", at_s=1662858777.0, duty_pct=0.0),
    ]


def test_a_missing_per_pod_file_or_a_bad_row_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=DUTY_FILE):
        read_pod_samples(tmp_path)
    (tmp_path / DUTY_FILE).write_text(
        HEADER.replace("timestamp_anon,value", "value,timestamp_anon") + "busy,1.0,p1\n"
    )
    (tmp_path / MEMORY_FILE).write_text(HEADER)
    with pytest.raises(ValueError, match=f"{DUTY_FILE}:2: value: 'busy'"):
        read_pod_samples(tmp_path)


def test_the_recorded_first_half_per_pod(data_dir: Path) -> None:
    samples = read_pod_samples(recording(data_dir / "alibaba-genai-2026"))
    assert len({s.pod for s in samples}) == 123  # the README's 143 span both halves
    assert max(s.mem_mib or 0 for s in samples) < 81_920  # an 80 GB GPU's
