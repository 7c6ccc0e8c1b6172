"""Proxy KV recordings for bench-kv-forecast: other loads than the one shared H200 recording.

Usage: python -m tools.bench.kv_proxies DATA_DIR OUT_DIR [--seed 3]

Only one KV recording is shared (`h200-llm-telemetry`: the conversation trace 6x faster, a
saturated plateau from its 15th second); the forecast is judged on held-back ones, one of them a
code-completion load that made the flow model worse than the last value (1.179, issue 32). These
are simulated recordings of other loads, written in the shared recording's two formats so the
same bench reads them: one replica of the replay simulator (`seedance.bench.router_sim`, the
70B FP8 H200 profile: FIFO admission that reserves prompt + output, 256 sequences, 180k KV
tokens) serves a trace, sampled every 100 ms (KV in use, running, queued, arrival, completion and
decode-token counters), with each request's arrival, admission, first token and finish; like the
shared recording, the requests file lists only requests that finished within it.

* `sim_conv_x6`: the conversation trace's first 240 s, 6x faster (the shared recording's load,
  on another server: its KV pool, not its batch, is what saturates);
* `sim_bursts_x1`, `sim_bursts_x3`: the on/off burst proxy of the held-back Azure trace
  (`seedance.bench.autoscale_traces.bursts`), at its own speed for 600 s and 3x faster for
  300 s: bursts that saturate, gaps that drain to idle (what the shared recording never shows);
* `sim_conv_x1`: the conversation trace at its own speed for 600 s (near saturation);
* `sim_conv_half`: every other request of it (never saturated: KV follows the arrivals);
* `sim_mooncake`: Mooncake's first 600 s (long prompts).

Simulated, so a check of robustness, not a benchmark of record; what they do not reproduce:
GPU memory that is not KV, clocks that differ between the files, a CPU-bound server's timing.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from seedance.bench.autoscale_traces import CONV, MOONCAKE, bursts
from seedance.bench.router_sim import LLAMA31_70B_FP8_H200, TraceRequest, load_trace, simulate
from seedance.bench.router_sim.interfaces import FleetObservation, Scaler
from seedance.router.core.policy import LeastOutstanding
from seedance.traces.h200 import H200Telemetry

__all__ = ["record"]

P = LLAMA31_70B_FP8_H200
SAMPLE_S = 0.1
MIB_PER_TOKEN = P.kv_bytes_per_token / 2**20


class _Sampler(Scaler):
    """Keeps the one replica and records what a telemetry exporter would, every 100 ms."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.arrived = 0
        self.done = 0

    @property
    def tick_s(self) -> float:
        return SAMPLE_S

    def desired(self, obs: FleetObservation) -> int:
        self.arrived += len(obs.arrivals)
        self.done += obs.finished
        ready = obs.ready
        kv_mib = obs.kv_used_tokens * MIB_PER_TOKEN
        self.rows.append(
            {
                "t_s": obs.now_s,
                "mem_used_mib": kv_mib,
                "active_reqs": float(sum(r.running for r in ready)),
                "queued_reqs": float(sum(r.waiting for r in ready)),
                "kv_cache_mib": kv_mib,
                "arrived_total": float(self.arrived),
                "done_total": float(self.done),
                "decode_tokens_total": float(obs.decoded_tokens_total),
            }
        )
        return 1


def record(trace: Sequence[TraceRequest], out: Path, name: str) -> None:
    """Replay `trace` on one replica and write `<name>_telemetry.csv` and `_requests.csv`."""
    sampler = _Sampler()
    res = simulate(trace, LeastOutstanding(), 1, P, scaler=sampler, startup_s=0.0)
    fields = tuple(H200Telemetry.__dataclass_fields__)
    end_s = sampler.rows[-1]["t_s"]
    with (out / f"{name}_telemetry.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for row in sampler.rows:
            w.writerow([f"{row.get(k, 0.0):.4f}" for k in fields])
    with (out / f"{name}_requests.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "id",
                "arrival_s",
                "admit_s",
                "first_token_s",
                "finish_s",
                "context_tokens",
                "generated_tokens",
            ]
        )
        for i, (r, admit, ttft, e2e) in enumerate(
            zip(trace, res.admit_s, res.ttft_s, res.e2e_s, strict=True)
        ):
            finish = r.arrival_s + e2e
            if math.isnan(finish) or finish > end_s:
                continue  # as the shared recording: only requests that finished within it
            w.writerow(
                [
                    i,
                    f"{r.arrival_s:.4f}",
                    f"{admit:.4f}",
                    f"{r.arrival_s + ttft:.4f}",
                    f"{finish:.4f}",
                    r.prompt_tokens,
                    r.output_tokens,
                ]
            )


def _span(trace: Sequence[TraceRequest], seconds: float, speed: float) -> list[TraceRequest]:
    return [
        replace(r, arrival_s=r.arrival_s / speed) for r in trace if r.arrival_s < seconds * speed
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    conv = load_trace(args.data.joinpath(*CONV))
    mooncake = load_trace(args.data.joinpath(*MOONCAKE))
    on_off = bursts(conv, args.seed, 11.4, 30.7)
    loads = {
        "sim_conv_x6": _span(conv, 240.0, 6.0),
        "sim_bursts_x1": _span(on_off, 600.0, 1.0),
        "sim_bursts_x3": _span(on_off, 300.0, 3.0),
        "sim_conv_x1": _span(conv, 600.0, 1.0),
        "sim_conv_half": _span(conv[::2], 600.0, 1.0),
        "sim_mooncake": _span(mooncake, 600.0, 1.0),
    }
    for name, trace in loads.items():
        record(trace, args.out, name)
        print(f"{name}: {len(trace)} requests")
