"""The graph compiler's one measurer: candidates timed and run on the target execution provider.

Owns the measurement protocol and the machine description:

* latency: all variants of one call loaded in one fresh child process and run round-robin in
  a shuffled order each round, so load from other processes on a shared machine hits every
  variant alike; each variant runs under its own ``SessionProfile`` (plain ``run`` with numpy
  feeds, IO binding, CUDA-graph replay), through ``ProfiledRunner``, the same code that
  ``load_session`` serves an artifact with, so what is timed is what is deployed; warm-up
  rounds before timing, no garbage collection while timing, and median, p10, p90 and the
  median of each block of rounds reported, so one figure is not one noisy sample;
* peak RSS: the VmHWM (procfs) of a fresh child after import, session creation and one run,
  so nothing the parent holds leaks into it (``ru_maxrss`` would: a child inherits its
  parent's high-water mark);
* outputs on the target provider, for the accuracy check of GPU candidates (the CPU provider
  casts FP16 weights back to FP32 and would hide FP16 overflow; research note, finding 4);
* ``describe_machine``: CPU model and ISA (AVX2, AVX-512, VNNI, AMX) or the GPU.

This is the compiler's imperative edge: it spawns processes, reads the clock and the machine.
The pure core sees it only through the ``Measurer`` protocol (``core/selection.py``) that
``compile_model`` is handed. Run as a script (``python measuring.py SPEC``) it is the child; as
such it imports only numpy and onnxruntime, so a child's peak RSS is the model's cost plus the
runtime's import, as a serving process would see it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "OrtMeasurer",
    "ProfiledRunner",
    "Variant",
    "describe_machine",
    "measure_latency",
    "measure_peak_rss_mb",
    "session_providers",
]

_CPU_EP = "CPUExecutionProvider"
_CUDA_EP = "CUDAExecutionProvider"
# The ISA features that decide whether INT8 and FP32 kernels are fast on a CPU (MLAS picks its
# kernels by them: VNNI for INT8 dot products, AMX tiles on Sapphire Rapids and later).
_ISA_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


@dataclass(frozen=True, kw_only=True)
class Variant:
    """A model file and how to run it. ``profile`` is a ``SessionProfile``'s JSON dict (the
    child does not import the package); ``level`` alone means a plain CPU session."""

    name: str
    path: Path
    level: str = "all"  # "disable" | "basic" | "extended" | "all"
    profile: Mapping[str, Any] | None = None

    def spec(self) -> dict[str, Any]:
        prof = dict(self.profile or {"provider": _CPU_EP, "opt_level": self.level})
        return {"name": self.name, "path": str(self.path), "profile": prof}


@dataclass(frozen=True, kw_only=True)
class LatencyStats:
    median_ms: float
    p90_ms: float
    min_ms: float
    runs: int
    error: str | None = None  # the variant could not be created or run under its profile
    p10_ms: float = float("nan")
    # The median of each consecutive block of rounds (``rounds`` > 1): how far one block's
    # figure can move, i.e. what a single shorter measurement would have been at the mercy of.
    round_medians: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "round_medians", tuple(self.round_medians))


# --- the machine ------------------------------------------------------------------------------


def _cpu_description() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return model, tuple(f for f in _ISA_FLAGS if f in flags)


def _gpu_description() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    return line or None


def describe_machine(provider: str = _CPU_EP):
    """``TargetInfo`` for ``provider`` on this machine (imports the core lazily: the child
    process never calls this)."""
    from seedance.graph_compiler.core.profile import TargetInfo

    cpu, isa = _cpu_description()
    cores = os.cpu_count() or 0
    if provider == _CUDA_EP:
        gpu = _gpu_description() or "unknown NVIDIA GPU"
        return TargetInfo(
            provider=provider,
            machine=f"GPU {gpu}; host CPU {cpu} ({cores} cores)",
            isa=isa,
            gpu=gpu,
            int8_accelerated=False,
        )
    return TargetInfo(
        provider=provider,
        machine=f"CPU {cpu} ({cores} cores; {'+'.join(isa) or 'no AVX2'})",
        isa=isa,
        # Without VNNI the u8s8 dot products run on plain AVX2: slower, still timed to decide.
        int8_accelerated=True,
    )


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def provider_loads(provider: str) -> bool:
    """Whether a one-node session really runs on ``provider`` (ORT drops a provider whose
    libraries fail to load and carries on with the CPU, logging only)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(
            model.SerializeToString(),
            so,
            providers=[provider],
        )
    except Exception:  # any load failure means "not this provider"
        return False
    return provider in sess.get_providers()


