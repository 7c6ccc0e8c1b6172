"""Check the collector's NVML backend against ``nvidia-smi`` on real hardware, under a real load.

Runs on a machine with an NVIDIA GPU (an H200 here). Phases: idle, a torch bf16 matmul loop in a
child process, idle again. Each second it takes one sample through ``NvmlBackend`` (fast and
slow paths, GPM included) and, right after, one ``nvidia-smi --query-gpu=... --format=csv``, and
then checks: memory used within 1 %, power within 5 %, NVML utilisation and GPM SM activity
higher under load than before and after. It also records an NVML recording for the replayer
(``--record``) and measures the cost of each NVML call (p50 / p99).

Writes a JSON report (``--out``) and prints a summary; the last line is
``nvml_vs_smi: mem_max_rel_err=... power_median_rel_err=... util_rises_and_falls=...
sm_active_rises_and_falls=... ok=...`` (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pynvml

from seedance.core.clock import WallClock
from seedance.telemetry_collector.nvml import NvmlBackend
from seedance.telemetry_collector.nvml_api import GPM_METRICS, PynvmlApi
from seedance.telemetry_collector.poller import Poller
from seedance.telemetry_collector.recording import RecordingNvmlApi
from seedance.telemetry_collector.sample import merge_slow

SMI_FIELDS = (
    "index,memory.used,memory.total,power.draw,power.draw.average,power.draw.instant,"
    "utilization.gpu,temperature.gpu,clocks.sm"
)

LOAD = r"""
import sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ballast = torch.empty(8 * 1024**3, dtype=torch.uint8, device="cuda")  # 8 GiB: memory to see
print("load: started", flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("load: done", flush=True)
"""


# A GPU doing almost nothing: NVML's utilisation calls it busy, GPM's SM activity does not.
TINY = r"""
import sys, time, torch
x = torch.zeros(1, device="cuda")
print("tiny: started", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    x += 1
    torch.cuda.synchronize()
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def smi() -> list[dict[str, float | None]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        row: dict[str, float | None] = {}
        for name, v in zip(SMI_FIELDS.split(","), vals, strict=True):
            try:
                row[name] = float(v)
            except ValueError:
                row[name] = None  # "[N/A]" or "[Not Supported]"
        rows.append(row)
    return rows


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def call_costs(n: int) -> dict[str, dict[str, object]]:
    """Wall time of each NVML call on GPU 0, n calls each (p50 / p99 in µs)."""
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    api = PynvmlApi()
    calls = {
        "nvmlDeviceGetMemoryInfo_v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(
            h, pynvml.nvmlMemory_v2
        ),
        "nvmlDeviceGetUtilizationRates": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "nvmlDeviceGetPowerUsage": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "nvmlDeviceGetTemperature": lambda: pynvml.nvmlDeviceGetTemperature(h, 0),
        "nvmlDeviceGetClockInfo_SM": lambda: pynvml.nvmlDeviceGetClockInfo(h, 1),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
            pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        ),
        "nvmlDeviceGetComputeRunningProcesses": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(
            h
        ),
        "nvmlDeviceGetTotalEnergyConsumption": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(
            h
        ),
        "nvmlDeviceGetTotalEccErrors": lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        "nvmlDeviceGetFieldValues_3": lambda: pynvml.nvmlDeviceGetFieldValues(h, [83, 186, 4]),
        "nvmlGpmSampleGet": lambda: pynvml.nvmlGpmSampleGet(h, s2),
    }
    out: dict[str, dict[str, object]] = {}
    for name, fn in calls.items():
        ts = []
        reps = n if "Energy" not in name and "Field" not in name and "Gpm" not in name else n // 4
        for _ in range(reps):
            t0 = time.perf_counter()
            try:
                fn()
            except pynvml.NVMLError as exc:
                out[name] = {"error": str(exc)}
                break
            ts.append((time.perf_counter() - t0) * 1e6)
        else:
            out[name] = {"n": reps, "p50_us": pct(ts, 0.5), "p99_us": pct(ts, 0.99)}
        log(f"  cost {name}: {out[name]}")
    pynvml.nvmlGpmSampleGet(h, s1)
    time.sleep(0.1)
    pynvml.nvmlGpmSampleGet(h, s2)
    ts = []
    for _ in range(n // 4):
        t0 = time.perf_counter()
        api.nvmlGpmMetricsGet(s1, s2, list(GPM_METRICS))
        ts.append((time.perf_counter() - t0) * 1e6)
    out["nvmlGpmMetricsGet_5"] = {"n": n // 4, "p50_us": pct(ts, 0.5), "p99_us": pct(ts, 0.99)}
    pynvml.nvmlGpmSampleFree(s1)
    pynvml.nvmlGpmSampleFree(s2)
    return out


async def poller_check(host: str) -> dict[str, object]:
    """Run the Poller itself on the hardware for a few ticks (off-loop NVML, slow merge)."""
    poller = Poller(NvmlBackend(host), WallClock(), node=host, slow_interval_s=1.0)
    await poller.start()
    loop_lag = []
    results = []
    for _ in range(4):
        t0 = time.perf_counter()
        results.append(await poller.tick())
        loop_lag.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(0.5)
    await poller.settle()
    last = await poller.tick()
    await poller.close()
    await poller.close()  # idempotent
    g = last.sample.gpus[0]
    return {
        "tick_ms": loop_lag,
        "last_gpu0": __import__("msgspec").to_builtins(g),
        "healthy": all(x.healthy for x in last.sample.gpus),
        "slow_merged": g.energy_j is not None,
    }


def _start_load(phase: str, seconds: float, load: subprocess.Popen | None) -> subprocess.Popen:
    if load is not None:
        load.wait()
    script = LOAD if phase == "load" else TINY
    load = subprocess.Popen(
        [sys.executable, "-c", script, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert load.stdout is not None
    log(load.stdout.readline().strip())  # blocks until the load has allocated
    time.sleep(1.5)  # power is a 1 s average: let the window fill with the load
    return load


def _sample_once(backend: NvmlBackend, phase: str, t_start: float) -> list[dict]:
    """One second's rows: the collector's fast and slow paths beside nvidia-smi, per GPU."""
    now = time.monotonic()
    # `cpu_us_fast` / `cpu_us_slow` are what their names say: the CPU the path itself spent,
    # read as this thread's CPU time (each path runs synchronously here). Process CPU time
    # also counts every other thread of the process over the same interval (NVML's own
    # threads, a poller), which is what made the old figure 410 µs for a 38-47 µs path; it
    # is kept beside, under its own name (`process_cpu_us_*`).
    c0, p0 = time.thread_time(), time.process_time()
    fast = backend.sample_fast()
    c_fast, p_fast = time.thread_time() - c0, time.process_time() - p0
    c0, p0 = time.thread_time(), time.process_time()
    slow = {r.index: r for r in backend.sample_slow(now)}
    c_slow, p_slow = time.thread_time() - c0, time.process_time() - p0
    gpus = [merge_slow(g, slow.get(g.index), time.monotonic()) for g in fast]
    ref = smi()
    rows = []
    for g, r in zip(gpus, ref, strict=True):
        rows.append(
            {
                "phase": phase,
                "t_s": round(now - t_start, 2),
                "gpu": g.index,
                "collector": __import__("msgspec").to_builtins(g),
                "smi": r,
                "cpu_us_fast": c_fast * 1e6,
                "cpu_us_slow": c_slow * 1e6,
                "process_cpu_us_fast": p_fast * 1e6,
                "process_cpu_us_slow": p_slow * 1e6,
            }
        )
        c = g
        log(
            f"{phase:5s} t={now - t_start:5.1f}s gpu{g.index}: mem {c.mem_used_mib:.0f} "
            f"vs smi {r['memory.used']} MiB; power {c.power_w} vs smi "
            f"{r['power.draw.average'] or r['power.draw']} W; util {c.gpu_util_ratio} vs "
            f"{r['utilization.gpu']} %; sm_active {c.sm_active_ratio} tensor "
            f"{c.tensor_active_ratio} dram {c.dram_active_ratio}; "
            f"P_from_energy {c.power_from_energy_w}"
        )
    time.sleep(max(0.0, 1.0 - (time.monotonic() - now)))
    return rows


def _run_phases(backend: NvmlBackend, phases: list[tuple[str, float]]) -> list[dict]:
    load = None
    rows: list[dict] = []
    t_start = time.monotonic()
    for phase, seconds in phases:
        if phase in ("load", "tiny"):
            load = _start_load(phase, seconds, load)
        if phase == "after" and load is not None:
            load.wait()
            time.sleep(1.5)  # power is a 1 s average: let the window slide past the load
        end = time.monotonic() + seconds - (2.5 if phase in ("load", "tiny") else 0.0)
        while time.monotonic() < end:
            rows.extend(_sample_once(backend, phase, t_start))
    if load is not None:
        load.wait()
    return rows


_MEDIAN_KEYS = (
    "mem_used_mib",
    "power_w",
    "power_from_energy_w",
    "gpu_util_ratio",
    "sm_active_ratio",
    "sm_occupancy_ratio",
    "tensor_active_ratio",
    "dram_active_ratio",
    "temp_c",
    "sm_clock_mhz",
)


def _errors(rows: list[dict]) -> tuple[list[float], list[float]]:
    """Relative errors against nvidia-smi: memory used, power."""
    mem_errs, power_errs = [], []
    for r in rows:
        c, s = r["collector"], r["smi"]
        if s["memory.used"] is not None and c["mem_used_mib"] is not None:
            # nvidia-smi prints whole MiB: allow that rounding on top of the 1 % bound.
            err = abs(c["mem_used_mib"] - s["memory.used"]) / max(s["memory.used"], 100.0)
            mem_errs.append(err)
        ref_power = s["power.draw.average"] or s["power.draw"]
        if ref_power and c["power_w"] is not None:
            power_errs.append(abs(c["power_w"] - ref_power) / ref_power)
    return mem_errs, power_errs


def _summary(rows: list[dict], phases: list[tuple[str, float]], n_gpus: int) -> dict:
    def col(phase: str, key: str) -> list[float]:
        return [
            r["collector"][key]
            for r in rows
            if r["phase"] == phase and r["collector"].get(key) is not None
        ]

    med = statistics.median

    def rises_and_falls(key: str) -> bool | None:
        idle, load_, after = col("idle", key), col("load", key), col("after", key)
        if not idle or not load_ or not after:
            return None
        return med(load_) > med(idle) + 0.2 and med(after) < med(load_) - 0.2

    mem_errs, power_errs = _errors(rows)
    return {
        "mem_max_rel_err": max(mem_errs) if mem_errs else None,
        "power_median_rel_err": med(power_errs) if power_errs else None,
        "power_max_rel_err": max(power_errs) if power_errs else None,
        "util_rises_and_falls": rises_and_falls("gpu_util_ratio"),
        "sm_active_rises_and_falls": rises_and_falls("sm_active_ratio"),
        "medians": {
            phase: {k: (med(col(phase, k)) if col(phase, k) else None) for k in _MEDIAN_KEYS}
            for phase, _ in phases
        },
        "cpu_us_fast_per_gpu_median": med([r["cpu_us_fast"] for r in rows]) / n_gpus,
        "cpu_us_slow_per_gpu_median": med([r["cpu_us_slow"] for r in rows]) / n_gpus,
        # the whole process over the same calls (every thread): not the path's own cost
        "process_cpu_us_fast_per_gpu_median": (
            med([r["process_cpu_us_fast"] for r in rows]) / n_gpus
        ),
        "process_cpu_us_slow_per_gpu_median": (
            med([r["process_cpu_us_slow"] for r in rows]) / n_gpus
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="JSON report")
    p.add_argument("--record", type=Path, default=None, help="write an NVML recording here")
    p.add_argument("--idle-s", type=float, default=6.0)
    p.add_argument("--load-s", type=float, default=16.0)
    p.add_argument("--after-s", type=float, default=8.0)
    p.add_argument("--tiny-s", type=float, default=8.0, help="tiny-kernel phase (0: skip)")
    p.add_argument("--cost-calls", type=int, default=2000)
    args = p.parse_args()

    host = socket.gethostname()
    # The recorder copies every answer: with --record, `cpu_us_fast` includes that copying, so
    # the backend sees the bare NVML unless a recording is asked for.
    recorder = RecordingNvmlApi(PynvmlApi(), description=f"real H200 run of nvml_vs_smi on {host}")
    backend = NvmlBackend(host, recorder if args.record else PynvmlApi())
    inv = backend.inventory()
    log(f"inventory: {json.dumps(__import__('msgspec').to_builtins(inv))}")

    log("measuring NVML call costs")
    costs = call_costs(args.cost_calls)

    phases = [("idle", args.idle_s), ("load", args.load_s), ("after", args.after_s)]
    if args.tiny_s > 0:
        phases.append(("tiny", args.tiny_s))
    rows = _run_phases(backend, phases)
    backend.close()
    if args.record:
        args.record.write_text(json.dumps(recorder.recording(), separators=(",", ":")) + "\n")
        log(f"recording: {args.record} ({args.record.stat().st_size} bytes)")

    summary = _summary(rows, phases, len(inv.gpus))
    util_ok, sm_ok = summary["util_rises_and_falls"], summary["sm_active_rises_and_falls"]
    ok = bool(
        summary["mem_max_rel_err"] is not None
        and summary["mem_max_rel_err"] <= 0.01
        and summary["power_median_rel_err"] is not None
        and summary["power_median_rel_err"] <= 0.05
        and util_ok
        and sm_ok is not False
    )
    report = {
        "inventory": __import__("msgspec").to_builtins(inv),
        "call_costs": costs,
        "summary": summary,
        "rows": rows,
        "ok": ok,
    }
    report["poller"] = asyncio.run(poller_check(host))
    log(f"poller: {report['poller']}")
    args.out.write_text(json.dumps(report, indent=1))
    log(json.dumps(summary, indent=1))
    print(
        f"nvml_vs_smi: mem_max_rel_err={summary['mem_max_rel_err']:.4f} "
        f"power_median_rel_err={summary['power_median_rel_err']:.4f} "
        f"util_rises_and_falls={util_ok} sm_active_rises_and_falls={sm_ok} ok={ok}"
    )
