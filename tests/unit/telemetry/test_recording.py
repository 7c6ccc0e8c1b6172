"""Recorder and replayer: a recording replays to the same samples; misses are explicit."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest
from constructed import a100_mig, h100_nvlink_xid

from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.recording import (
    RECORDING_FORMAT,
    RecordingNvmlApi,
    ReplayMissError,
    ReplayNvmlApi,
    load_recording,
)

H200 = Path(__file__).parent / "recordings" / "h200_recording.json"


def run(api: object, slow_ticks: int = 3) -> tuple[object, list[object], list[object]]:
    backend = NvmlBackend("n", api, costly_interval_s=0.0)
    inv = backend.inventory()
    fast, slow = [], []
    for t in range(slow_ticks):
        fast.append(backend.sample_fast())
        slow.append(backend.sample_slow(float(t + 1)))
    backend.close()
    return inv, fast, slow


@pytest.mark.parametrize("make", [a100_mig, h100_nvlink_xid])
def test_record_then_replay_gives_the_same_samples(make, tmp_path: Path) -> None:
    recorder = RecordingNvmlApi(ReplayNvmlApi(make()), description="round trip")
    first = run(recorder)
    path = tmp_path / "rec.json"
    recorder.save(path)
    second = run(ReplayNvmlApi(load_recording(path), strict=True))
    assert first == second
    data = json.loads(path.read_text())
    assert data["format"] == RECORDING_FORMAT
    assert data["provenance"] == "recorded"
    assert any("err" in c for c in data["calls"])  # return codes are part of the recording


def test_strict_replay_names_the_missing_call() -> None:
    api = ReplayNvmlApi(a100_mig(), strict=True)
    with pytest.raises(ReplayMissError, match="nvmlDeviceGetBoardId"):
        api.nvmlDeviceGetBoardId("gpu0")


def test_lenient_replay_answers_not_supported() -> None:
    api = ReplayNvmlApi(a100_mig())
    with pytest.raises(pynvml.NVMLError_NotSupported):
        api.nvmlDeviceGetBoardId("gpu0")


def test_replay_serves_in_order_then_keeps_the_last() -> None:
    api = ReplayNvmlApi(a100_mig())
    reads = [api.nvmlDeviceGetTotalEnergyConsumption("gpu0") for _ in range(4)]
    assert reads == [987654321, 987766771, 987766771, 987766771]


def test_pushed_result_is_served_first() -> None:
    api = ReplayNvmlApi(a100_mig())
    api.push("nvmlDeviceGetPowerUsage", ["gpu0"], err=pynvml.NVML_ERROR_GPU_IS_LOST)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        api.nvmlDeviceGetPowerUsage("gpu0")
    assert api.nvmlDeviceGetPowerUsage("gpu0") == 112450


def test_wrong_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "other", "calls": []}))
    with pytest.raises(ValueError, match="format"):
        load_recording(path)


def test_real_h200_recording_replays() -> None:
    rec = load_recording(H200)
    assert rec["provenance"] == "recorded"
    # Not strict: the recording predates the fast path's v1 memory read, which replays as
    # NotSupported, so memory comes through the v2 fallback (every other call is recorded).
    api = ReplayNvmlApi(rec)
    backend = NvmlBackend("vm", api, costly_interval_s=0.0)
    inv = backend.inventory()
    (gpu,) = inv.gpus
    assert gpu.model == "NVIDIA H200"
    assert gpu.architecture == "hopper"
    # nvidia-smi's 143,771 MiB total is NVML's total; reserved is reported on its own.
    assert gpu.mem_total_mib == pytest.approx(143771.0)
    assert gpu.mem_reserved_mib == pytest.approx(615.0625)
    assert gpu.mig_enabled is False
    assert gpu.nvlink_links_active is None  # NotSupported on this VM: absent, not 0
    assert gpu.gpm_supported is True
    # Walk the recorded run: the load phase shows up in memory, power and GPM activity.
    peaks = {"mem": 0.0, "power": 0.0, "sm": 0.0}
    for t in range(28):
        (fast,) = backend.sample_fast()
        (slow,) = backend.sample_slow(float(t + 1))
        assert fast.healthy
        assert not slow.health_reasons
        peaks["mem"] = max(peaks["mem"], fast.mem_used_mib or 0.0)
        peaks["power"] = max(peaks["power"], fast.power_w or 0.0)
        peaks["sm"] = max(peaks["sm"], slow.sm_active_ratio or 0.0)
    assert peaks["mem"] > 9000
    assert 600 < peaks["power"] <= 700
    assert 0.9 < peaks["sm"] <= 1.0
