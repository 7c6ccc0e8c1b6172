"""`make bench-share`'s replay (`seedance.bench.share`): a hand-made trace whose figures are
counted by hand, decisions that see no sample after their minute, and the short CI form on the
real trace (its last line as the issue writes it)."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from seedance.bench.share import (
    A100_80GB_TOTAL_MIB,
    FfdAnchor,
    MeasuredSharing,
    Trace,
    load_trace,
    main,
    replay,
)
from seedance.bench.share_splits import cuts, grown, peak_growth
from seedance.slicer.core.sharing import Move, SharingConfig
from seedance.traces.genai import BASEMODEL_FILE, DUTY_FILE, MEMORY_FILE
from tests.unit.traces.conftest import data_dir as data_dir  # the fixture, reused
from tests.unit.traces.conftest import recording

PERIOD = 57.0
T0 = 1_662_858_720.0
GIB = 1024**3
CAP = A100_80GB_TOTAL_MIB - 2 * SharingConfig().context_reserve_mib  # two pods' memory, MiB


def write(folder: Path, series: dict[str, list[tuple[float, float]]], first: int = 0) -> Path:
    """`series[pod][i]` = (duty %, memory GiB) at period `first + i` (None-free)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (
        (folder / DUTY_FILE).open("w", newline="") as fd,
        (folder / MEMORY_FILE).open("w", newline="") as fm,
    ):
        d, m = csv.writer(fd), csv.writer(fm)
        d.writerow(["value", "timestamp_anon", "container_ip"])
        m.writerow(["timestamp_anon", "value", "container_ip"])
        for pod, values in series.items():
            for i, (duty, mem_gib) in enumerate(values):
                t = T0 + (first + i) * PERIOD
                d.writerow([duty, t, pod])
                m.writerow([t, mem_gib * GIB, pod])
    (folder / BASEMODEL_FILE).write_text(
        "timestamp_anon,value,container_ip\n1662859290.0,22718.0,a\n"
    )
    return folder


def hand_trace(tmp_path: Path) -> Trace:
    """History: 60 periods of a, b (30 GiB, 10 %) and c (50 GiB). Future: 10 periods; at
    future period 2 both a and b run at 60 % (an overload if they share); from future period 4
    a holds 52 GiB (beside b's 30: past the GPU's memory if they share). d appears at future
    period 5 without a past."""
    hist = {p: [(10.0, 30.0)] * 60 for p in ("a", "b")} | {"c": [(10.0, 50.0)] * 60}
    fut: dict[str, list[tuple[float, float]]] = {p: [(10.0, 30.0)] * 10 for p in ("a", "b")}
    fut["a"][2] = fut["b"][2] = (60.0, 30.0)
    for i in range(4, 10):
        fut["a"][i] = (10.0, 52.0)
    fut["c"] = [(10.0, 50.0)] * 10
    fut["d"] = [(10.0, 20.0)] * 5
    hist_dir = write(tmp_path / "history", hist)
    future = {p: v for p, v in fut.items() if p != "d"}
    write(tmp_path / "future", future, first=60)
    with (
        (tmp_path / "future" / DUTY_FILE).open("a", newline="") as fd,
        (tmp_path / "future" / MEMORY_FILE).open("a", newline="") as fm,
    ):
        for i, (duty, mem) in enumerate(fut["d"]):
            t = T0 + (65 + i) * PERIOD
            csv.writer(fd).writerow([duty, t, "d"])
            csv.writer(fm).writerow([t, mem * GIB, "d"])
    return load_trace(hist_dir, tmp_path / "future")


def test_the_hand_trace_is_counted_as_the_definitions_say(tmp_path: Path) -> None:
    trace = hand_trace(tmp_path)
    assert (trace.split, trace.minutes, trace.period_s) == (60, 70, PERIOD)
    ffd = replay(trace, FfdAnchor())
    # a+b share a GPU, c alone (50 + 30 GiB + contexts pass 80 GiB); d alone from period 65.
    assert ffd.gpus == pytest.approx((5 * 2 + 5 * 3) / 10)
    assert ffd.baseline_gpus == pytest.approx((5 * 3 + 5 * 4) / 10)
    # 60 % + 60 % on a+b's GPU at period 62; 52 + 30 GiB > the GPU less two contexts from 64.
    assert CAP < 52 * 1024 + 30 * 1024
    assert (ffd.oom_minutes, ffd.moves) == (6, 0)
    assert ffd.overload_minute_pct == pytest.approx(100 * 1 / 25)
    # 35 pod-minutes at 10 %, two of them at 60 % instead.
    assert ffd.baseline_mean_util_pct == pytest.approx((35 * 10 + 2 * 50) / 35)
    # GPU-minutes: a+b's 10 at 20 % (120 % at 62, counted as 100), c's 10 and d's 5 at 10 %.
    assert ffd.mean_util_pct == pytest.approx((9 * 20 + 100 + 10 * 10 + 5 * 10) / 25)
    ours = replay(trace, MeasuredSharing())
    # Seedance packs a+b too; a's record at 64 is one OOM minute, then a moves away (to a GPU
    # of its own: c's GPU cannot take it), holding its old GPU one more period while it loads.
    assert ours.moves_by_reason == {"outgrown_memory": 1}
    assert ours.oom_minutes == 2
    assert ours.pods == ffd.pods == 4
    assert ours.line().startswith("share: pods=4 gpus=")


