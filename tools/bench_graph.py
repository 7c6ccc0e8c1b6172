"""Benchmark the graph compiler on any ONNX model with static input shapes.

Compiles the model (default policy: INT8 → FP16 → FP32, CPU target; the accepted candidates
timed on this CPU by the compiler's measurer, the fastest that beats FP32 kept), then measures
in one run
the raw model under ORT_DISABLE_ALL, the raw model under ORT_ENABLE_ALL (the free baseline to
beat) and the compiled artifact under ORT_ENABLE_ALL: latency as the median of --runs timed
runs per variant, interleaved in shuffled blocks inside one fresh subprocess (2 threads), and
peak RSS (VmHWM) in one fresh subprocess per variant. Accuracy is measured against the raw
FP32 model on held-out seeded inputs (a different seed from the calibration inputs).

The CPU model and ISA (AVX2, AVX-512, VNNI, AMX) are logged and end the last line: INT8 gains
depend on them (research note, finding 7). Progress goes to stderr; the last line is
  graph: model=<name> ort_all_ms=<n> ours_ms=<n> ratio=<n> raw_rss_mb=<n> ours_rss_mb=<n>
         cosine=<n> max_abs_err=<n> fallback_nodes=<n> precision=<p> isa=<a+b+...>
(on one line). Usage: python tools/bench_graph.py MODEL.onnx [--runs 50] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import onnx

from seedance.graph_compiler import PrecisionPolicy, compile_model
from seedance.graph_compiler import sessions as runtime
from seedance.graph_compiler.core.accuracy import compare_outputs
from seedance.graph_compiler.measuring import (
    OrtMeasurer,
    Variant,
    measure_latency,
    measure_peak_rss_mb,
)

GOAL_RATIO = 0.5
GOAL_COSINE = 0.999


def log(msg: str) -> None:
    print(f"[bench-graph {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--runs", type=int, default=50, help="timed runs per variant (>= 50)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--calibration-samples", type=int, default=8)
    ap.add_argument("--select-runs", type=int, default=20, help="timed runs in the compile")
    ap.add_argument("--out", type=Path, default=Path("build/bench"))
    args = ap.parse_args(argv)
    name = args.model.stem
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    log(
        f"model {args.model} ({args.model.stat().st_size / 1e6:.1f} MB); loadavg {load[0]:.2f}, "
        f"{os.cpu_count()} CPUs shared with other users: figures are medians, compare within run"
    )

    measurer = OrtMeasurer(runs=args.select_runs, threads=args.threads, seed=args.seed)
    log(f"machine: {measurer.target.machine}")
    raw = onnx.load(str(args.model))
    policy = PrecisionPolicy(calibration_samples=args.calibration_samples, seed=args.seed)
    t0 = time.perf_counter()
    result = compile_model(raw, policy, measurer)
    rep = result.report
    log(
        f"compiled in {time.perf_counter() - t0:.1f} s: precision={rep.precision} "
        f"kind={rep.model_kind} nodes {rep.before.nodes} -> {rep.after.nodes}, "
        f"passes fired: {', '.join(rep.passes_fired) or 'none'}"
    )
    for p in rep.passes:
        log(f"  pass {p.name}: fired={p.fired} nodes {p.nodes_before}->{p.nodes_after} {p.detail}")
    for c in rep.candidates:
        log(f"  candidate {c.candidate}: {c.reason}; {c.verdict}")
    for v in rep.timings:
        ms = f"{v.median_ms:.2f} ms" if v.median_ms is not None else "-"
        log(f"  timed {v.candidate:8s} {v.profile.label:8s} {ms:>10s}  {v.reason}")
    for f in rep.fallback_nodes:
        log(f"  fallback {f.node} ({f.op_type}) kept in {f.kept_in}: {f.reason}")
    ours_path = args.out / f"{name}.compiled.onnx"
    ours_path.write_bytes(result.model_bytes)

    # Held-out accuracy: inputs from another seed than the calibration set.
    evals = runtime.sample_inputs(raw, args.eval_samples, args.seed + 1000)
    ref_sess = runtime.make_session(raw, "disable", args.threads)
    ours_sess = runtime.make_session(result.model_bytes, "all", args.threads)
    acc = compare_outputs(
        [runtime.run(ref_sess, f) for f in evals], [runtime.run(ours_sess, f) for f in evals]
    )
    del ref_sess, ours_sess
    log(
        f"held-out accuracy over {args.eval_samples} samples: min cosine {acc.min_cosine:.6f}, "
        f"max abs err {acc.max_abs_err:.3g}, non-finite {acc.nonfinite_count}"
    )

    feeds = evals[0]
    v_raw = Variant(name="raw_disable", path=args.model, level="disable")
    v_all = Variant(name="ort_all", path=args.model, level="all")
    v_ours = Variant(name="ours", path=ours_path, level="all")
    log(f"latency: {args.runs} timed runs per variant, interleaved, {args.threads} threads ...")
    lat = measure_latency(
        [v_raw, v_all, v_ours], feeds, runs=args.runs, threads=args.threads, seed=args.seed
    )
    for k, s in lat.items():
        log(
            f"  {k:12s} median {s.median_ms:8.2f} ms  p90 {s.p90_ms:8.2f}  min {s.min_ms:8.2f} "
            f"({s.runs} runs)"
        )
    rss = {}
    for v in (v_raw, v_all, v_ours):
        rss[v.name] = measure_peak_rss_mb(v, feeds, threads=args.threads)
        log(f"  {v.name:12s} peak RSS {rss[v.name]:7.1f} MB (fresh process, load + 1 run)")

    ratio = lat["ours"].median_ms / lat["ort_all"].median_ms
    goals = {
        "ratio<=0.5": ratio <= GOAL_RATIO,
        "cosine>=0.999": acc.min_cosine >= GOAL_COSINE,
        "ours_rss<=raw_rss": rss["ours"] <= rss["raw_disable"],
    }
    log("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items()))
    log(f"loadavg at end {os.getloadavg()[0]:.2f}")
    print(
        f"graph: model={name} ort_all_ms={lat['ort_all'].median_ms:.2f} "
        f"ours_ms={lat['ours'].median_ms:.2f} ratio={ratio:.3f} "
        f"raw_rss_mb={rss['raw_disable']:.1f} ours_rss_mb={rss['ours']:.1f} "
        f"cosine={acc.min_cosine:.6f} max_abs_err={acc.max_abs_err:.4g} "
        f"fallback_nodes={len(rep.fallback_nodes)} precision={rep.precision} "
        f"isa={'+'.join(measurer.target.isa) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
