"""Per-process shares of one shared GPU from NVML, against each process's own kernel time.

Run on a GPU machine (the H200 of the `device` tool; `make bench-nvml-shares`). Two child
processes share GPU 0, each a torch bf16 matmul loop busy a fraction of every 100 ms (0.7 and
0.2 by default) and each measuring its own kernel time with CUDA events (one event pair per
matmul, summed; under contention the loops stretch, so the nominal duty cycles are not the
truth: the measured kernel time is). Meanwhile this process runs the collector's work at its
cadences, as the node agent would: the fast path (``NvmlBackend.sample_fast``) at 10 Hz, the
slow path every 10 s, and NVML per-process utilisation (``nvmlDeviceGetProcessUtilization``)
at 1 Hz, whose samples go through the node agent's own share core
(``seedance.node_agent.core.shares``) and each PID's cgroup through ``core.cgroup``.

It prints, per process: its nominal duty, its kernel time as a share of the window (CUDA
events), the share NVML attributes to it, and the difference; then the attributed sum against
the device's own activity (NVML utilisation, mean over the window); then, as the last line:

    nvml: fast_us_p90_under_load=<n> collector_cpu_ms_per_gpu_s_10hz=<n> raw_calls_us=<n>

- ``fast_us_p90_under_load``: thread CPU µs of one ``sample_fast`` per GPU, p90 over the
  10 Hz samples taken while both loads run (goal ≤ 50);
- ``collector_cpu_ms_per_gpu_s_10hz``: process CPU (``time.process_time()`` deltas: every
  thread of this process, NVML's own included) over the whole window, per GPU and per second,
  with the fast path at 10 Hz, the slow path every 10 s and the share sampler at 1 Hz (goal
  ≤ 1.25 ms, i.e. 1 % of a core for an 8-GPU node);
- ``raw_calls_us``: thread CPU µs of the bare NVML calls the fast path makes for one GPU
  (memory v2, utilisation, power, temperature, SM clock, clock-event reasons, compute
  processes), median under load: the floor under ``fast_us``.

Where ``nvidia-cuda-mps-control`` is on PATH it says so; the MPS pinned-memory limit and
active-thread percentage are not exercised by this script and stay unverified.

Needs python3 with torch (CUDA), nvidia-ml-py (pynvml) and msgspec (the collector's sample
types); it stops with a message naming what is missing. Run from the repository root with
``PYTHONPATH=harness/bench/src:services/node-agent/src:services/telemetry-collector/src``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

WORKER = r"""
import json, sys, time
import torch
duty, seconds, warmup = (float(v) for v in sys.argv[1:4])
n = int(sys.argv[4])
period = 0.100
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(20):
    a @ b
torch.cuda.synchronize()
print("ready", flush=True)
start = time.perf_counter()
measure_from, measure_to = start + warmup, start + warmup + seconds
kernel_ms = 0.0
periods = 0
pending = []
t = start
while t < measure_to:
    busy_until = t + duty * period
    measuring = t >= measure_from
    while time.perf_counter() < busy_until:
        batch = []
        for _ in range(4):
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            e0.record(); a @ b; e1.record()
            batch.append((e0, e1))
        torch.cuda.synchronize()
        if measuring:
            kernel_ms += sum(e0.elapsed_time(e1) for e0, e1 in batch)
    if measuring:
        periods += 1
    t += period
    rest = t - time.perf_counter()
    if rest > 0:
        time.sleep(rest)
wall_ms = (time.perf_counter() - measure_from) * 1000.0
report = {"duty": duty, "kernel_ms": kernel_ms, "wall_ms": wall_ms, "periods": periods}
print(json.dumps(report), flush=True)
"""


def _fail(msg: str) -> None:
    print(f"nvml_shares: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _imports() -> tuple[Any, Any, Any]:
    try:
        torch = importlib.import_module("torch")  # not a workspace dependency: the device's own
    except ImportError:
        _fail(
            "torch is not importable: run with the python3 that holds PyTorch (the device image's)"
        )
    if not torch.cuda.is_available():
        _fail("torch sees no CUDA device")
    try:
        import pynvml
    except ImportError:
        _fail("pynvml (nvidia-ml-py) is not importable")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        _fail(f"NVML does not initialise: {exc}")
    try:
        from seedance.telemetry_collector.nvml import NvmlBackend
    except ImportError as exc:
        _fail(
            f"the collector's NVML backend is not importable ({exc}); set PYTHONPATH="
            "services/node-agent/src:services/telemetry-collector/src and carry a msgspec "
            "wheel if it is missing (docs/node-agent.md)"
        )
    return torch, pynvml, NvmlBackend


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _raw_calls(n: Any, h: Any) -> None:
    n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2)
    n.nvmlDeviceGetUtilizationRates(h)
    n.nvmlDeviceGetPowerUsage(h)
    n.nvmlDeviceGetTemperature(h, 0)
    n.nvmlDeviceGetClockInfo(h, 1)
    n.nvmlDeviceGetCurrentClocksEventReasons(h)
    n.nvmlDeviceGetComputeRunningProcesses(h)


class Collector:
    """The collector's work at its cadences, on a thread of this process."""

    def __init__(self, pynvml: Any, backend: Any, n_gpus: int) -> None:
        self.n = pynvml
        self.backend = backend
        self.n_gpus = n_gpus
        self.h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.fast_us: list[float] = []
        self.raw_us: list[float] = []
        self.util: list[float] = []
        self.proc_samples: dict[tuple[int, int], tuple[float, float]] = {}
        self.stop = threading.Event()
        self.last_ts = 0

    def run(self, seconds: float) -> tuple[float, float]:
        """Runs for ``seconds``; returns (process CPU s, wall s) over them."""
        c0, w0 = time.process_time(), time.perf_counter()
        next_fast = next_proc = w0
        next_slow = w0 + 10.0
        end = w0 + seconds
        while (now := time.perf_counter()) < end:
            if now >= next_fast:
                t = time.thread_time()
                self.backend.sample_fast()
                self.fast_us.append((time.thread_time() - t) * 1e6 / self.n_gpus)
                t = time.thread_time()
                _raw_calls(self.n, self.h0)
                self.raw_us.append((time.thread_time() - t) * 1e6)
                self.util.append(self.n.nvmlDeviceGetUtilizationRates(self.h0).gpu)
                next_fast += 0.1
            if now >= next_proc:
                self._proc()
                next_proc += 1.0
            if now >= next_slow:
                self.backend.sample_slow(time.monotonic())
                next_slow += 10.0
            time.sleep(max(0.0, min(next_fast, next_proc, next_slow) - time.perf_counter()))
        return time.process_time() - c0, time.perf_counter() - w0

    def _proc(self) -> None:
        n = self.n
        try:
            raw = n.nvmlDeviceGetProcessUtilization(self.h0, self.last_ts)
        except n.NVMLError:
            return  # NVML_ERROR_NOT_FOUND: no sample since last_ts
        for s in raw:
            self.proc_samples[(int(s.pid), int(s.timeStamp))] = (float(s.smUtil), float(s.memUtil))
            self.last_ts = max(self.last_ts, int(s.timeStamp))


