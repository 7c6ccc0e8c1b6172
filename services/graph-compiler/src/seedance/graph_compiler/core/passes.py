"""Graph passes over ONNX models, each reporting whether it fired and the node counts.

Owns the pass pipeline in front of precision lowering: static-shape pinning, shape inference,
Identity/Dropout removal, constant folding, dead-node and dead-initializer pruning, Conv+BN
folding, MatMul+Add→Gemm, and the transformer fusions (attention, SkipLayerNorm, GELU). Where
onnx or onnxscript already do a pass well it is called, not rewritten; written here are what they
lack: pruning that ORT never does (research note, finding 2) and Identity removal that keeps a
graph output's name. Must not change numerics beyond float re-association, and must not run
ONNX Runtime (tests check each pass against a real session).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx_ir as ir
from onnx import shape_inference
from onnxscript import optimizer as os_optimizer
from onnxscript import rewriter as os_rewriter
from onnxscript.rewriter import ort_fusions
from onnxscript.rewriter.pattern import RewriteRule
from onnxscript.rewriter.rules import common as os_rules

from seedance.graph_compiler.core.loading import PROTOBUF_LIMIT_BYTES

__all__ = [
    "FUSE_MAX_NODES",
    "PassResult",
    "fold_constants",
    "fold_conv_bn",
    "fuse_matmul_add",
    "fuse_transformer_ops",
    "infer_shapes",
    "op_histogram",
    "pin_static_shapes",
    "prune_dead",
    "remove_identity_dropout",
    "run_pipeline",
    "subgraph_reads",
]


@dataclass(frozen=True, kw_only=True)
class PassResult:
    name: str
    fired: bool
    nodes_before: int
    nodes_after: int
    detail: str = ""


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(
        collections.Counter(
            (f"{n.domain}::{n.op_type}" if n.domain else n.op_type) for n in model.graph.node
        )
    )


def _result(
    name: str,
    before: onnx.ModelProto,
    after: onnx.ModelProto,
    detail: str = "",
    fired: bool | None = None,
) -> PassResult:
    changed = op_histogram(before) != op_histogram(after)
    return PassResult(
        name=name,
        fired=changed if fired is None else fired,
        nodes_before=len(before.graph.node),
        nodes_after=len(after.graph.node),
        detail=detail,
    )


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Every name a node's subgraphs (If/Loop/Scan bodies) read, outer-scope captures included."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for g in graphs:
            for n in g.node:
                names.update(i for i in n.input if i)
                names |= subgraph_reads(n)
            names.update(o.name for o in g.output)
    return names


# ---------------------------------------------------------------------------- shapes


def pin_static_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[onnx.ModelProto, PassResult]:
    """Replace symbolic input dims with ``shapes[name]`` (or 1 where no shape is given), so
    shape inference, ORT's planner and calibration see one static graph."""
    out = _copy(model)
    inits = {i.name for i in out.graph.initializer}
    pinned: list[str] = []
    for vi in out.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        dims = vi.type.tensor_type.shape.dim
        want = shapes.get(vi.name)
        if want is not None and len(want) != len(dims):
            raise ValueError(
                f"input_shapes[{vi.name!r}]={want!r} has rank {len(want)}, model has {len(dims)}"
            )
        for i, d in enumerate(dims):
            value = want[i] if want is not None else (d.dim_value if d.HasField("dim_value") else 1)
            if not d.HasField("dim_value") or d.dim_value != value:
                d.Clear()
                d.dim_value = value
                pinned.append(f"{vi.name}[{i}]={value}")
    return out, _result("pin_static_shapes", model, out, ", ".join(pinned), fired=bool(pinned))


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """ONNX shape inference with data propagation (so Reshape targets computed from Shape
    become static). Past the 2 GB protobuf limit it is skipped: the in-memory API cannot
    serialise the model, and a partial result is worse than none."""
    if model.ByteSize() >= PROTOBUF_LIMIT_BYTES:
        return model, _result("infer_shapes", model, model, "skipped: model over 2 GB", False)
    out = shape_inference.infer_shapes(model, data_prop=True)
    added = len(out.graph.value_info) - len(model.graph.value_info)
    return out, _result("infer_shapes", model, out, f"{added} value_info added", fired=added > 0)