# --- running under a profile (used by the child and by load_session) --------------------------


_NP_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def session_providers(profile: Mapping[str, Any]) -> list[Any]:
    """ORT's ``providers`` argument for a profile dict: on CUDA the provider options the
    profile's fields and ``provider_options`` say (``fuse_conv_bias``, ...)."""
    if profile.get("provider", _CPU_EP) != _CUDA_EP:
        return [_CPU_EP]
    graph = bool(profile.get("cuda_graph"))
    opts = {"device_id": "0", "enable_cuda_graph": "1" if graph else "0"}
    if profile.get("prefer_nhwc"):
        opts["prefer_nhwc"] = "1"
    opts.update({str(k): str(v) for k, v in dict(profile.get("provider_options") or {}).items()})
    # No CPU fallback under a CUDA graph: ORT refuses to capture a graph with CPU nodes, and
    # the refusal is the reason the profile records.
    return [(_CUDA_EP, opts)] if graph else [(_CUDA_EP, opts), _CPU_EP]


class ProfiledRunner:
    """An ORT session configured by a profile dict, with ``run(feeds) -> list[np.ndarray]``.

    With IO binding, inputs are copied into device buffers bound once and outputs come back
    from buffers bound once; with a CUDA graph those buffers are fixed, which is what replay
    needs (ORT captures on the first runs and replays after). Raises whatever ORT raises when
    the profile cannot hold (a node off the GPU under a CUDA graph, say)."""

    def __init__(
        self,
        model: str | bytes,
        profile: Mapping[str, Any],
        threads: int | None = None,
        quiet_pool: bool = False,
    ) -> None:
        import onnxruntime as ort

        self._ort = ort
        p = dict(profile)
        so = ort.SessionOptions()
        so.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[p.get("opt_level", "all")]
        n = threads if threads is not None else int(p.get("intra_op_threads", 0))
        if n:
            so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        if quiet_pool:
            # Several sessions share one process and few cores: a finished session's pool must
            # not spin-wait (ORT's default) and steal the CPU from the next variant's run.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.cuda = p.get("provider", _CPU_EP) == _CUDA_EP
        self.session = ort.InferenceSession(model, so, providers=session_providers(p))
        if self.cuda and _CUDA_EP not in self.session.get_providers():
            raise RuntimeError(f"{_CUDA_EP} was asked for but not loaded: {ort.get_device()}")
        self._graph = bool(p.get("cuda_graph"))
        self._resident = bool(p.get("resident"))
        self._io = bool(p.get("io_binding")) or self._graph
        self._binding = None
        self._inputs: dict[str, Any] = {}
        self._keep: list[np.ndarray] = []
        self._outputs: list[Any] = []
        self._names = [o.name for o in self.session.get_outputs()]
        self._in_types = {
            i.name: _NP_TYPES[i.type]
            for i in self.session.get_inputs()
            if i.type in ("tensor(float)", "tensor(float16)")
        }

    def _bind(self, feeds: Mapping[str, np.ndarray]) -> None:
        ort, dev = self._ort, ("cuda" if self.cuda else "cpu")
        b = self.session.io_binding()
        for name, arr in feeds.items():
            # A CPU OrtValue wraps the numpy buffer without copying: bind a private copy, or
            # the next run's update_inplace would overwrite the caller's first feeds.
            own = np.array(arr, copy=True, order="C")
            self._keep.append(own)
            v = ort.OrtValue.ortvalue_from_numpy(own, dev, 0)
            self._inputs[name] = v
            b.bind_ortvalue_input(name, v)
        # Output buffers from the declared static shapes: a plain run to learn them would,
        # under a CUDA graph, count towards the runs before capture with other addresses.
        shapes = [o.shape for o in self.session.get_outputs()]
        if not all(isinstance(d, int) for shape in shapes for d in shape):
            if self._graph:
                raise RuntimeError(f"CUDA graph needs static output shapes, got {shapes}")
            first = self.session.run(None, dict(feeds))
            shapes = [list(a.shape) for a in first]
        for o, shape in zip(self.session.get_outputs(), shapes, strict=True):
            dtype = _NP_TYPES.get(o.type, np.float32)
            v = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, dev, 0)
            self._outputs.append(v)
            b.bind_ortvalue_output(o.name, v)
        self._binding = b

    def prepare(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feeds`` in the session's input types: an artifact with float16 I/O takes float16
        (a caller whose preprocessing emits float16 pays no conversion; ``run`` converts
        float32 for the others)."""
        out = {}
        for name, arr in feeds.items():
            want = self._in_types.get(name)
            is_float = np.issubdtype(arr.dtype, np.floating)
            out[name] = (
                arr.astype(want) if want is not None and is_float and arr.dtype != want else arr
            )
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        feeds = self.prepare(feeds)
        if not self._io:
            return [np.asarray(o) for o in self.session.run(None, dict(feeds))]
        if self._binding is None:
            self._bind(feeds)
        elif self._resident:
            # Diagnostic only (the GPU bench): inputs already on the device and outputs left
            # there, as with Triton's CUDA shared memory: the run without the copies.
            self.session.run_with_iobinding(self._binding)
            self._binding.synchronize_outputs()
            return []
        else:
            for name, arr in feeds.items():
                self._inputs[name].update_inplace(np.ascontiguousarray(arr))
        self.session.run_with_iobinding(self._binding)
        # CPU-bound outputs are views of buffers the next run overwrites: hand out copies.
        return [v.numpy() if self.cuda else v.numpy().copy() for v in self._outputs]


# --- the child ---------------------------------------------------------------------------------


def _child(spec: dict, feeds: Mapping[str, np.ndarray], timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="gc-measure-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        np.savez(feeds_path, allow_pickle=False, **feeds)
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
        "variants": [variant.spec()],
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
    *,
    warmup: int = 3,
    rounds: int = 1,
) -> dict[str, LatencyStats]:
    """Median/p10/p90/min per variant over ``runs`` timed runs each, interleaved in one child,
    after ``warmup`` untimed runs of each (round-robin too); with ``rounds`` > 1 also each
    consecutive block's median. A variant whose profile cannot hold comes back with ``error``
    set and no figures."""
    if warmup < 1 or rounds < 1 or runs < rounds:
        raise ValueError(f"need warmup >= 1 and runs >= rounds >= 1: {warmup=} {runs=} {rounds=}")
    spec = {
        "mode": "latency",
        "variants": [v.spec() for v in variants],
        "threads": threads,
        "runs": runs,
        "seed": seed,
        "warmup": warmup,
        "rounds": rounds,
    }
    out = _child(spec, feeds, timeout_s)
    return {k: LatencyStats(**v) for k, v in out["latency"].items()}


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def _runners(
    spec: Mapping[str, Any], feeds: Mapping[str, np.ndarray]
) -> tuple[dict[str, ProfiledRunner], dict[str, str]]:
    """Each variant's runner, warmed up; and the variants that could not be created or run,
    with the reason."""
    threads = int(spec["threads"])
    runners: dict[str, ProfiledRunner] = {}
    failed: dict[str, str] = {}
    for v in spec["variants"]:
        prof = v["profile"]
        cpu_threads = threads if prof.get("provider", _CPU_EP) == _CPU_EP else None
        try:
            r = ProfiledRunner(v["path"], prof, threads=cpu_threads, quiet_pool=True)
            for _ in range(3):  # first runs: allocation, pre-packing, cuDNN plans, graph capture
                r.run(feeds)
            runners[v["name"]] = r
        except Exception as exc:  # ORT's own error types; the reason goes into the report
            failed[v["name"]] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    # Then warm-up rounds over all of them, as the timed rounds run: clocks, caches and the
    # allocator settle for every variant alike before anything is timed.
    for _ in range(max(0, int(spec.get("warmup", 3)) - 3)):
        for r in runners.values():
            r.run(feeds)
    return runners, failed


def _timed_runs(
    runners: Mapping[str, ProfiledRunner], feeds: Mapping[str, np.ndarray], runs: int, seed: int
) -> dict[str, list[float]]:
    """Round-robin single runs in a fresh shuffled order each round: on a machine shared with
    other users, load comes in bursts, and one run of each variant per round spreads every
    burst over all variants alike (blocks of runs let one variant absorb a whole burst)."""
    import gc
    import random
    import time

    times: dict[str, list[float]] = {name: [] for name in runners}
    # Each variant's feeds in its own input types, made once (a float16-I/O artifact's caller
    # hands it float16, as the FP32 anchors' callers hand them float32).
    typed = {name: r.prepare(feeds) for name, r in runners.items()}
    rng = random.Random(seed)
    # No garbage collection inside a timed run: a collection lands on whichever variant is
    # running and is noise, not that variant's cost.
    gc.collect()
    gc.disable()
    try:
        for _ in range(runs):
            order = list(runners)
            rng.shuffle(order)
            for name in order:
                t0 = time.perf_counter()
                runners[name].run(typed[name])  # outputs come back to host numpy: a request's cost
                times[name].append((time.perf_counter() - t0) * 1e3)
    finally:
        gc.enable()
    return times


def _stats(t: Sequence[float], rounds: int) -> dict[str, Any]:
    blocks = np.array_split(np.asarray(t), rounds) if rounds > 1 else []
    return {
        "median_ms": float(np.median(t)),
        "p10_ms": float(np.percentile(t, 10)),
        "p90_ms": float(np.percentile(t, 90)),
        "min_ms": float(np.min(t)),
        "runs": len(t),
        "round_medians": [float(np.median(b)) for b in blocks],
    }


def _main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    runs = int(spec["runs"])
    with np.load(spec["feeds"]) as npz:
        feeds = {k: npz[k] for k in npz.files}
    runners, failed = _runners(spec, feeds)
    if spec["mode"] == "rss":
        for _ in range(runs - 1):
            for r in runners.values():
                r.run(feeds)
        if failed:
            raise SystemExit(f"variant failed: {failed}")
        sys.stdout.write(json.dumps({"peak_rss_mb": _vm_hwm_mb()}) + "\n")
        return
    times = _timed_runs(runners, feeds, runs, int(spec["seed"]))
    rounds = int(spec.get("rounds", 1))
    result: dict[str, dict[str, Any]] = {name: _stats(t, rounds) for name, t in times.items()}
    for name, err in failed.items():
        result[name] = {
            "median_ms": float("nan"),
            "p90_ms": float("nan"),
            "min_ms": float("nan"),
            "runs": 0,
            "error": err,
        }
    sys.stdout.write(json.dumps({"latency": result}) + "\n")


# --- the measurer the compiler is handed -------------------------------------------------------


class OrtMeasurer:
    """The ``Measurer`` of ``core/selection.py`` on ONNX Runtime's ``provider`` on this machine.

    ``runs`` timed runs per variant (interleaved, one child per ``time`` call); CPU sessions get
    ``threads`` intra-op threads. A child is killed past ``timeout_s``, or earlier where the
    compile's ``budget`` (``sessions.RunBudget``: its slowest in-process run, what is left)
    says so (``RunBudgetExhausted``). Construction fails with ``ValueError`` when the provider is
    not in this ORT build (a CPU-only wheel has no CUDA EP), so a worker never claims a GPU it
    has not got."""

    def __init__(
        self,
        provider: str = _CPU_EP,
        *,
        runs: int = 20,
        threads: int = 2,
        seed: int = 0,
        timeout_s: float = 1200,
        warmup: int | None = None,
        budget: Any = None,
        run_timeout_s: float | None = None,
    ) -> None:
        have = available_providers()
        if provider not in have:
            raise ValueError(f"{provider} is not available in this onnxruntime ({', '.join(have)})")
        self.provider = provider
        self._runs, self._threads, self._seed, self._timeout_s = runs, threads, seed, timeout_s
        # A GPU run is ~1 ms, so a longer warm-up is cheap there (clocks, CUDA-graph replay);
        # on a CPU a run can take 100 ms and three settle the allocator and the pre-packing.
        self._warmup = warmup if warmup is not None else (20 if provider == _CUDA_EP else 3)
        self._target = describe_machine(provider)
        self._budget = budget  # the compile's ``sessions.RunBudget``: bounds the children
        self._run_timeout_s = run_timeout_s  # and, with it, ``outputs``' runs

    @property
    def target(self):
        return self._target

    def _files(self, tmp: Path, models: Sequence[tuple[str, bytes]]) -> dict[str, Path]:
        paths = {}
        for i, (name, data) in enumerate(models):
            p = tmp / f"v{i}.onnx"
            p.write_bytes(data)
            paths[name] = p
        return paths

    def time(self, variants, feeds):
        """``variants``: ``(name, model_bytes, SessionProfile)``; returns name -> LatencyStats."""
        with tempfile.TemporaryDirectory(prefix="gc-time-") as tmp:
            paths = self._files(Path(tmp), [(n, b) for n, b, _ in variants])
            vs = [Variant(name=n, path=paths[n], profile=_profile_dict(p)) for n, _, p in variants]
            each, what = max(self._warmup, 3) + self._runs, f"timing {len(vs)} variant(s)"
            args = (vs, feeds, self._runs, self._threads, self._seed)
            call = partial(measure_latency, *args, warmup=self._warmup)
            return self._bounded(what, len(vs), each, self._timeout_s, call)

    def outputs(self, model: bytes, profile, feeds):
        """Outputs of ``model`` on this provider for each feed (in process, bounded as the
        compile's own runs when given a budget: ``sessions.OrtSession``; no timing here)."""
        runner = ProfiledRunner(model, _profile_dict(profile), threads=self._threads)
        if self._budget is None or runner._io:
            return [runner.run(f) for f in feeds]
        from seedance.graph_compiler.sessions import OrtSession  # not in the child

        bounded = OrtSession(runner.session, self._run_timeout_s, self._budget)
        return [bounded.run(runner.prepare(f)) for f in feeds]

    def peak_rss_mb(self, model: bytes, profile, feeds) -> float:
        with tempfile.TemporaryDirectory(prefix="gc-rss-") as tmp:
            p = Path(tmp) / "m.onnx"
            p.write_bytes(model)
            v = Variant(name="m", path=p, profile=_profile_dict(profile))
            call = partial(measure_peak_rss_mb, v, feeds, threads=self._threads)
            return self._bounded("measuring peak RSS", 1, 3, 600.0, call)

    def _bounded(self, what: str, variants: int, each: int, cap_s: float, call: Any) -> Any:
        """``call(timeout_s=...)``, a child: under ``cap_s``, or ``RunBudget.run_child``."""
        if self._budget is None:
            return call(timeout_s=cap_s)
        return self._budget.run_child(what, variants, each, cap_s, call)


def _profile_dict(profile) -> dict[str, Any]:
    return json.loads(profile.to_json())


if __name__ == "__main__":
    _main(sys.argv[1])