def _start_workers(args: argparse.Namespace) -> list[subprocess.Popen[str]]:
    procs = []
    for duty in args.duty:
        p = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                str(duty),
                str(args.seconds),
                str(args.warmup_s),
                str(args.n),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            _fail(f"a worker did not start (said {line!r})")
    return procs


def _cgroups(procs: list[subprocess.Popen[str]]) -> dict[int, str]:
    """Each worker's /proc/<pid>/cgroup, read while it runs (the node agent's PID -> pod path)."""
    out = {}
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/cgroup") as f:
                out[p.pid] = f.read()
        except OSError:
            out[p.pid] = ""
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duty", type=float, nargs="+", default=[0.7, 0.2])
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window")
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--n", type=int, default=4096, help="matmul size (n x n, bf16)")
    ap.add_argument("--out", default="", help="write a JSON report here")
    args = ap.parse_args()

    _torch, pynvml, NvmlBackend = _imports()
    from seedance.node_agent.core.cgroup import pod_of_cgroup
    from seedance.node_agent.core.shares import ProcessSample, pid_shares

    backend = NvmlBackend(os.uname().nodename)
    inv = backend.inventory()
    n_gpus = len(inv.gpus)
    procs = _start_workers(args)
    cgroups = _cgroups(procs)
    time.sleep(args.warmup_s)
    collector = Collector(pynvml, backend, n_gpus)
    cpu_s, wall_s = collector.run(args.seconds)
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        reports.append({"pid": p.pid, **json.loads(out.strip().splitlines()[-1])})
    backend.close()

    samples = [
        ProcessSample(pid, sm, mem, ts) for (pid, ts), (sm, mem) in collector.proc_samples.items()
    ]
    periods = len({s.timestamp_us for s in samples}) or 1
    shares = pid_shares(samples, periods)
    device_pct = statistics.fmean(collector.util) if collector.util else float("nan")
    rows, attributed_sum, ok = [], 0.0, True
    for r in reports:
        measured = 100.0 * r["kernel_ms"] / r["wall_ms"]
        share = shares.get(r["pid"])
        attributed = share.sm_pct if share else 0.0
        attributed_sum += attributed
        seen = sum(1 for s in samples if s.pid == r["pid"])
        found = pod_of_cgroup(cgroups.get(r["pid"], ""))  # None outside Kubernetes
        pod = found.pod_uid if found else None
        diff = attributed - measured
        ok = ok and abs(diff) <= 10.0
        rows.append(
            {
                **r,
                "measured_pct": measured,
                "attributed_sm_pct": attributed,
                "diff_pts": diff,
                "samples_seen": seen,
                "pod": pod,
            }
        )
        print(
            f"process {r['pid']}: duty {r['duty']:.2f} kernel {measured:5.1f} % (CUDA events) "
            f"attributed {attributed:5.1f} % (NVML, in {seen} of {periods} sample periods) "
            f"diff {diff:+5.1f} pts"
        )
    sum_ok = abs(attributed_sum - device_pct) <= 10.0
    print(
        f"attributed sum {attributed_sum:5.1f} % vs device utilisation {device_pct:5.1f} % "
        f"(diff {attributed_sum - device_pct:+5.1f} pts) ok={ok and sum_ok}"
    )
    mps = shutil.which("nvidia-cuda-mps-control")
    print(
        f"mps: {'control daemon at ' + mps if mps else 'no nvidia-cuda-mps-control on PATH'}; "
        "pinned memory limit and thread percentage not exercised: unverified"
    )
    fast_p90 = _pct(collector.fast_us, 0.9)
    cpu_ms_per_gpu_s = cpu_s * 1000.0 / wall_s / n_gpus
    raw = statistics.median(collector.raw_us) if collector.raw_us else float("nan")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "rows": rows,
                    "periods": periods,
                    "device_util_pct": device_pct,
                    "fast_us": collector.fast_us,
                    "raw_us": collector.raw_us,
                    "cpu_s": cpu_s,
                    "wall_s": wall_s,
                    "n_gpus": n_gpus,
                },
                f,
                indent=1,
            )
    print(
        f"nvml: fast_us_p90_under_load={fast_p90:.1f} "
        f"collector_cpu_ms_per_gpu_s_10hz={cpu_ms_per_gpu_s:.3f} raw_calls_us={raw:.1f}"
    )


if __name__ == "__main__":
    main()
