"""Where the collector's NVML CPU goes on real hardware, and what per-process samples look like.

Run on a GPU machine (the H200 of the `device` tool), from the repository root with the
collector's and the node agent's sources on ``PYTHONPATH`` (as ``make bench-nvml-shares``).
Phases: idle, then under the two-process load of ``seedance.bench.nvml_shares`` (its workers,
70 % and 20 % duty). In each phase it measures, with the calling thread's CPU clock
(``time.thread_time``) and the wall clock beside it:

- every NVML call the fast path makes, one 10 Hz tick at a time, the calls' order rotated each
  tick, so that a call's cost "first after a sleep" is told apart from its cost warm;
- ``NvmlBackend.sample_fast`` whole, at 10 Hz, and again right after (warm);
- a ``cProfile`` (thread-CPU timer) of ``sample_fast`` at 10 Hz (into the JSON);
- the slow path's calls, and the node agent's per-process read;
- the first call after an idle 100 ms alone, after 100 µs of Python, and after a call that
  stays in the library: whether its extra cost is the CPU's or the driver's.

Under load it also records ``nvmlDeviceGetProcessUtilization`` (and the v2
``nvmlDeviceGetProcessesUtilizationInfo`` where the driver has it) once a second with
``lastSeenTimeStamp=0`` (the driver's whole buffer) and with the second's start, beside each
worker's own kernel time per wall-clock second (CUDA events): the recorded shape the node
agent's share accumulation is tested against.

Writes everything to ``--out`` (JSON) and prints per-call medians; the last line is
``nvml_profile: sample_fast_us_p90_idle=<n> sample_fast_us_p90_load=<n>``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

from seedance.bench.nvml_shares import _imports, _pct, _start_workers


def _fast_calls(n: Any, h: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Every call the fast path made before it was cut to three (memory, utilisation, power),
    with memory's v1 beside its v2, as closures."""
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("GetMemoryInfo_v2", lambda: n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)),
        ("GetMemoryInfo_v1", lambda: n.nvmlDeviceGetMemoryInfo(h)),
        ("GetUtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(h)),
        ("GetPowerUsage", lambda: n.nvmlDeviceGetPowerUsage(h)),
        ("GetTemperature", lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
        ("GetClockInfo_SM", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
        ("GetClockInfo_MEM", lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
        ("GetCurrentClocksEventReasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("GetComputeRunningProcesses", lambda: n.nvmlDeviceGetComputeRunningProcesses(h)),
    ]
    return calls


def _rotating(calls: list[tuple[str, Callable[[], Any]]], ticks: int) -> list[dict[str, Any]]:
    """One tick every 100 ms; each tick makes every call once, starting one later each tick."""
    rows: list[dict[str, Any]] = []
    for tick in range(ticks):
        time.sleep(0.1)
        k = tick % len(calls)
        for pos, (name, fn) in enumerate(calls[k:] + calls[:k]):
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                fn()
            except Exception as exc:  # a call this driver refuses: recorded, not fatal
                rows.append({"call": name, "error": repr(exc)})
                continue
            rows.append(
                {
                    "call": name,
                    "pos": pos,
                    "thread_us": (time.thread_time() - c0) * 1e6,
                    "wall_us": (time.perf_counter() - w0) * 1e6,
                }
            )
    return rows


def _warm(calls: list[tuple[str, Callable[[], Any]]], reps: int) -> dict[str, float]:
    """Median thread µs of each call made back to back (no sleep between)."""
    out = {}
    for name, fn in calls:
        ts = []
        for _ in range(reps):
            c0 = time.thread_time()
            fn()
            ts.append((time.thread_time() - c0) * 1e6)
        out[name] = statistics.median(ts)
    return out


def _second_ago() -> int:
    return int(time.time() * 1e6) - 1_000_000


def _quiet(n: Any, fn: Callable[..., Any], h: Any) -> Any:
    try:
        return fn(h, _second_ago())
    except n.NVMLError_NotFound:
        return None


def _slow_calls(n: Any, h: Any, reps: int) -> dict[str, dict[str, Any]]:
    """Thread and wall µs (medians) of the slow path's calls, one every 100 ms."""
    from seedance.telemetry_collector.nvml_api import GPM_METRICS, PynvmlApi

    api = PynvmlApi()
    s1, s2 = n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()
    n.nvmlGpmSampleGet(h, s1)
    time.sleep(0.1)
    n.nvmlGpmSampleGet(h, s2)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("GetTotalEnergyConsumption", lambda: n.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("GetTotalEccErrors", lambda: n.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
        ("GpmSampleGet", lambda: n.nvmlGpmSampleGet(h, s2)),
        ("GpmMetricsGet_5", lambda: api.nvmlGpmMetricsGet(s1, s2, list(GPM_METRICS))),
        ("GetFieldValues_power_instant", lambda: n.nvmlDeviceGetFieldValues(h, [186])),
        ("GetFieldValues_energy_83", lambda: n.nvmlDeviceGetFieldValues(h, [83])),
        ("GetFieldValues_energy_191", lambda: n.nvmlDeviceGetFieldValues(h, [191])),
        ("ProcessUtilization_pynvml", lambda: _quiet(n, n.nvmlDeviceGetProcessUtilization, h)),
    ]
    out: dict[str, dict[str, Any]] = {}
    for name, fn in calls:
        th: list[float] = []
        wa: list[float] = []
        for _ in range(reps):
            time.sleep(0.1)
            c0, w0 = time.thread_time(), time.perf_counter()
            try:
                fn()
            except n.NVMLError as exc:
                out[name] = {"error": str(exc)}
                break
            th.append((time.thread_time() - c0) * 1e6)
            wa.append((time.perf_counter() - w0) * 1e6)
        else:
            out[name] = {
                "thread_us_p50": statistics.median(th),
                "wall_us_p50": statistics.median(wa),
            }
    n.nvmlGpmSampleFree(s1)
    n.nvmlGpmSampleFree(s2)
    return out


def _sample_fast(backend: Any, ticks: int) -> dict[str, list[float]]:
    first, second = [], []
    for _ in range(ticks):
        time.sleep(0.1)
        c0 = time.thread_time()
        backend.sample_fast(time.monotonic())  # paced as the Poller paces it
        c1 = time.thread_time()
        backend.sample_fast(time.monotonic())
        c2 = time.thread_time()
        first.append((c1 - c0) * 1e6)
        second.append((c2 - c1) * 1e6)
    return {"after_sleep": first, "warm": second}


def _profiled(backend: Any, ticks: int) -> str:
    """cProfile of ``sample_fast`` at 10 Hz (thread-CPU timer), the top of its table. A
    ctypes call is not a profiled function: its time shows in the pynvml wrapper around it."""
    prof = cProfile.Profile(time.thread_time)
    for _ in range(ticks):
        time.sleep(0.1)
        prof.enable()
        backend.sample_fast(time.monotonic())
        prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    return s.getvalue()


def _wake(n: Any, h: Any, ticks: int) -> dict[str, float]:
    """The first NVML call after an idle 100 ms: alone, after 100 µs of Python, and after a
    call that stays in the library (``nvmlDeviceGetCount``); median thread µs of the call."""
    out = {}
    for name in ("alone", "after_python", "after_library_call"):
        ts = []
        for _ in range(ticks):
            time.sleep(0.1)
            if name == "after_python":
                end = time.thread_time() + 100e-6
                while time.thread_time() < end:
                    pass
            elif name == "after_library_call":
                n.nvmlDeviceGetCount()
            c0 = time.thread_time()
            n.nvmlDeviceGetUtilizationRates(h)
            ts.append((time.thread_time() - c0) * 1e6)
        out[name] = statistics.median(ts)
    return out


def _calibrate() -> dict[str, float]:
    deltas = []
    for _ in range(2000):
        a = time.thread_time()
        b = time.thread_time()
        if b > a:
            deltas.append((b - a) * 1e6)
    c0, w0 = time.thread_time(), time.perf_counter()
    x = 0
    for i in range(20000):
        x += i
    return {
        "thread_time_min_step_us": min(deltas) if deltas else float("nan"),
        "loop_thread_us": (time.thread_time() - c0) * 1e6,
        "loop_wall_us": (time.perf_counter() - w0) * 1e6,
    }


def _raw_util(n: Any, h: Any, fn: str, since_us: int) -> list[list[int]] | str:
    try:
        raw = getattr(n, fn)(h, since_us)
    except n.NVMLError as exc:
        return str(exc)
    return [[int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil)] for s in raw]


def _record_util(n: Any, h: Any, seconds: int) -> list[dict[str, Any]]:
    """Every 250 ms the whole buffer (lastSeen 0); each second also the last second's, v1/v2."""
    fns = ["nvmlDeviceGetProcessUtilization"]
    if hasattr(n, "nvmlDeviceGetProcessesUtilizationInfo"):
        fns.append("nvmlDeviceGetProcessesUtilizationInfo")
    out = []
    for k in range(4 * seconds):
        time.sleep(0.25)
        now_us = int(time.time() * 1e6)
        row: dict[str, Any] = {"unix_us": now_us, fns[0] + ":0": _raw_util(n, h, fns[0], 0)}
        if k % 4 == 3:
            for fn in fns:
                row[f"{fn}:1s"] = _raw_util(n, h, fn, now_us - 1_000_000)
            row[f"{fns[-1]}:0"] = _raw_util(n, h, fns[-1], 0)
        out.append(row)
    return out


def _summ(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        if "error" in r:
            continue
        d = by.setdefault(r["call"], {"first": [], "later": [], "wall": []})
        d["first" if r["pos"] == 0 else "later"].append(r["thread_us"])
        d["wall"].append(r["wall_us"])
    return {
        name: {
            "first_thread_us_p50": statistics.median(d["first"]) if d["first"] else float("nan"),
            "later_thread_us_p50": statistics.median(d["later"]),
            "later_thread_us_p90": _pct(d["later"], 0.9),
            "wall_us_p50": statistics.median(d["wall"]),
        }
        for name, d in by.items()
    }


def _phase(name: str, n: Any, h: Any, backend: Any, ticks: int) -> dict[str, Any]:
    calls = _fast_calls(n, h)
    rows = _rotating(calls, ticks)
    summary = _summ(rows)
    warm = _warm(calls, 200)
    fast = _sample_fast(backend, ticks)
    table = _profiled(backend, ticks)
    slow = _slow_calls(n, h, 8)
    wake = _wake(n, h, ticks // 2)
    print(f"{name} slow calls: {slow}")
    print(f"{name} first call after 100 ms idle (GetUtilizationRates, thread µs): {wake}")
    for call, s in summary.items():
        print(
            f"{name} {call:32s} first {s['first_thread_us_p50']:7.1f} later "
            f"{s['later_thread_us_p50']:7.1f} (p90 {s['later_thread_us_p90']:7.1f}) "
            f"warm {warm.get(call, float('nan')):7.1f} wall {s['wall_us_p50']:7.1f} µs"
        )
    print(
        f"{name} sample_fast after sleep p50 {statistics.median(fast['after_sleep']):.1f} "
        f"p90 {_pct(fast['after_sleep'], 0.9):.1f}; warm p50 {statistics.median(fast['warm']):.1f} "
        f"p90 {_pct(fast['warm'], 0.9):.1f} µs"
    )
    print(table)
    return {
        "rows": rows,
        "summary": summary,
        "warm": warm,
        "sample_fast": fast,
        "cprofile": table,
        "slow_calls": slow,
        "wake": wake,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--record-s", type=int, default=14)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    n, NvmlBackend = _imports()
    backend = NvmlBackend(os.uname().nodename)
    backend.inventory()
    h = n.nvmlDeviceGetHandleByIndex(0)
    report: dict[str, Any] = {"calibrate": _calibrate()}
    print(f"calibrate: {report['calibrate']}")
    report["idle"] = _phase("idle", n, h, backend, args.ticks)
    wargs = argparse.Namespace(
        duty=[0.7, 0.2], worker_s=3 * args.ticks * 0.1 + args.record_s + 22.0, n=args.n
    )
    procs = _start_workers(wargs)
    time.sleep(2.5)
    report["load"] = _phase("load", n, h, backend, args.ticks)
    report["util_recording"] = _record_util(n, h, args.record_s) if args.record_s else []
    report["workers"] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        report["workers"].append({"pid": p.pid, **json.loads(out.strip().splitlines()[-1])})
    backend.close()
    with open(args.out, "w") as f:
        json.dump(report, f)
    for w in report["workers"]:
        pct = 100 * w["kernel_ms"] / w["wall_ms"]
        print(f"worker {w['pid']} duty {w['duty']}: kernel {pct:.1f} %")
    print(
        "nvml_profile: "
        f"sample_fast_us_p90_idle={_pct(report['idle']['sample_fast']['after_sleep'], 0.9):.1f} "
        f"sample_fast_us_p90_load={_pct(report['load']['sample_fast']['after_sleep'], 0.9):.1f}"
    )


if __name__ == "__main__":
    main()
