"""Each graph pass on a small graph: it fires, counts nodes, and a real ORT session computes
the same outputs before and after."""

from __future__ import annotations

import numpy as np
import onnx
from gc_onnx_kit import f32, init, make_model, run_ort
from onnx import helper

from seedance.graph_compiler.core import passes

RNG = np.random.default_rng(0)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = RNG.standard_normal(shape).astype(np.float32)
    return out


def _same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, rtol: float = 1e-5) -> None:
    feeds = _feeds(a)
    for x, y in zip(run_ort(a, feeds), run_ort(b, feeds), strict=True):
        np.testing.assert_allclose(y, x, rtol=rtol, atol=1e-5)


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def test_prune_dead_removes_branch_and_its_weights():
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    dead = RNG.standard_normal((8, 256)).astype(np.float32)
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
            helper.make_node("MatMul", ["x", "D"], ["dead1"]),  # feeds no output
            helper.make_node("Tanh", ["dead1"], ["dead2"]),
        ],
        [f32("x", [2, 8])],
        [f32("y", [2, 8])],
        [init("W", w), init("D", dead), init("U", w)],
    )
    out, res = passes.prune_dead(model)
    assert res.fired
    assert (res.nodes_before, res.nodes_after) == (4, 2)
    assert {i.name for i in out.graph.initializer} == {"W"}
    _same_outputs(model, out)


def test_prune_dead_keeps_tensors_read_by_subgraphs():
    then_g = helper.make_graph(
        [helper.make_node("Identity", ["cap"], ["t_out"])], "then", [], [f32("t_out", [2])]
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["cap"], ["e_out"])], "else", [], [f32("e_out", [2])]
    )
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["cap"]),
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        ],
        [f32("x", [2])],
        [f32("y", [2])],
        [init("zero", np.array(0.0, np.float32))],
    )
    out, res = passes.prune_dead(model)
    assert not res.fired
    assert res.nodes_after == 4
    _same_outputs(model, out)


def test_remove_identity_dropout_keeps_output_names():
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Identity", ["x"], ["x1"]),
            helper.make_node("MatMul", ["x1", "W"], ["a"]),
            helper.make_node("Dropout", ["a"], ["b"]),
            helper.make_node("Relu", ["b"], ["c"]),
            helper.make_node("Identity", ["c"], ["y"]),  # the graph output's name must survive
        ],
        [f32("x", [2, 8])],
        [f32("y", [2, 8])],
        [init("W", w)],
    )
    out, res = passes.remove_identity_dropout(model)
    assert res.fired
    assert (res.nodes_before, res.nodes_after) == (5, 2)
    assert _ops(out) == ["MatMul", "Relu"]
    assert [o.name for o in out.graph.output] == ["y"]
    _same_outputs(model, out)


def test_fold_constants_folds_weight_arithmetic():
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    model = make_model(
        [
            helper.make_node("Mul", ["W", "two"], ["w2"]),
            helper.make_node("Add", ["w2", "zero"], ["w3"]),
            helper.make_node("MatMul", ["x", "w3"], ["y"]),
        ],
        [f32("x", [2, 8])],
        [f32("y", [2, 8])],
        [
            init("W", w),
            init("two", np.array(2.0, np.float32)),
            init("zero", np.array(0.0, np.float32)),
        ],
    )
    out, res = passes.fold_constants(model)
    assert res.fired
    assert res.nodes_after == 1
    assert _ops(out) == ["MatMul"]
    _same_outputs(model, out)


def test_fold_conv_bn(small_cnn):
    model, _ = passes.infer_shapes(small_cnn)
    out, res = passes.fold_conv_bn(model)
    assert res.fired
    assert "BatchNormalization" not in _ops(out)
    assert res.nodes_before - res.nodes_after == 2
    assert _ops(out).count("Relu") == 2  # the activation stays for ORT's FusedConv/NCHWc
    _same_outputs(small_cnn, out, rtol=1e-4)


def test_fuse_matmul_add_to_gemm():
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("Add", ["a", "B"], ["y"])],
        [f32("x", [4, 8])],
        [f32("y", [4, 3])],
        [
            init("W", RNG.standard_normal((8, 3)).astype(np.float32)),
            init("B", RNG.standard_normal(3).astype(np.float32)),
        ],
    )
    model, _ = passes.infer_shapes(model)
    out, res = passes.fuse_matmul_add(model)
    assert res.fired
    assert _ops(out) == ["Gemm"]
    _same_outputs(model, out)


def test_fuse_transformer_ops_fuses_attention_layernorm_gelu(tiny_bert):
    model, _ = passes.infer_shapes(tiny_bert)
    model, _ = passes.remove_identity_dropout(model)
    out, res = passes.fuse_transformer_ops(model)
    hist = passes.op_histogram(out)
    assert res.fired
    assert res.nodes_after < res.nodes_before / 2
    assert hist.get("com.microsoft::MultiHeadAttention") == 2
    assert hist.get("com.microsoft::SkipLayerNormalization", 0) >= 4
    assert "Erf" not in hist
    assert "Softmax" not in hist
    r = np.random.default_rng(0)
    feeds = {
        "input_ids": r.integers(0, 100, (1, 16)),
        "attention_mask": np.ones((1, 16), np.int64),
        "token_type_ids": np.zeros((1, 16), np.int64),
    }
    for x, y in zip(run_ort(tiny_bert, feeds), run_ort(out, feeds), strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-4)


def test_pin_static_shapes_then_infer():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Tanh", ["a"], ["y"])],
        [f32("x", ["batch", 8])],
        [f32("y", ["batch", 8])],
    )
    pinned, res = passes.pin_static_shapes(model, {"x": (3, 8)})
    assert res.fired
    assert "x[0]=3" in res.detail
    assert [d.dim_value for d in pinned.graph.input[0].type.tensor_type.shape.dim] == [3, 8]
    inferred, res2 = passes.infer_shapes(pinned)
    assert res2.fired
    a = next(v for v in inferred.graph.value_info if v.name == "a")
    assert [d.dim_value for d in a.type.tensor_type.shape.dim] == [3, 8]
    _, res3 = passes.pin_static_shapes(pinned, {})
    assert not res3.fired


def test_failing_pass_is_reported_and_leaves_model_unchanged():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [f32("x", [2])], [f32("y", [2])])

    def broken_pass(m):
        raise RuntimeError("pattern matcher fell over")

    out, results = passes.run_pipeline(model, [broken_pass, passes.prune_dead])
    assert out is model
    assert results[0].name == "broken_pass"
    assert not results[0].fired
    assert "RuntimeError: pattern matcher fell over" in results[0].detail
    assert results[1].name == "prune_dead"
