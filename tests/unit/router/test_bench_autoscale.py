"""Short CI forms of bench-autoscale and bench-kv-forecast: they run and keep their last lines
(the autoscaling one with its planner-mode shares and the 60 s line before it; the KV one with
the line naming which head made the forecasts)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.testing.paths import data_dir

REPO = Path(__file__).resolve().parents[3]


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data not present at {path} (set SEEDANCE_DATA_DIR)")
    return path


def last_line(*args: str) -> str:
    return output(*args)[-1]


NUM = r"[0-9.]+"


def output(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return done.stdout.strip().splitlines()


def test_bench_autoscale_short_form_prints_its_lines() -> None:
    trace = need(data_dir() / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv")
    need(data_dir() / "alibaba-genai-2026" / "basemodel_update_latency_anon.csv")
    lines = output("-m", "tools.bench.bench_autoscale", str(trace), "--limit-s", "300")
    keys = (
        "slo_pct",
        "gpu_hours",
        "reactive_slo_pct",
        "reactive_gpu_hours",
        "static_gpu_hours",
        "ratio",
        "oracle_gpu_hours",
    )
    body = " ".join(f"{k}={NUM}" for k in keys) + rf" planner_mode_pct={NUM}/{NUM}/{NUM}"
    # The last line: measured start-ups; before it, the same at today's 60 s.
    assert re.fullmatch(f"autoscale: trace=AzureLLMInferenceTrace_conv {body}", lines[-1])
    at_60s = [line for line in lines if line.startswith("autoscale_60s:")]
    assert len(at_60s) == 1
    assert re.fullmatch(f"autoscale_60s: trace=AzureLLMInferenceTrace_conv {body}", at_60s[0])
    modes = [float(x) for x in lines[-1].rsplit("=", 1)[1].split("/")]
    assert sum(modes) == pytest.approx(100.0, abs=0.2)


def test_bench_kv_forecast_prints_its_line() -> None:
    rec = need(data_dir() / "h200-llm-telemetry")
    line = last_line(
        "-m",
        "tools.bench.bench_kv_forecast",
        str(rec / "h200_conv_x6_telemetry.csv"),
        str(rec / "h200_conv_x6_requests.csv"),
    )
    keys = ("wape", "baseline_wape", "wape_30s", "baseline_wape_30s", "ratio", "ratio_last")
    pattern = "kv_forecast: horizon_s=5 " + " ".join(f"{k}={NUM}" for k in keys)
    assert re.fullmatch(pattern, line), line


def test_bench_kv_forecast_says_which_head_made_its_forecasts() -> None:
    rec = need(data_dir() / "h200-llm-telemetry")
    lines = output(
        "-m",
        "tools.bench.bench_kv_forecast",
        str(rec / "h200_conv_x6_telemetry.csv"),
        str(rec / "h200_conv_x6_requests.csv"),
    )
    heads = [line for line in lines if line.startswith("kv_heads: ")]
    assert len(heads) == 1
    head = r"(flow|last_value|mean_10s|mean_30s):[0-9]+"
    assert re.fullmatch(rf"kv_heads: h5={head}(/{head})* h30={head}(/{head})*", heads[0])
