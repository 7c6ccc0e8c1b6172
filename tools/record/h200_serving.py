"""Record NVML and server telemetry of one GPU serving a trace's requests (KV-forecast recordings).

Usage (on the GPU machine; torch and nvidia-ml-py installed):
  python -m tools.record.h200_serving TRACE OUT_DIR NAME --speed 6 [--span-s 240 --drain-s 30]
writes OUT_DIR/NAME_telemetry.csv and NAME_requests.csv in the formats
`seedance.traces.h200` reads, so `make bench-kv-forecast TELEMETRY=… REQUESTS=…` takes them.

What it reproduces: the method the shared `h200-llm-telemetry` recording's README states. A
transformer with random weights (16 layers, d = 2048, 16 heads, MLP 4d, bf16: 1.6 GB, no
vocabulary) serves requests whose arrival times and token counts come from a trace (Azure-format
CSV or Mooncake JSONL, read by `seedance.traces.llm_requests`), replayed `--speed` times faster
than real time for its first `--span-s` seconds, then `--drain-s` of drain; each request's KV
cache is its own tensor (prompt + output, 0.125 MiB a token) allocated at admission and freed at
its end, so GPU memory follows the load; the allocator is emptied every second; NVML is sampled
every 100 ms from a thread. The requests file lists only requests that finished in the recording.

It is not the original recorder (its code is not in the project); what differs, as far as
known: the serving loop here is `seedance.bench.serving_record.FifoServer` (FIFO, at most
`--max-batch` running, a KV budget of `--kv-budget-mib`, at most `--prefill-budget` prompt
tokens admitted per step, each admitted prompt prefilled whole before the next decode step,
decode attention one request at a time, so the loop is bound by the CPU as the original's was);
sizes are cut to `--max-seq` / `--max-output` tokens (the original's requests file shows outputs
of 10 to 1,000 and prompts up to 7,930 tokens: its own cut, not documented); both files share one
clock (the original's were 1.00 s apart; the bench finds the offset either way); arrival times
are the planned send times. Generated tokens are not sampled from a vocabulary: the last hidden
state feeds the next step.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import torch
import torch.nn.functional as F

from seedance.bench.serving_record import (
    FifoServer,
    PlannedRequest,
    TelemetryWriter,
    plan,
    write_requests,
)
from seedance.traces.llm_requests import load_trace

LAYERS, D, HEADS = 16, 2048, 16
HEAD_DIM = D // HEADS
MIB = 2**20
# K and V of every layer for one token, bf16.
MIB_PER_TOKEN = LAYERS * 2 * D * 2 / MIB
SAMPLE_S = 0.1


class Model:
    """Random bf16 weights; `prefill` and `decode` write each request's KV into its own tensor."""

    def __init__(self, device: torch.device) -> None:
        g = torch.Generator(device=device).manual_seed(0)

        def w(n_in: int, n_out: int) -> torch.Tensor:
            return (
                torch.randn(n_in, n_out, device=device, generator=g, dtype=torch.bfloat16)
                / n_in**0.5
            )

        self.layers = [(w(D, 3 * D), w(D, D), w(D, 4 * D), w(4 * D, D)) for _ in range(LAYERS)]
        self.device = device

    def new_kv(self, tokens: int) -> torch.Tensor:
        return torch.empty(
            LAYERS, 2, 1, HEADS, tokens, HEAD_DIM, device=self.device, dtype=torch.bfloat16
        )

    def prefill(self, kv: torch.Tensor, n: int) -> torch.Tensor:
        x = torch.randn(n, D, device=self.device, dtype=torch.bfloat16)
        for i, (wqkv, wo, w1, w2) in enumerate(self.layers):
            qkv = F.rms_norm(x, (D,)) @ wqkv
            q, k, v = (t.view(n, HEADS, HEAD_DIM).transpose(0, 1)[None] for t in qkv.chunk(3, -1))
            kv[i, 0, :, :, :n] = k
            kv[i, 1, :, :, :n] = v
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + a[0].transpose(0, 1).reshape(n, D) @ wo
            x = x + F.gelu(F.rms_norm(x, (D,)) @ w1) @ w2
        return x[-1]

    def decode(self, x: torch.Tensor, kvs: list[torch.Tensor], pos: list[int]) -> torch.Tensor:
        """One token for each running request: x is (batch, D); request j writes position
        pos[j] of its KV and attends to positions 0..pos[j]."""
        b = x.shape[0]
        for i, (wqkv, wo, w1, w2) in enumerate(self.layers):
            qkv = (F.rms_norm(x, (D,)) @ wqkv).view(b, 3, HEADS, 1, HEAD_DIM)
            outs = []
            for j, (kv, p) in enumerate(zip(kvs, pos, strict=True)):
                kv[i, :, 0, :, p : p + 1] = qkv[j, 1:]
                outs.append(
                    F.scaled_dot_product_attention(
                        qkv[j, 0][None], kv[i, 0, :, :, : p + 1], kv[i, 1, :, :, : p + 1]
                    )
                )
            x = x + torch.cat(outs).reshape(b, D) @ wo
            x = x + F.gelu(F.rms_norm(x, (D,)) @ w1) @ w2
        return x