# ---------------------------------------------------------------------------- cleanup


def remove_identity_dropout(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """Drop Identity and inference-mode Dropout by rewiring consumers to the input. When the
    removed node's output is a graph output, the producer is renamed instead so the model's
    interface keeps its names; when that is impossible (input or initializer straight to
    output) the node stays."""
    out = _copy(model)
    g = out.graph
    graph_inputs = {i.name for i in g.input} | {i.name for i in g.initializer}
    graph_outputs = {o.name for o in g.output}
    producer = {o: n for n in g.node for o in n.output}
    removed = 0
    keep: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    for node in g.node:
        is_dropout = node.op_type == "Dropout" and (len(node.output) < 2 or not node.output[1])
        if (
            node.domain
            or node.op_type not in ("Identity", "Dropout")
            or (node.op_type == "Dropout" and not is_dropout)
        ):
            keep.append(node)
            continue
        src = rename.get(node.input[0], node.input[0])
        dst = node.output[0]
        if dst in graph_outputs:
            prod = producer.get(src)
            if src in graph_inputs or src in graph_outputs or prod is None:
                keep.append(node)
                continue
            # The producer now writes the graph output's name; readers of ``src`` follow it.
            prod.output[list(prod.output).index(src)] = dst
            rename[src] = dst
            producer[dst] = prod
        else:
            rename[dst] = src
        removed += 1
    if not removed:
        return model, _result("remove_identity_dropout", model, model, fired=False)

    def resolve(name: str) -> str:
        seen = set()
        while name in rename and name not in seen:
            seen.add(name)
            name = rename[name]
        return name

    for node in keep:
        for i, name in enumerate(node.input):
            node.input[i] = resolve(name)
    _rename_in_subgraphs(keep, resolve)
    del g.node[:]
    g.node.extend(keep)
    return out, _result("remove_identity_dropout", model, out, f"{removed} removed")


def _rename_in_subgraphs(nodes: Iterable[onnx.NodeProto], resolve: Callable[[str], str]) -> None:
    for node in nodes:
        for attr in node.attribute:
            for sub in list(attr.graphs) + ([attr.g] if attr.HasField("g") else []):
                for n in sub.node:
                    for i, name in enumerate(n.input):
                        n.input[i] = resolve(name)
                _rename_in_subgraphs(sub.node, resolve)


def prune_dead(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """Remove nodes whose outputs reach no graph output, then initializers nothing reads.
    ONNX Runtime keeps and runs such branches at every level, weights and all."""
    g = model.graph
    live = {o.name for o in g.output}
    keep_rev: list[onnx.NodeProto] = []
    for node in reversed(g.node):
        if any(o in live for o in node.output if o):
            keep_rev.append(node)
            live.update(i for i in node.input if i)
            live |= subgraph_reads(node)
    keep = list(reversed(keep_rev))
    inits_before = len(g.initializer)
    dead_nodes = len(g.node) - len(keep)
    dead_inits = [i.name for i in g.initializer if i.name not in live]
    if not dead_nodes and not dead_inits:
        return model, _result("prune_dead", model, model, fired=False)
    out = _copy(model)
    dead = set(dead_inits)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    kept_inits = [i for i in out.graph.initializer if i.name not in dead]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits)
    # Old-IR models list initializers as inputs too; those inputs go with them.
    kept_inputs = [i for i in out.graph.input if i.name not in dead]
    del out.graph.input[:]
    out.graph.input.extend(kept_inputs)
    detail = f"{dead_nodes} nodes, {inits_before - len(kept_inits)} initializers removed"
    return out, _result("prune_dead", model, out, detail, fired=True)


# ---------------------------------------------------------------------------- onnxscript


def _via_ir(model: onnx.ModelProto, fn: Callable[[ir.Model], str]) -> tuple[onnx.ModelProto, str]:
    ir_model = ir.serde.deserialize_model(model)
    detail = fn(ir_model)
    return ir.serde.serialize_model(ir_model), detail


def fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """onnxscript's constant folder (evaluates constant subgraphs, lifts small constants)."""

    def fold(m: ir.Model) -> str:
        res = os_optimizer.fold_constants(m, onnx_shape_inference=False)
        return "modified" if res.modified else ""

    out, detail = _via_ir(model, fold)
    out, _ = prune_dead(out)  # folding leaves the folded-away producers dangling
    return out, _result("fold_constants", model, out, detail)


def _rewrite(
    model: onnx.ModelProto, name: str, rules: Sequence[RewriteRule]
) -> tuple[onnx.ModelProto, PassResult]:
    ir_model = ir.serde.deserialize_model(model)
    ir_model = os_rewriter.rewrite(ir_model, pattern_rewrite_rules=rules)
    out = ir.serde.serialize_model(ir_model)
    out, _ = prune_dead(out)  # a rewrite can orphan the BN parameters it folded
    return out, _result(name, model, out)


def fold_conv_bn(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """BatchNormalization folded into the preceding Conv/ConvTranspose/Gemm weights (the
    activation that follows is left for ORT's FusedConv/NCHWc fusion, which it does at load
    and which quantisation expects as a plain Relu)."""
    return _rewrite(
        model,
        "fold_conv_bn",
        [
            os_rules.fuse_batchnorm_into_conv_rule,
            os_rules.fuse_batchnorm_into_conv_transpose_rule,
            os_rules.fuse_batchnorm_into_gemm_rule,
        ],
    )


def fuse_matmul_add(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """Add(MatMul(a, b), c) → Gemm where both operands are rank 2."""
    return _rewrite(
        model,
        "fuse_matmul_add",
        [
            os_rules.matmul_add_to_gemm_rule,
            os_rules.transpose_a_matmul_add_to_gemm_rule,
            os_rules.transpose_b_matmul_add_to_gemm_rule,
            os_rules.transpose_ab_matmul_add_to_gemm_rule,
        ],
    )


#: Above this many nodes (subgraphs' included) ``fuse_transformer_ops`` is skipped: onnxscript's
#: ``optimize_for_ort`` grows with the square of the node count (a chain of 5k Relus compiled
#: in 6.1 s, 10k in 18.6 s, 20k in 64.4 s, 93 % of it in this pass), while transformer exports
#: are far smaller (the bench's BERT-base has 422 nodes); docs/graph-compiler.md, "Bounds".
FUSE_MAX_NODES = 10_000


def fuse_transformer_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, PassResult]:
    """onnxscript's ORT fusions: attention (MultiHeadAttention/Attention), SkipLayerNorm,
    Gelu/BiasGelu, rotary embedding. It fuses current transformers exports where ORT's own
    transformer optimizer silently fuses none (research note, finding 6). The result uses
    ``com.microsoft`` ops, so it only runs on ONNX Runtime."""
    ir_model = ir.serde.deserialize_model(model)
    ir_model, stats = ort_fusions.optimize_for_ort(ir_model)
    out = ir.serde.serialize_model(ir_model)
    fired_stats = {k: v for k, v in stats.items() if v}
    detail = ", ".join(f"{k}={v}" for k, v in sorted(fired_stats.items()))
    return out, _result("fuse_transformer_ops", model, out, detail, fired=bool(fired_stats))


PassFn = Callable[[onnx.ModelProto], tuple[onnx.ModelProto, PassResult]]


def run_pipeline(
    model: onnx.ModelProto, passes: Iterable[PassFn]
) -> tuple[onnx.ModelProto, list[PassResult]]:
    """Apply ``passes`` in order. A pass that raises leaves the model as it was and is reported
    as not fired with the error: every pass here is an optional optimisation, and the tools
    underneath (onnxscript's rewriter, ONNX shape inference) fail on graphs they do not model,
    which must cost the optimisation, not the compile. The error is in the report, not lost."""
    results: list[PassResult] = []
    for p in passes:
        try:
            model, res = p(model)
        except Exception as exc:  # see docstring: recorded in the report, model unchanged
            name = getattr(p, "__name__", "pass")
            n = len(model.graph.node)
            res = PassResult(
                name=name,
                fired=False,
                nodes_before=n,
                nodes_after=n,
                detail=f"failed, skipped: {type(exc).__name__}: {exc}"[:500],
            )
        results.append(res)
    return model, results
