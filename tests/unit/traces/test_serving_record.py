"""The GPU serving recorder's parts that need no GPU (`seedance.bench.serving_record`): the
replay schedule cut from a trace, the FIFO server's bookkeeping, and the two CSV files, which
must read back through `seedance.traces.h200` as the KV-forecast bench reads them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from seedance.bench.serving_record import (
    FifoServer,
    PlannedRequest,
    TelemetryWriter,
    plan,
    write_requests,
)
from seedance.traces.h200 import read_requests, read_telemetry
from seedance.traces.llm_requests import TraceRequest, load_trace

NVML = {
    "mem_used_mib": 2286.8,
    "mem_reserved_torch_mib": 1600.0,
    "util_gpu_pct": 38.0,
    "util_mem_pct": 4.0,
    "power_w": 166.5,
    "temp_c": 39.0,
    "sm_clock_mhz": 1980.0,
    "mem_clock_mhz": 2619.0,
}


def req(at: float, prompt: int, out: int) -> TraceRequest:
    return TraceRequest(arrival_s=at, prompt_tokens=prompt, output_tokens=out)


def planned(i: int, at: float, prompt: int, out: int) -> PlannedRequest:
    return PlannedRequest(id=i, arrival_s=at, prompt_tokens=prompt, output_tokens=out)


def server(schedule: list[PlannedRequest], **kw: int) -> FifoServer:
    args = {"max_batch": 4, "kv_budget_tokens": 1000, "prefill_budget_tokens": 500} | kw
    return FifoServer(schedule=schedule, mib_per_token=0.125, **args)


def test_the_schedule_speeds_the_trace_up_cuts_its_span_and_clips_sizes() -> None:
    trace = [req(0.0, 100, 10), req(3.0, 40_000, 3_000), req(5.9, 5, 1), req(6.0, 7, 2)]
    out = plan(trace, speed=2.0, span_s=3.0, max_seq_tokens=32_768, max_output_tokens=2_000)
    assert [p.id for p in out] == [0, 1, 2]  # 6.0 / 2 = 3.0 is past the span
    assert [p.arrival_s for p in out] == [0.0, 1.5, 2.95]
    # Output cut first, then the prompt to what is left of the sequence.
    assert (out[1].output_tokens, out[1].prompt_tokens) == (2_000, 30_768)
    assert out[1].kv_tokens == 32_768
    assert (out[0].prompt_tokens, out[0].output_tokens) == (100, 10)


@pytest.mark.parametrize(
    ("speed", "span_s", "max_seq", "max_out"),
    [(0.0, 1.0, 10, 5), (1.0, 0.0, 10, 5), (1.0, 1.0, 5, 5), (1.0, 1.0, 10, 0)],
)
def test_a_schedule_that_cannot_be_served_is_refused(
    speed: float, span_s: float, max_seq: int, max_out: int
) -> None:
    with pytest.raises(ValueError, match=r"must be|need"):
        plan(
            [req(0.0, 1, 1)],
            speed=speed,
            span_s=span_s,
            max_seq_tokens=max_seq,
            max_output_tokens=max_out,
        )


def test_the_real_traces_load_into_a_schedule(tmp_path: Path) -> None:
    csv_path = tmp_path / "bursts.csv"
    csv_path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,374,44\n2.6,396,109\n")
    out = plan(
        load_trace(csv_path), speed=1.0, span_s=2.0, max_seq_tokens=8192, max_output_tokens=1000
    )
    assert out == [planned(0, 0.0, 374, 44)]


def test_admission_is_fifo_within_the_batch_the_kv_budget_and_the_prefill_budget() -> None:
    s = server(
        [
            planned(0, 0.0, 300, 10),
            planned(1, 0.0, 300, 10),
            planned(2, 0.0, 600, 100),
            planned(3, 0.0, 10, 10),
        ]
    )
    s.arrive(0.0)
    # 0 fits; 1 would take this step's prefill past 500 tokens: next step.
    assert [r.planned.id for r in s.admit(0.1)] == [0]
    assert [r.planned.id for r in s.admit(0.2)] == [1]
    # 2 needs 700 KV tokens, 620 are held: it waits, and so does 3 behind it (FIFO).
    assert s.admit(0.3) == []
    assert s.gauges().queued_reqs == 2
    assert s.gauges().kv_cache_mib == 620 * 0.125


def test_the_batch_cap_holds_the_queue() -> None:
    s = server([planned(i, 0.0, 1, 5) for i in range(6)], max_batch=4)
    s.arrive(0.0)
    assert len(s.admit(0.0)) == 4
    assert (s.gauges().active_reqs, s.gauges().queued_reqs) == (4, 2)


def test_tokens_counters_and_completion() -> None:
    s = server([planned(0, 0.0, 50, 3), planned(1, 0.5, 20, 1), planned(2, 9.0, 5, 5)])
    s.arrive(0.5)
    assert s.gauges().arrived_total == 2  # 2 is not sent yet
    first, single = s.admit(0.6)
    assert s.prefilled(first, 0.7) is False
    assert s.prefilled(single, 0.8) is True  # its first token was its whole output
    assert s.decoded(0.9) == []
    assert [r.planned.id for r in s.decoded(1.0)] == [0]
    g = s.gauges()
    assert (g.done_total, g.active_reqs, g.kv_cache_mib) == (2, 0, 0.0)
    assert (g.prefill_tokens_total, g.decode_tokens_total) == (70, 2)
    assert (first.admit_s, first.first_token_s, first.finish_s) == (0.6, 0.7, 1.0)
    assert first.generated_tokens == 3


def test_the_files_read_back_through_the_h200_reader(tmp_path: Path) -> None:
    s = server([planned(7, 0.0, 50, 2), planned(3, 0.1, 40, 9)])
    tel = tmp_path / "x_telemetry.csv"
    with tel.open("w", newline="") as f:
        w = TelemetryWriter(f)
        w.row(0.0, NVML, s.gauges())
        s.arrive(0.1)
        a, b = s.admit(0.15)
        s.prefilled(a, 0.2)
        s.prefilled(b, 0.25)
        w.row(0.2, NVML, s.gauges())
        s.decoded(0.3)
        w.row(0.3, NVML, s.gauges())
    back = read_telemetry(tel)
    assert back.t_s.tolist() == [0.0, 0.2, 0.3]
    assert back.arrived_total.tolist() == [0, 2, 2]
    assert back.done_total.tolist() == [0, 0, 1]
    assert back.prefill_tokens_total.tolist() == [0, 90, 90]
    assert back.decode_tokens_total.tolist() == [0, 0, 2]
    # Written to 0.1 MiB, as the recordings were.
    assert back.kv_cache_mib.tolist() == pytest.approx([0.0, 101 * 0.125, 49 * 0.125], abs=0.05)
    assert back.mem_clock_mhz.tolist() == [2619.0] * 3
    assert back.power_w[0] == 166.5

    path = tmp_path / "x_requests.csv"
    # Only the request that finished by the end is listed, as in the shared recording.
    assert write_requests(path, [*s.finished, *s.running], end_s=0.3) == 1
    log = read_requests(path)
    assert log.id.tolist() == [7.0]
    assert (log.arrival_s[0], log.admit_s[0], log.first_token_s[0]) == (0.0, 0.15, 0.2)
    assert log.finish_s[0] == 0.3
    assert (log.context_tokens[0], log.generated_tokens[0]) == (50.0, 2.0)
    assert not np.isnan(log.finish_s).any()


def test_a_telemetry_row_without_every_nvml_reading_is_refused(tmp_path: Path) -> None:
    with (tmp_path / "t.csv").open("w", newline="") as f:
        w = TelemetryWriter(f)
        partial = {k: v for k, v in NVML.items() if k != "power_w"}
        with pytest.raises(ValueError, match="power_w"):
            w.row(0.0, partial, server([]).gauges())