class Sampler(threading.Thread):
    """NVML and the server's gauges every 100 ms, written as they come."""

    def __init__(self, server: FifoServer, writer: TelemetryWriter, f: Any, t0: float) -> None:
        super().__init__(daemon=True)
        self.server, self.writer, self.f, self.t0 = server, writer, f, t0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())

    def nvml(self) -> dict[str, float]:
        h = self.h
        mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        util = pynvml.nvmlDeviceGetUtilizationRates(h)
        return {
            "mem_used_mib": mem.used / MIB,
            "mem_reserved_torch_mib": torch.cuda.memory_reserved() / MIB,
            "util_gpu_pct": util.gpu,
            "util_mem_pct": util.memory,
            "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        }

    def run(self) -> None:
        k = 0
        while not self.stop.is_set():
            now = time.perf_counter() - self.t0
            readings = self.nvml()
            with self.lock:
                gauges = self.server.gauges()
            self.writer.row(now, readings, gauges)
            k += 1
            if k % 10 == 0:
                self.f.flush()
            self.stop.wait(max(0.0, self.t0 + k * SAMPLE_S - time.perf_counter()))


def decode_step(
    model: Model,
    server: FifoServer,
    kvs: dict[int, torch.Tensor],
    hidden: dict[int, torch.Tensor],
    lock: threading.Lock,
    now: Callable[[], float],
) -> None:
    """One token for every running request; the finished ones leave and their KV is freed."""
    ids = [r.planned.id for r in server.running]
    pos = [r.planned.prompt_tokens + r.generated_tokens - 1 for r in server.running]
    x = model.decode(torch.stack([hidden[i] for i in ids]), [kvs[i] for i in ids], pos)
    for j, i in enumerate(ids):
        hidden[i] = x[j]
    torch.cuda.synchronize()
    with lock:
        done = server.decoded(now())
    for r in done:
        del kvs[r.planned.id], hidden[r.planned.id]


def serve(model: Model, server: FifoServer, sampler: Sampler, end_s: float) -> None:
    """The serving loop until `end_s` on the replay clock (sampler.t0 is its zero)."""
    t0, lock = sampler.t0, sampler.lock
    kvs: dict[int, torch.Tensor] = {}
    hidden: dict[int, torch.Tensor] = {}
    last_empty = 0.0

    def now() -> float:
        return time.perf_counter() - t0

    while (t := now()) < end_s:
        with lock:
            server.arrive(t)
            admitted = server.admit(t)
        for rec in admitted:
            p = rec.planned
            kvs[p.id] = model.new_kv(p.kv_tokens)
            hidden[p.id] = model.prefill(kvs[p.id], p.prompt_tokens)
            torch.cuda.synchronize()
            with lock:
                if server.prefilled(rec, now()):
                    del kvs[p.id], hidden[p.id]
        if server.running:
            decode_step(model, server, kvs, hidden, lock, now)
        elif not admitted:
            time.sleep(0.002)  # idle: wait for the next arrival
        if t - last_empty >= 1.0:
            torch.cuda.empty_cache()
            last_empty = t


def record(trace: list[PlannedRequest], out: Path, name: str, args: argparse.Namespace) -> None:
    device = torch.device("cuda")
    # cuDNN's attention builds a plan for every new sequence length: each decode step (every
    # request one token longer) paid for new plans, and the server did ~20 steps/s at one
    # request (a first try on the device tool's H100, 2026-12-06). Flash attention has none.
    torch.backends.cuda.enable_cudnn_sdp(False)
    model = Model(device)
    # Warm-up: kernels and cuBLAS handles exist before the clock starts.
    kv = model.new_kv(64)
    model.decode(model.prefill(kv, 32)[None], [kv], [32])
    del kv
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    server = FifoServer(
        schedule=trace,
        max_batch=args.max_batch,
        kv_budget_tokens=int(args.kv_budget_mib / MIB_PER_TOKEN),
        mib_per_token=MIB_PER_TOKEN,
        prefill_budget_tokens=args.prefill_budget,
    )
    end_s = args.span_s + args.drain_s
    with (out / f"{name}_telemetry.csv").open("w", newline="") as f:
        sampler = Sampler(server, TelemetryWriter(f), f, time.perf_counter())
        sampler.start()
        serve(model, server, sampler, end_s)
        sampler.stop.set()
        sampler.join()
    n = write_requests(out / f"{name}_requests.csv", server.finished, end_s)
    g = server.gauges()
    print(
        f"{name}: planned={len(trace)} arrived={g.arrived_total} done={g.done_total} "
        f"listed={n} running_at_end={g.active_reqs} queued_at_end={g.queued_reqs} "
        f"gpu={torch.cuda.get_device_name()} driver={pynvml.nvmlSystemGetDriverVersion()}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="Azure-format CSV or Mooncake JSONL")
    ap.add_argument("out", type=Path)
    ap.add_argument("name")
    ap.add_argument("--speed", type=float, required=True)
    ap.add_argument("--span-s", type=float, default=240.0)
    ap.add_argument("--drain-s", type=float, default=30.0)
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--kv-budget-mib", type=float, default=60_000.0)
    ap.add_argument("--prefill-budget", type=int, default=16_384)
    ap.add_argument("--max-seq", type=int, default=32_768)
    ap.add_argument("--max-output", type=int, default=2_000)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trace = plan(
        load_trace(args.trace),
        speed=args.speed,
        span_s=args.span_s,
        max_seq_tokens=args.max_seq,
        max_output_tokens=args.max_output,
    )
    record(trace, args.out, args.name, args)


if __name__ == "__main__":
    sys.exit(main())
