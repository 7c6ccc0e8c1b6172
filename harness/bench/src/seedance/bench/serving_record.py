"""The parts of the GPU serving recorder (`tools/record/h200_serving.py`) that need no GPU.

Owns: the replay schedule (a trace's requests, sped up, cut at a span, sizes clipped to what
the server holds), the server's FIFO admission rule and its gauges and counters, and the two
CSV files in the formats `seedance.traces.h200` reads (the shared `h200-llm-telemetry`
recording's columns). Must not do: import torch or NVML, read a clock (the recorder passes
times in), or decide what a forecast does with the files.
"""

from __future__ import annotations

import csv
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from seedance.traces.h200 import H200Requests, H200Telemetry
from seedance.traces.llm_requests import TraceRequest

__all__ = [
    "REQUEST_COLUMNS",
    "TELEMETRY_COLUMNS",
    "FifoServer",
    "PlannedRequest",
    "RequestRecord",
    "ServerGauges",
    "TelemetryWriter",
    "plan",
    "write_requests",
]

TELEMETRY_COLUMNS = tuple(H200Telemetry.__dataclass_fields__)
REQUEST_COLUMNS = tuple(H200Requests.__dataclass_fields__)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedRequest:
    """One request of the replay: when it is sent (seconds from the replay's start) and its
    sizes as served (after clipping)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int

    @property
    def kv_tokens(self) -> int:
        """The KV the server reserves for it at admission: prompt and every output token."""
        return self.prompt_tokens + self.output_tokens


def plan(
    trace: Sequence[TraceRequest],
    *,
    speed: float,
    span_s: float,
    max_seq_tokens: int,
    max_output_tokens: int,
) -> list[PlannedRequest]:
    """The trace's requests sent in the replay's first `span_s` seconds, its clock run `speed`
    times faster; ids are the trace's indices. A request longer than the server holds is cut:
    output to `max_output_tokens`, then the prompt so that both fit `max_seq_tokens` (the
    prompt keeps at least one token)."""
    if speed <= 0 or span_s <= 0:
        raise ValueError(f"speed and span_s must be > 0, got speed={speed} span_s={span_s}")
    if max_output_tokens < 1 or max_seq_tokens <= max_output_tokens:
        raise ValueError(
            f"need 1 <= max_output_tokens < max_seq_tokens, got {max_output_tokens}, "
            f"{max_seq_tokens}"
        )
    out = []
    for i, r in enumerate(trace):
        at = r.arrival_s / speed
        if at >= span_s:
            continue
        gen = max(1, min(r.output_tokens, max_output_tokens))
        prompt = max(1, min(r.prompt_tokens, max_seq_tokens - gen))
        out.append(PlannedRequest(id=i, arrival_s=at, prompt_tokens=prompt, output_tokens=gen))
    out.sort(key=lambda p: p.arrival_s)  # stable: ties keep trace order
    return out


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """One request's life on the server; times in seconds from the replay's start, NaN until
    they happen."""

    planned: PlannedRequest
    admit_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    generated_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerGauges:
    """What the telemetry samples of the server at one instant (the non-NVML columns)."""

    active_reqs: int
    queued_reqs: int
    kv_cache_mib: float
    arrived_total: int
    done_total: int
    prefill_tokens_total: int
    decode_tokens_total: int


@dataclass(slots=True)
class FifoServer:
    """The serving loop's bookkeeping: arrivals into a FIFO queue, admission of the queue's head
    while the batch has a slot and the KV budget holds its prompt and output (never past the
    head: a long request blocks those behind it, as in a FIFO server), tokens, completions.
    The GPU work between these calls is the recorder's."""

    schedule: Sequence[PlannedRequest]
    max_batch: int
    kv_budget_tokens: int
    mib_per_token: float
    prefill_budget_tokens: int
    next_arrival: int = 0
    queue: deque[RequestRecord] = field(default_factory=deque)
    running: list[RequestRecord] = field(default_factory=list)
    finished: list[RequestRecord] = field(default_factory=list)
    kv_tokens: int = 0
    prefill_tokens_total: int = 0
    decode_tokens_total: int = 0

    def arrive(self, now_s: float) -> None:
        """Every planned request sent by `now_s` joins the queue (stamped with its send time)."""
        while (
            self.next_arrival < len(self.schedule)
            and self.schedule[self.next_arrival].arrival_s <= now_s
        ):
            self.queue.append(RequestRecord(planned=self.schedule[self.next_arrival]))
            self.next_arrival += 1

    def admit(self, now_s: float) -> list[RequestRecord]:
        """The queue's head, in order, while a batch slot and KV are free and this step's
        prefill stays within its budget (the first admitted always fits it)."""
        out: list[RequestRecord] = []
        prefill = 0
        while self.queue and len(self.running) < self.max_batch:
            head = self.queue[0].planned
            if self.kv_tokens + head.kv_tokens > self.kv_budget_tokens:
                break
            if out and prefill + head.prompt_tokens > self.prefill_budget_tokens:
                break
            rec = self.queue.popleft()
            rec.admit_s = now_s
            self.kv_tokens += head.kv_tokens
            prefill += head.prompt_tokens
            self.running.append(rec)
            out.append(rec)
        return out

    def prefilled(self, rec: RequestRecord, now_s: float) -> bool:
        """Its prompt went through the model: the first output token exists. True when that
        was its whole output (it has left; its KV is the caller's to free)."""
        rec.first_token_s = now_s
        rec.generated_tokens = 1
        self.prefill_tokens_total += rec.planned.prompt_tokens
        if rec.planned.output_tokens > 1:
            return False
        self.running.remove(rec)
        self._finish(rec, now_s)
        return True

    def decoded(self, now_s: float) -> list[RequestRecord]:
        """One decode step gave every running request one more token (all have had their
        prefill: the recorder prefills what it admits before the next step); the ones that
        reached their output length leave (their KV is the caller's to free)."""
        done: list[RequestRecord] = []
        keep: list[RequestRecord] = []
        for rec in self.running:
            rec.generated_tokens += 1
            self.decode_tokens_total += 1
            (done if rec.generated_tokens >= rec.planned.output_tokens else keep).append(rec)
        self.running = keep
        for rec in done:
            self._finish(rec, now_s)
        return done

    def _finish(self, rec: RequestRecord, now_s: float) -> None:
        rec.finish_s = now_s
        self.kv_tokens -= rec.planned.kv_tokens
        self.finished.append(rec)

    def gauges(self) -> ServerGauges:
        return ServerGauges(
            active_reqs=len(self.running),
            queued_reqs=len(self.queue),
            kv_cache_mib=self.kv_tokens * self.mib_per_token,
            arrived_total=self.next_arrival,
            done_total=len(self.finished),
            prefill_tokens_total=self.prefill_tokens_total,
            decode_tokens_total=self.decode_tokens_total,
        )