@dataclass
class Recording(MeasuredSharing):
    seen: list[tuple[int, Move[int, int]]] = field(default_factory=list)

    def after_minute(
        self, trace: Trace, m: int, gpus: dict[int, list[int]], busy: set[int]
    ) -> list[Move[int, int]]:
        moves = super().after_minute(trace, m, gpus, busy)
        self.seen.extend((m, mv) for mv in moves)
        return moves


def test_a_decision_at_minute_t_sees_no_later_sample(tmp_path: Path) -> None:
    """Replaying a trace cut right after minute t decides exactly what the whole trace decided
    up to t, whatever came after."""
    rng = np.random.default_rng(11)
    series = {
        f"p{i}": [(float(rng.uniform(0, 40)), float(rng.uniform(20, 42))) for _ in range(120)]
        for i in range(8)
    }
    trace = load_trace(write(tmp_path / "h", series))
    whole = Recording()
    replay(trace, whole)
    for cut in (trace.split + 5, trace.split + 20, trace.minutes - 1):
        part = Recording()
        replay(trace.cut(0, trace.split, cut + 1), part)
        assert [(m, mv.pod, mv.target) for m, mv in part.seen] == [
            (m, mv.pod, mv.target) for m, mv in whole.seen if m <= cut
        ]


def test_without_a_future_the_last_third_is_held_out(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "h", {"a": [(1.0, 1.0)] * 90}))
    assert (trace.split, trace.minutes) == (60, 90)
    assert trace.loads_s == (22.718,)


def test_a_future_that_does_not_follow_the_history_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "h", {"a": [(1.0, 1.0)] * 10})
    write(tmp_path / "f", {"a": [(1.0, 1.0)] * 10}, first=5)
    with pytest.raises(ValueError, match="do not all follow"):
        load_trace(tmp_path / "h", tmp_path / "f")


def test_a_folder_without_the_trace_files_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=DUTY_FILE):
        load_trace(tmp_path / "empty")


LAST = re.compile(
    r"share: pods=\d+ gpus=[\d.]+ baseline_gpus=[\d.]+ ratio=[\d.]+ "
    r"overload_minute_pct=[\d.]+ oom_minutes=\d+ mean_util_pct=[\d.]+ "
    r"baseline_mean_util_pct=[\d.]+ moves=\d+"
)


def test_the_short_ci_form_on_the_real_trace(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make bench-share` cut to its first hour of replay: the anchor's line, then the issue's
    last line. It times nothing and asserts no goal (the figures are the bench's to print)."""
    folder = recording(data_dir / "alibaba-genai-2026")
    assert main(["--history", str(folder), "--minutes", "60"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith("measured: moves")
    assert LAST.fullmatch(out[-1]), out[-1]
    figures = dict(kv.split("=") for kv in out[-1].split(": ", 1)[1].split())
    assert 0 < float(figures["gpus"]) < float(figures["baseline_gpus"])
    anchor = dict(kv.split("=") for kv in out[-3].split(": ", 1)[1].split())
    assert out[-3].startswith("ffd_anchor: ")
    assert anchor["moves"] == "0"
    assert anchor["baseline_gpus"] == figures["baseline_gpus"]


def test_the_validation_cuts_and_the_injected_growth(tmp_path: Path) -> None:
    every = cuts(720)
    assert len(every) == len(set(every)) == 18
    assert (0, 480, 720) in every
    assert (360, 540, 720) in every
    assert all(0 <= a < s < e <= 720 for a, s, e in every)
    series = {f"p{i}": [(1.0, 10.0)] * 300 for i in range(30)}
    trace = load_trace(write(tmp_path / "h", series))
    up = grown(trace, 4, seed=1)
    assert np.array_equal(up.mem[:, : trace.split], trace.mem[:, : trace.split])
    stepped = (up.mem[:, -1] - trace.mem[:, -1]) / 1024
    assert set(stepped.tolist()) == {0.0, 4.0}
    assert 0 < np.count_nonzero(stepped) < 30  # about a third
    assert np.array_equal(grown(trace, 4, seed=1).mem, up.mem)  # seeded
    lines = peak_growth(trace)
    assert lines[0].startswith("peak x2 after 60 samples (30 pods): median 1.000")
    assert lines[-1].startswith("new peaks after 240 samples: 0")
