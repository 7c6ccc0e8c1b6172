"""Latency and peak memory of model variants, each measured in a fresh Python subprocess.

Owns the measurement protocol: peak RSS is the child's VmHWM (procfs) after import, session
creation and the timed runs, so nothing the parent holds leaks into it (``ru_maxrss`` would:
a child inherits its parent's high-water mark); latency is measured with all variants loaded
in one child and run interleaved in shuffled blocks, so load from other processes on a shared
machine hits every variant alike. This is the compiler's imperative edge: it spawns processes
and reads the clock, and the pure passes never call it.

Run as a script (``python measure.py SPEC``) it is the child.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["LatencyStats", "Variant", "measure_latency", "measure_peak_rss_mb"]


@dataclass(frozen=True, kw_only=True)
class Variant:
    name: str
    path: Path
    level: str  # "disable" | "basic" | "extended" | "all"


@dataclass(frozen=True, kw_only=True)
class LatencyStats:
    median_ms: float
    p90_ms: float
    min_ms: float
    runs: int


def _child(spec: dict, feeds: Mapping[str, np.ndarray], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="gc-measure-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, **feeds)
        return _spawn(json.dumps({**spec, "feeds": str(feeds_path)}), timeout_s)


def _spawn(spec_json: str, timeout_s: float) -> dict:
    proc = subprocess.run(
        # Run by file path, not ``-m``: importing the package would pull onnx and onnxscript
        # into the child and into its peak RSS.
        [sys.executable, str(Path(__file__).resolve()), spec_json],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"measurement child failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_peak_rss_mb(
    variant: Variant,
    feeds: Mapping[str, np.ndarray],
    threads: int = 2,
    runs: int = 1,
    timeout_s: float = 600,
) -> float:
    """Peak RSS of a fresh process that imports onnxruntime, loads the model and runs it."""
    spec = {
        "mode": "rss",
        "variants": [[variant.name, str(variant.path), variant.level]],
        "threads": threads,
        "runs": runs,
        "seed": 0,
    }
    return float(_child(spec, feeds, timeout_s)["peak_rss_mb"])


def measure_latency(
    variants: Sequence[Variant],
    feeds: Mapping[str, np.ndarray],
    runs: int = 50,
    threads: int = 2,
    seed: int = 0,
    timeout_s: float = 900,
) -> dict[str, LatencyStats]:
    """Median/p90/min per variant over ``runs`` timed runs each, interleaved in one child."""
    spec = {
        "mode": "latency",
        "variants": [[v.name, str(v.path), v.level] for v in variants],
        "threads": threads,
        "runs": runs,
        "seed": seed,
    }
    out = _child(spec, feeds, timeout_s)
    return {k: LatencyStats(**v) for k, v in out["latency"].items()}


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _main(spec_json: str) -> None:
    import random
    import time

    # Only onnxruntime and numpy are imported here: the child's peak RSS is the model's cost
    # plus the runtime's import, as a serving process would see it.
    import onnxruntime as ort

    spec = json.loads(spec_json)
    variants = spec["variants"]
    threads, runs = int(spec["threads"]), int(spec["runs"])
    with np.load(spec["feeds"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    sessions = {}
    for name, path, level in variants:
        so = ort.SessionOptions()
        so.graph_optimization_level = levels[level]
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        # Several sessions share this process and 2 cores: a finished session's pool must not
        # spin-wait (ORT's default) and steal the CPU from the next variant's run.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions[name] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for s in sessions.values():  # warm-up: first run allocates and pre-packs
        s.run(None, feeds)
    if spec["mode"] == "rss":
        for _ in range(runs - 1):
            for s in sessions.values():
                s.run(None, feeds)
        sys.stdout.write(json.dumps({"peak_rss_mb": _vm_hwm_mb()}) + "\n")
        return
    # Round-robin single runs in a fresh shuffled order each round: on a machine shared with
    # other users, load comes in bursts, and one run of each variant per round spreads every
    # burst over all variants alike (blocks of runs let one variant absorb a whole burst).
    times: dict[str, list[float]] = {name: [] for name in sessions}
    rng = random.Random(int(spec["seed"]))
    for _ in range(runs):
        order = list(sessions)
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            sessions[name].run(None, feeds)
            times[name].append((time.perf_counter() - t0) * 1e3)
    result = {
        name: {
            "median_ms": float(np.median(t)),
            "p90_ms": float(np.percentile(t, 90)),
            "min_ms": float(np.min(t)),
            "runs": len(t),
        }
        for name, t in times.items()
    }
    sys.stdout.write(json.dumps({"latency": result}) + "\n")


if __name__ == "__main__":
    _main(sys.argv[1])
