"""Benchmark the graph compiler for a GPU: compile with target=cuda and time it on the CUDA EP.

Needs onnxruntime-gpu (CUDAExecutionProvider) and a GPU; runs without ``make install`` (the
device machine has no registry): only numpy, onnx, onnxscript, onnx_ir and onnxruntime are
imported, from ``services/graph-compiler/src`` on PYTHONPATH (``make bench-graph-gpu`` sets it).

In one run: the model is compiled with ``target=cuda`` (candidates timed on the CUDA EP by the
compiler's own measurer; INT8 is not a candidate there), then one interleaved timing child
measures, at batch 1 with the model's static shapes, as medians of --runs timed runs:
  ort_cuda_fp32  the raw model under ORT_ENABLE_ALL, plain ``InferenceSession.run`` with numpy
                 feeds (the anchor of ``ratio``);
  tuned_fp32     the best hand-tuned FP32 session of the raw model: IO binding + CUDA graph
                 (and NHWC kernels for a CNN), the fastest of them (the anchor of
                 ``ratio_vs_tuned``, the compiler's own merit);
  ours           the artifact under the deployment profile it carries, through the same runner
                 ``load_session`` uses (inputs copied in, outputs copied back to numpy per run).
Every session gets the same protocol: --warmup untimed round-robin runs, then --runs timed ones
in a shuffled round-robin, no garbage collection while timing; each figure is the median of all
of its runs, logged with its p10-p90 spread and the median of each of --rounds consecutive
blocks, and ``ratio`` is also computed per block (``ratio_by_round``), so a reader sees how far
one shorter measurement could have moved it.
Accuracy: held-out seeded inputs (another seed than calibration) through the artifact on the
GPU via ``load_session`` against the raw FP32 model on the CPU EP (ORT_DISABLE_ALL); min cosine
over every output and sample.

Progress goes to stderr; the last line is
  graph_gpu: model=<name> ort_cuda_fp32_ms=<n> tuned_fp32_ms=<n> ours_ms=<n> ratio=<n>
             ratio_vs_tuned=<n> cosine=<n> precision=<p> profile=<label>
             ort_cuda_fp32_p10_p90_ms=<a>/<b> ratio_by_round=<r1>/<r2>/...
(on one line). Usage: python tools/bench/bench_graph_gpu.py MODEL.onnx [--runs 300]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx

from seedance.graph_compiler import Precision, PrecisionPolicy, Target, compile_model
from seedance.graph_compiler import sessions as runtime
from seedance.graph_compiler.core.accuracy import compare_outputs
from seedance.graph_compiler.core.profile import CUDA_EP, SessionProfile, triton_config
from seedance.graph_compiler.deployment import load_session
from seedance.graph_compiler.measuring import OrtMeasurer, Variant, measure_latency

GOAL_RATIO = 0.35
GOAL_RATIO_VS_TUNED = 0.8
GOAL_COSINE = 0.999


def log(msg: str) -> None:
    print(f"[bench-graph-gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _prof(p: SessionProfile) -> dict:
    return json.loads(p.to_json())


def _log_choices(rep: Any) -> None:
    """What the compile tried and kept (to stderr; the last line carries only the figures)."""
    for c in rep.candidates:
        log(f"  candidate {c.candidate}: {c.reason}; {c.verdict}")
    for v in rep.timings:
        ms = f"{v.median_ms:.3f} ms" if v.median_ms is not None else "-"
        log(f"  timed {v.candidate:8s} {v.profile.label:22s} {ms:>10s}  {v.reason}")
    for n in rep.profile.notes:
        log(f"  profile note: {n}")
    for f in rep.fallback_nodes[:20]:
        log(f"  fallback {f.node} ({f.op_type}) kept in {f.kept_in}: {f.reason}")


def _variants(args: argparse.Namespace, ours: SessionProfile, ours_path: Path) -> list[Variant]:
    """The sessions timed: ORT's plain CUDA EP, the tuned FP32 ones, ours, then diagnostics."""
    plain = SessionProfile(provider=args.provider)
    tuned = [replace(plain, io_binding=True)]
    if args.provider == CUDA_EP:
        tuned += [
            replace(plain, io_binding=True, cuda_graph=True),
            replace(plain, io_binding=True, cuda_graph=True, prefer_nhwc=True),
        ]
    variants = [Variant(name="ort_cuda_fp32", path=args.model, profile=_prof(plain))]
    variants += [
        Variant(name=f"tuned_fp32[{p.label}]", path=args.model, profile=_prof(p)) for p in tuned
    ]
    variants.append(Variant(name="ours", path=ours_path, profile=_prof(ours)))
    # Diagnostics, not in the last line: the raw FP32 model under the tuned profiles plus the
    # provider options ours won with (how much of ours is the options, how much the artifact);
    # and the same sessions with inputs and outputs left on the device (no per-run copies), to
    # show how much of each figure the copies are.
    if ours.provider_options:
        for p in tuned[1:]:
            with_opts = replace(p, provider_options=ours.provider_options)
            variants.append(
                Variant(
                    name=f"diag_fp32_with_ours_options[{with_opts.label}]",
                    path=args.model,
                    profile=_prof(with_opts),
                )
            )
    if ours.io_binding:
        resident = {**_prof(ours), "resident": True}
        variants.append(Variant(name="diag_ours_resident", path=ours_path, profile=resident))
        for p in tuned[1:]:
            variants.append(
                Variant(
                    name=f"diag_tuned_fp32_resident[{p.label}]",
                    path=args.model,
                    profile={**_prof(p), "resident": True},
                )
            )
    return variants


