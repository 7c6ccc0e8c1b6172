"""`make demo`'s compile section: a small BERT-style encoder through the graph-compiler over the
bus, and what the compile did, read from the compiled artifact itself.

A compile does not shrink a graph's node count in general: INT8 quantization adds the nodes
that quantize activations and rescale results (dynamic quantization's DynamicQuantizeLinear,
Cast and Mul around each MatMulInteger; static QDQ's QuantizeLinear/DequantizeLinear pairs),
and fusion into ONNX Runtime's contrib ops (``com.microsoft``) removes some. So the section
names the precision, the file size before and after, and the operators added and removed, as
counted in the two graphs; it never calls the model smaller than it is.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import onnx

from seedance.bench.demo_console import say
from seedance.sdk import SeedanceClient
from seedance.testing.identities import ADMIN, password
from seedance.testing.processes import ServiceProcesses

__all__ = ["compile_phase", "describe_compile", "timed_line"]

CONTRIB = "com.microsoft"


def _ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(
        f"{n.op_type} ({CONTRIB})" if n.domain == CONTRIB else n.op_type for n in model.graph.node
    )


def _how_quantized(ops: Counter[str]) -> str:
    if ops["DynamicQuantizeLinear"]:
        return "dynamic quantization (weights stored as INT8, activations quantized at run time)"
    if ops["QuantizeLinear"]:
        return "static QDQ (QuantizeLinear/DequantizeLinear pairs around INT8 operators)"
    return ""


def describe_compile(before: onnx.ModelProto, after: onnx.ModelProto, precision: str) -> list[str]:
    """What the compile did, counted in the graphs: size, nodes, operators added and removed."""
    ops_before, ops_after = _ops(before), _ops(after)
    added, removed = ops_after - ops_before, ops_before - ops_after
    size_mb = (before.ByteSize() / 1e6, after.ByteSize() / 1e6)
    nodes = (len(before.graph.node), len(after.graph.node))
    how = _how_quantized(ops_after) if precision == "int8" else ""
    fused = sum(v for k, v in ops_after.items() if CONTRIB in k)
    why = ["quantizing adds nodes (below)"] if how and nodes[1] > nodes[0] else []
    why.append(f"{fused} nodes are fused contrib ops" if fused else "no fusion into contrib ops")
    return [
        f"  precision {precision}" + (f": {how}" if how else ""),
        f"  model {size_mb[0]:.2f} -> {size_mb[1]:.2f} MB; {nodes[0]} -> {nodes[1]} nodes: "
        + "; ".join(why),
        "  operators added: " + (_counts(added) or "none"),
        "  operators removed: " + (_counts(removed) or "none"),
    ]


def _counts(ops: Counter[str]) -> str:
    return ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


async def compile_phase(url: str, procs: ServiceProcesses) -> int:
    """Compile a small BERT-style encoder through the graph-compiler, over the bus."""
    from seedance.bench.models import build_bert

    say("")
    say("Compile: a 2-layer BERT-style encoder (random weights) through the graph-compiler")
    procs.start("graph-compiler", measure_runs="20")
    model = build_bert(layers=2, hidden=128, heads=4, ffn=512, vocab=1000, seq=64)
    client = await SeedanceClient.connect(url, user=ADMIN, password=password(ADMIN))
    try:
        t0 = time.monotonic()
        result = await client.compile_model(
            "acme", "bert-mini", model.SerializeToString(), timeout_s=600
        )
        elapsed_s = time.monotonic() - t0
        artifact = await client.fetch_artifact(result) if result.ok else b""
    finally:
        await client.close()
    if not result.ok or result.report is None:
        say(f"  compile failed: {result.error_kind}: {result.error}")
        return 1
    r = result.report
    for line in describe_compile(model, onnx.load_from_string(artifact), str(r.precision)):
        say(line)
    say(f"  passes: {', '.join(r.passes_fired)}; {elapsed_s:.1f} s")
    say(timed_line(r.timings))
    _measured(r)
    return 0


def timed_line(timings: Any) -> str:
    """Each candidate's best median on the target, the chosen one marked. The pick is measured
    (the fastest candidate that passed its accuracy check), so a busier machine may pick
    another precision for the same model: this line says what this run timed."""
    best: dict[str, tuple[float, bool]] = {}
    for t in timings:
        if t.median_ms is None:
            continue
        ms, chosen = best.get(t.candidate, (float("inf"), False))
        best[t.candidate] = (min(ms, t.median_ms), chosen or t.chosen)
    ranked = sorted(best.items(), key=lambda kv: kv[1][0])
    return "  timed: " + (
        ", ".join(f"{c} {ms:.2f} ms" + (" (chosen)" if ch else "") for c, (ms, ch) in ranked)
        or "nothing"
    )


def _measured(r: Any) -> None:
    if r.latency_ms_before and r.latency_ms_after:
        say(
            f"  latency {r.latency_ms_before:.2f} -> {r.latency_ms_after:.2f} ms (median of 20, "
            f"fresh subprocesses); "
            f"peak RSS {r.peak_rss_mb_before:.0f} -> {r.peak_rss_mb_after:.0f} MB"
        )
    say(
        f"  accuracy vs FP32: cosine {r.cosine:.5f}, max abs err {r.max_abs_err:.2e}; "
        f"{len(r.fallback_nodes)} nodes fell back"
    )
