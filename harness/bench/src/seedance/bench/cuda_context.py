"""What one more process on a GPU costs in GPU memory: the CUDA context a co-located pod brings.

Run on a GPU machine (the `device` tool's H100/H200) with python3, nvidia-smi and, for the
second kind, torch:

    PYTHONPATH=harness/bench/src python3 -m seedance.bench.cuda_context

For each kind of process, 1, 2 and 3 of them are started at once on GPU 0; each makes its
context and holds it, and nvidia-smi then reads the GPU's used memory and each process's own
(`--query-compute-apps=pid,used_memory`):

- `driver`: the CUDA driver API alone (ctypes: `cuInit`, `cuCtxCreate`, one 2 MiB `cuMemAlloc`):
  the bare context, the least any CUDA process holds;
- `torch`: torch with a cuBLAS handle (one small bf16 matmul): what a serving process holds
  before its weights, which is what a second pod on a shared GPU adds beside the first.

The last line is `cuda_context: gpu=<name> driver_mib=<per process> torch_mib=<per process>`,
the per-process figure being the median over the three runs of (used delta / processes). The
share benchmark's per-pod reserve (`SharingConfig.context_reserve_mib`) is set from it.

Measured 2026-12-05 on the device tool's H200 (driver 580.159.04, torch 2.11 + CUDA 13.0),
with this measurement passed inline (the tool copies the main checkout, where this module did
not exist yet): driver +529 / +1,055 / +1,580 MiB for 1 / 2 / 3 processes (520 MiB each by
nvidia-smi's own count), torch +719 / +1,435 / +2,150 (710 each):
`cuda_context: gpu=NVIDIA_H200 driver_mib=528 torch_mib=718`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

DRIVER = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
ptr = ctypes.c_uint64(); assert cu.cuMemAlloc_v2(ctypes.byref(ptr), 2 << 20) == 0
print("ready", flush=True); sys.stdin.read()
"""

TORCH = r"""
import sys, torch
x = torch.ones(256, 256, device="cuda", dtype=torch.bfloat16)
(x @ x).sum().item()
torch.cuda.synchronize()
print("ready", flush=True); sys.stdin.read()
"""


def _smi(*query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", *query, "--format=csv,noheader,nounits", "-i", "0"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line]


def _used_mib() -> float:
    return float(_smi("--query-gpu=memory.used")[0][0])


def _settled_used_mib() -> float:
    """The used memory once two reads 0.5 s apart agree (a context freed a moment ago)."""
    last = _used_mib()
    for _ in range(20):
        time.sleep(0.5)
        now = _used_mib()
        if now == last:
            return now
        last = now
    return last


def _run(code: str, n: int) -> tuple[float, list[float]]:
    before = _settled_used_mib()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(n)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"client did not start: {line!r}")
        time.sleep(1.0)  # nvidia-smi's process list lags a new context a little
        after = _used_mib()
        pids = {str(p.pid) for p in procs}
        own = [
            float(mib) for pid, mib in _smi("--query-compute-apps=pid,used_memory") if pid in pids
        ]
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=30)
    return (after - before) / n, own


def main() -> int:
    name = _smi("--query-gpu=name,memory.total")[0]
    print(f"gpu 0: {name[0]}, {name[1]} MiB total")
    per: dict[str, float] = {}
    for kind, code in (("driver", DRIVER), ("torch", TORCH)):
        figures = []
        for n in (1, 2, 3):
            try:
                each, own = _run(code, n)
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                print(f"{kind} x{n}: failed: {exc}")
                continue
            figures.append(each)
            print(
                f"{kind} x{n}: GPU used +{each * n:.0f} MiB = {each:.0f} MiB per process; "
                f"nvidia-smi per process {own}"
            )
        per[kind] = statistics.median(figures) if figures else float("nan")
    print(
        f"cuda_context: gpu={name[0].replace(' ', '_')} driver_mib={per['driver']:.0f} "
        f"torch_mib={per['torch']:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