def _log_latency(lat: dict[str, Any]) -> None:
    for k, s in lat.items():
        if s.error:
            log(f"  {k:34s} could not run: {s.error}")
            continue
        blocks = "/".join(f"{m:.3f}" for m in s.round_medians)
        log(
            f"  {k:34s} median {s.median_ms:8.3f} ms  p10 {s.p10_ms:8.3f}  p90 {s.p90_ms:8.3f}"
            f"  min {s.min_ms:8.3f}  by round {blocks}"
        )


def _accuracy(raw: onnx.ModelProto, model_bytes: bytes, evals: list) -> Any:
    """Held-out outputs of the served model against the unoptimised FP32 reference."""
    ref_sess = runtime.make_session(raw, "disable", 4)
    ref = [runtime.run(ref_sess, f) for f in evals]
    del ref_sess
    served = load_session(model_bytes)
    acc = compare_outputs(ref, [served.run(f) for f in evals])
    del served
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--runs", type=int, default=600, help="timed runs per variant")
    ap.add_argument("--warmup", type=int, default=50, help="untimed runs per variant first")
    ap.add_argument("--rounds", type=int, default=3, help="blocks the timed runs are cut in")
    ap.add_argument("--select-runs", type=int, default=100, help="timed runs in the compile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--calibration-samples", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    # A dry run of the same flow on a machine without a GPU (the figures mean nothing there).
    ap.add_argument("--provider", default=CUDA_EP, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    name = args.model.stem
    args.out.mkdir(parents=True, exist_ok=True)

    measurer = OrtMeasurer(args.provider, runs=args.select_runs, seed=args.seed)
    log(f"machine: {measurer.target.machine}")
    log(f"model {args.model} ({args.model.stat().st_size / 1e6:.1f} MB)")
    raw = onnx.load(str(args.model))
    policy = PrecisionPolicy(
        target=Target.CUDA if args.provider == CUDA_EP else Target.CPU,
        calibration_samples=args.calibration_samples,
        seed=args.seed,
    )
    t0 = time.perf_counter()
    result = compile_model(raw, policy, measurer)
    rep = result.report
    log(
        f"compiled in {time.perf_counter() - t0:.1f} s: precision={rep.precision} "
        f"profile={rep.profile.label} nodes {rep.before.nodes} -> {rep.after.nodes}"
    )
    _log_choices(rep)
    ours_path = args.out / f"{name}.cuda.onnx"
    ours_path.write_bytes(result.model_bytes)
    (args.out / f"{name}.config.pbtxt").write_text(
        triton_config(name, onnx.load_from_string(result.model_bytes), rep.profile)
    )

    evals = runtime.sample_inputs(raw, args.eval_samples, args.seed + 1000)
    acc = _accuracy(raw, result.model_bytes, evals)
    log(
        f"held-out accuracy on the GPU over {args.eval_samples} samples: min cosine "
        f"{acc.min_cosine:.6f}, max abs err {acc.max_abs_err:.3g}, non-finite "
        f"{acc.nonfinite_count}"
    )

    variants = _variants(args, rep.profile, ours_path)
    log(f"latency: {args.runs} timed runs per variant, interleaved, one child ...")
    lat = measure_latency(
        variants,
        evals[0],
        runs=args.runs,
        seed=args.seed,
        warmup=args.warmup,
        rounds=args.rounds,
    )
    _log_latency(lat)
    tuned_ok = {k: s for k, s in lat.items() if k.startswith("tuned_fp32") and not s.error}
    tuned_name = min(tuned_ok, key=lambda k: tuned_ok[k].median_ms)
    base_ms = lat["ort_cuda_fp32"].median_ms
    tuned_ms = tuned_ok[tuned_name].median_ms
    ours_ms = lat["ours"].median_ms
    ratio, ratio_tuned = ours_ms / base_ms, ours_ms / tuned_ms
    base = lat["ort_cuda_fp32"]
    by_round = [o / b for o, b in zip(lat["ours"].round_medians, base.round_medians, strict=True)]
    goals = {
        f"ratio<={GOAL_RATIO}": ratio <= GOAL_RATIO,
        f"ratio_vs_tuned<={GOAL_RATIO_VS_TUNED}": ratio_tuned <= GOAL_RATIO_VS_TUNED,
        "ratio<=1.0": ratio <= 1.0,
        f"cosine>={GOAL_COSINE}": acc.min_cosine >= GOAL_COSINE,
    }
    log(f"tuned FP32 anchor: {tuned_name}")
    log("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items()))
    precision = str(rep.precision) if rep.precision is not Precision.FP32 else "fp32"
    print(
        f"graph_gpu: model={name} ort_cuda_fp32_ms={base_ms:.3f} tuned_fp32_ms={tuned_ms:.3f} "
        f"ours_ms={ours_ms:.3f} ratio={ratio:.3f} ratio_vs_tuned={ratio_tuned:.3f} "
        f"cosine={acc.min_cosine:.6f} precision={precision} profile={rep.profile.label} "
        f"ort_cuda_fp32_p10_p90_ms={base.p10_ms:.3f}/{base.p90_ms:.3f} "
        f"ratio_by_round={'/'.join(f'{r:.3f}' for r in by_round)}"
    )
    return 0
