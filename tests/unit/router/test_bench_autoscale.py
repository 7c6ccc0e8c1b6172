"""Short CI forms of bench-autoscale and bench-kv-forecast: they run and keep their last lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    env = os.environ.get("SEEDANCE_DATA_DIR")
    return Path(env) if env else REPO.parent / "shared" / "data"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    return path


def last_line(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return done.stdout.strip().splitlines()[-1]


NUM = r"[0-9.]+"


def test_bench_autoscale_short_form_prints_its_line() -> None:
    trace = need(data_dir() / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv")
    line = last_line("-m", "tools.bench.bench_autoscale", str(trace), "--limit-s", "300")
    keys = (
        "slo_pct",
        "gpu_hours",
        "reactive_slo_pct",
        "reactive_gpu_hours",
        "static_gpu_hours",
        "ratio",
        "oracle_gpu_hours",
    )
    pattern = "autoscale: trace=AzureLLMInferenceTrace_conv " + " ".join(f"{k}={NUM}" for k in keys)
    assert re.fullmatch(pattern, line), line


def test_bench_kv_forecast_prints_its_line() -> None:
    rec = need(data_dir() / "h200-llm-telemetry")
    line = last_line(
        "-m",
        "tools.bench.bench_kv_forecast",
        str(rec / "h200_conv_x6_telemetry.csv"),
        str(rec / "h200_conv_x6_requests.csv"),
    )
    keys = ("wape", "baseline_wape", "wape_30s", "baseline_wape_30s", "ratio")
    pattern = "kv_forecast: horizon_s=5 " + " ".join(f"{k}={NUM}" for k in keys)
    assert re.fullmatch(pattern, line), line
