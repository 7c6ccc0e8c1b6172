"""The proxy traces' building blocks: on/off gating, laying a trace out through bursts (nothing
dropped, order kept, the source clock run at each burst's speed), and the shape statistics the
proxies were matched on; and the simulated KV recordings' files."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from seedance.bench.autoscale_traces import describe, gate, lay_out, on_off_periods, superpose
from seedance.bench.kv_forecast import listed_until_s, read_log
from seedance.bench.kv_proxies import record
from seedance.traces import h200
from seedance.traces.llm_requests import TraceRequest


def trace(times: list[float]) -> list[TraceRequest]:
    return [
        TraceRequest(arrival_s=t, prompt_tokens=100 + i, output_tokens=5)
        for i, t in enumerate(times)
    ]


def test_gate_keeps_only_requests_inside_on_periods() -> None:
    periods = [(0.0, 10.0, 1.0), (10.0, 20.0, 0.0), (20.0, 30.0, 1.0)]
    kept = gate(trace([1.0, 9.9, 10.0, 15.0, 25.0]), periods)
    assert [r.arrival_s for r in kept] == [1.0, 9.9, 25.0]


def test_lay_out_runs_the_source_clock_only_while_on_at_each_speed() -> None:
    # Source: one request a second for 20 s. On 0-5 s at 2x, off 5-10 s, on 10-20 s at 1x.
    periods = [(0.0, 5.0, 2.0), (5.0, 10.0, 0.0), (10.0, 20.0, 1.0)]
    src = trace([float(k) for k in range(20)])
    out = lay_out(src, periods, span_s=100.0)
    assert [r.prompt_tokens for r in out] == [r.prompt_tokens for r in src]  # all, in order
    t = [r.arrival_s for r in out]
    assert t[:10] == pytest.approx([k / 2.0 for k in range(10)])  # source 0-10 s in 5 s
    assert t[10:] == pytest.approx([10.0 + k for k in range(10)])  # then at its own pace
    assert not any(5.0 <= x < 10.0 for x in t)  # nothing while off
    assert len(lay_out(src, periods, span_s=12.0)) == 12  # cut at the span


def test_on_off_periods_alternate_and_cover_the_span() -> None:
    periods = on_off_periods(
        random.Random(1),
        span_s=1000.0,
        on_mean_s=10.0,
        off_mean_s=30.0,
        speed_mean=2.0,
        speed_cv=0.5,
    )
    assert periods[0][2] > 0
    assert periods[1][2] == 0.0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(periods))
    assert periods[-1][1] >= 1000.0
    speeds = [p[2] for p in periods if p[2] > 0]
    assert np.mean(speeds) == pytest.approx(2.0, rel=0.25)


def test_describe_measures_the_shape() -> None:
    # 10 requests in second 0, none in seconds 1-9, 10 in second 10.
    shape = describe(trace([0.0] * 10 + [10.5] * 10))
    assert shape["span_s"] == 10.0
    assert shape["empty_1s_pct"] == pytest.approx(90.0)
    assert shape["req_per_s"] == pytest.approx(1.0)  # the second 10 is past the span
    assert shape["cv_1s"] == pytest.approx(math.sqrt(9.0))
    assert [r.arrival_s for r in superpose(trace([2.0]), trace([1.0]))] == [1.0, 2.0]


def test_a_simulated_recording_reads_like_the_shared_one(tmp_path: Path) -> None:
    src = [
        TraceRequest(arrival_s=0.05 * k, prompt_tokens=500, output_tokens=50 + (k % 7) * 20)
        for k in range(400)
    ]
    record(src, tmp_path, "tiny")
    tel = h200.read_telemetry(tmp_path / "tiny_telemetry.csv")
    log = read_log(tmp_path / "tiny_requests.csv")
    assert tel.t_s[1] - tel.t_s[0] == pytest.approx(0.1)
    assert float(tel.kv_cache_mib.max()) > 0.0
    assert 0 < tel.arrived_total[-1] <= len(src)
    # Only requests that finished within the recording are listed, each after it arrived and
    # was admitted; the counter of completions matches them.
    assert len(log.arrival_s) <= len(src)
    assert bool(np.all(log.finish_s <= tel.t_s[-1] + 1e-6))
    assert bool(np.all(log.admit_s >= log.arrival_s - 1e-9))
    assert bool(np.all(log.first_token_s >= log.admit_s - 1e-9))
    done = np.searchsorted(np.sort(log.finish_s), tel.t_s, side="right")
    assert int(np.abs(done - tel.done_total).max()) <= 1
    # Requests still running at the end are missing, as in the shared recording, and the
    # bench's check finds where the listing falls short of the server's arrival counter.
    assert len(log.arrival_s) < tel.arrived_total[-1]
    assert listed_until_s(log, tel.t_s, tel.arrived_total) <= tel.t_s[-1]