_FORMATS = {
    "t_s": "{:.3f}",
    "mem_used_mib": "{:.1f}",
    "mem_reserved_torch_mib": "{:.1f}",
    "power_w": "{:.1f}",
    "kv_cache_mib": "{:.1f}",
}


class TelemetryWriter:
    """Writes `*_telemetry.csv` row by row (a recording cut short keeps what it sampled)."""

    def __init__(self, f: TextIO) -> None:
        self._w = csv.writer(f)
        self._w.writerow(TELEMETRY_COLUMNS)

    def row(self, t_s: float, nvml: dict[str, float], gauges: ServerGauges) -> None:
        """One sample: the NVML readings (every column of the recording's NVML set, `t_s` and
        the server's gauges excepted) and the server's gauges."""
        server = {k: getattr(gauges, k) for k in ServerGauges.__dataclass_fields__}
        values = {"t_s": t_s, **nvml, **server}
        missing = set(TELEMETRY_COLUMNS) - set(values)
        if missing:
            raise ValueError(f"telemetry row lacks {sorted(missing)}")
        self._w.writerow(
            [_FORMATS.get(k, "{:.0f}").format(float(values[k])) for k in TELEMETRY_COLUMNS]
        )


def write_requests(path: Path, records: Iterable[RequestRecord], end_s: float) -> int:
    """`*_requests.csv`: the requests that finished by `end_s` (as the shared recording: one
    still queued or running at its end is not listed), in finishing order; how many."""
    n = 0
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(REQUEST_COLUMNS)
        for r in records:
            if not r.finish_s <= end_s:
                continue
            w.writerow(
                [
                    r.planned.id,
                    f"{r.planned.arrival_s:.4f}",
                    f"{r.admit_s:.4f}",
                    f"{r.first_token_s:.4f}",
                    f"{r.finish_s:.4f}",
                    r.planned.prompt_tokens,
                    r.generated_tokens,
                ]
            )
            n += 1
    return n
