"""The H200 serving recording's reader: one float column per field, NaN for missing times."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from seedance.traces.h200 import H200Telemetry, read_requests, read_telemetry
from tests.unit.traces.conftest import recording

TELEMETRY_HEADER = ",".join(H200Telemetry.__dataclass_fields__)
REQUESTS = """id,arrival_s,admit_s,first_token_s,finish_s,context_tokens,generated_tokens
16,1.9052,2.8227,3.6117,6.1467,120,12
8,1.3895,2.3373,,nan,242,14
"""


def test_requests_come_back_in_file_order_with_nan_for_missing(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text(REQUESTS)
    rec = read_requests(path)
    assert rec.id.tolist() == [16.0, 8.0]
    assert rec.arrival_s.tolist() == [1.9052, 1.3895]
    assert math.isnan(rec.first_token_s[1])
    assert math.isnan(rec.finish_s[1])
    assert rec.context_tokens.dtype == np.float64


def test_telemetry_columns(tmp_path: Path) -> None:
    path = tmp_path / "telemetry.csv"
    row = ",".join(str(i) for i in range(len(H200Telemetry.__dataclass_fields__)))
    path.write_text(f"{TELEMETRY_HEADER}\n{row}\n")
    rec = read_telemetry(path)
    assert rec.t_s.tolist() == [0.0]
    assert rec.kv_cache_mib.tolist() == [11.0]
    assert rec.decode_tokens_total.tolist() == [15.0]


def test_a_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "requests.csv"
    path.write_text("id,arrival_s\n1,2\n")
    with pytest.raises(ValueError, match="admit_s"):
        read_requests(path)


def test_the_real_recording(data_dir: Path) -> None:
    root = data_dir / "h200-llm-telemetry"
    tel = read_telemetry(recording(root / "h200_conv_x6_telemetry.csv"))
    assert np.all(np.diff(tel.t_s) > 0)
    assert 260 < tel.t_s[-1] < 300  # 240 s of load, 30 s of drain
    req = read_requests(recording(root / "h200_conv_x6_requests.csv"))
    # The log holds the requests that finished: as many as the telemetry's completion counter.
    assert len(req.arrival_s) == int(tel.done_total.max())
    assert len(set(req.id.tolist())) == len(req.id)


def test_a_gzip_compressed_file_reads_as_the_plain_one(tmp_path: Path) -> None:
    plain, packed = tmp_path / "requests.csv", tmp_path / "requests.csv.gz"
    plain.write_text(REQUESTS)
    packed.write_bytes(gzip.compress(REQUESTS.encode()))
    a, b = read_requests(plain), read_requests(packed)
    assert b.id.tolist() == a.id.tolist() == [16.0, 8.0]
    assert b.generated_tokens.tolist() == a.generated_tokens.tolist()


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "name", ["h100-mooncake-x0.75/h100_mooncake_x0.75", "h100-bursts-x1/h100_bursts_x1"]
)
def test_the_committed_recordings(name: str) -> None:
    """recordings/ (tools/record/h200_serving.py on the device tool's H100): 240 s of load and
    30 s of drain at 100 ms, and a log of exactly the requests the server counted as done."""
    tel = read_telemetry(REPO / "recordings" / f"{name}_telemetry.csv.gz")
    assert np.all(np.diff(tel.t_s) > 0)
    assert 269 < tel.t_s[-1] < 271
    assert abs(float(np.diff(tel.t_s).mean()) - 0.1) < 0.005
    req = read_requests(REPO / "recordings" / f"{name}_requests.csv.gz")
    assert len(req.arrival_s) == int(tel.done_total.max())
    assert int(tel.arrived_total.max()) >= len(req.arrival_s)
    # KV follows the load: it is 0 when nothing runs.
    assert np.all(tel.kv_cache_mib[tel.active_reqs == 0] == 0)
