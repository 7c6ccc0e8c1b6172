"""The MPS limits the node agent hands a shared GPU's container, checked against a real daemon.

Run on a GPU machine with ``nvidia-cuda-mps-control`` and python3 with torch (the `device`
tool's H200). The node agent's Allocate gives a shared GPU's container
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<pct>``;
this script shows what those two do to a real client process:

- without a daemon (control): the memory limit is not enforced, a 3 GiB allocation succeeds;
- with an MPS control daemon started as a user-space process for this check only (its pipe and
  log directories under ``/tmp``; the GPU's compute mode and every other GPU setting are left as
  they are, and the daemon is told to quit at the end): a client with a 2,048 MiB limit gets
  1 GiB and is refused 3 GiB; a client at 20 % of the threads runs a bf16 matmul at a fraction of
  the rate a client at 100 % gets, and sees fewer SMs.

The last line is ``mps: daemon=<ok|failed|absent> mem_limit_refuses=<bool>
thread_pct_20_rate_ratio=<r> sms_20=<n> sms_100=<n>``. Where the daemon cannot start the
limits stay unverified, and the line says ``daemon=failed`` with the reason printed above it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CLIENT = r"""
import json, sys, time, torch
mode = sys.argv[1]
out = {"sms": torch.cuda.get_device_properties(0).multi_processor_count}
if mode == "mem":
    a = torch.empty(1024**3, dtype=torch.uint8, device="cuda")
    out["alloc_1gib"] = True
    try:
        b = torch.empty(3 * 1024**3, dtype=torch.uint8, device="cuda")
        out["alloc_3gib"] = True
    except torch.OutOfMemoryError as exc:
        out["alloc_3gib"] = False
        out["refusal"] = str(exc).splitlines()[0][:200]
else:
    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        x @ y
    torch.cuda.synchronize()
    reps = 40
    t = time.perf_counter()
    for _ in range(reps):
        x @ y
    torch.cuda.synchronize()
    out["tflops"] = 2 * n**3 * reps / (time.perf_counter() - t) / 1e12
print(json.dumps(out), flush=True)
"""


def _client(mode: str, env: dict[str, str]) -> dict[str, object]:
    try:
        p = subprocess.run(
            [sys.executable, "-c", CLIENT, mode],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=45,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 45 s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def _control(cmd: str, env: dict[str, str]) -> str:
    p = subprocess.run(
        ["nvidia-cuda-mps-control"],
        input=cmd + "\n",
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return (p.stdout + p.stderr).strip()


def start_daemon(root: str | None = None) -> dict[str, str]:
    """Start a control daemon with its pipe and log directories under ``root``; its clients'
    environment. Raises ``RuntimeError`` with the daemon's words if it does not start."""
    # A fixed directory (not the default /tmp/nvidia-mps), so that no other program's client
    # reaches this daemon, and a shell can tell it to quit if this script is killed.
    root = root or os.environ.get(
        "SEEDANCE_MPS_DIR", os.path.join(tempfile.gettempdir(), "seedance-mps")
    )
    dirs = {
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
    }
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    start = subprocess.run(
        ["nvidia-cuda-mps-control", "-d"],
        env={**os.environ, **dirs},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if start.returncode != 0:
        raise RuntimeError(f"nvidia-cuda-mps-control -d: rc={start.returncode} {start.stderr}")
    time.sleep(1.0)
    return dirs


def stop_daemon(dirs: dict[str, str]) -> str:
    """Tell the daemon to quit (its servers end with it)."""
    return _control("quit", dirs)


def main() -> None:
    if shutil.which("nvidia-cuda-mps-control") is None:
        print("mps: no nvidia-cuda-mps-control on PATH: the limits stay unverified")
        print("mps: daemon=absent mem_limit_refuses=None thread_pct_20_rate_ratio=nan")
        return
    mem_env = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M"}
    control = _client("mem", mem_env)
    print(f"no daemon, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M: {control}")
    results: dict[str, dict[str, object]] = {}
    try:
        dirs = start_daemon()
        daemon = "ok"
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"the MPS daemon did not start: {exc}")
        daemon = "failed"
    if daemon == "ok":
        try:
            results["mem"] = _client("mem", {**dirs, **mem_env})
            pct = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
            results["pct100"] = _client("rate", {**dirs, pct: "100"})
            results["pct20"] = _client("rate", {**dirs, pct: "20"})
            print(f"server list: {_control('get_server_list', dirs)!r}")
        finally:
            print(f"quit: {stop_daemon(dirs)!r}")
        for name, r in results.items():
            print(f"mps client {name}: {r}")
        control_log = os.path.join(dirs["CUDA_MPS_LOG_DIRECTORY"], "control.log")
        if any("error" in r for r in results.values()) and os.path.exists(control_log):
            with open(control_log) as f:
                print("control.log tail:", f.read()[-1500:])
    mem = results.get("mem", {})
    refuses = None if "alloc_3gib" not in mem else (mem["alloc_3gib"] is False)
    if control.get("alloc_3gib") is not True:
        refuses = None  # the control must succeed, or the refusal proves nothing
    r100, r20 = results.get("pct100", {}), results.get("pct20", {})
    ratio = float("nan")
    if isinstance(r100.get("tflops"), float) and isinstance(r20.get("tflops"), float):
        ratio = float(r20["tflops"]) / float(r100["tflops"])  # type: ignore[arg-type]
    if any("error" in r for r in results.values()):
        daemon = "failed"
    print(
        f"mps: daemon={daemon} mem_limit_refuses={refuses} thread_pct_20_rate_ratio={ratio:.3f} "
        f"sms_20={r20.get('sms')} sms_100={r100.get('sms')}"
    )


if __name__ == "__main__":
    main()
