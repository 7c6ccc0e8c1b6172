"""compile_model end to end: INT8 method chosen by model type, fallback through the priority
order, the report's contents, and named errors instead of broken artifacts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gc_onnx_kit import f32, init, make_model, run_ort
from onnx import helper

from seedance.graph_compiler import (
    AccuracyCheckFailed,
    CompileError,
    InvalidModel,
    Precision,
    PrecisionPolicy,
    UnsupportedOperator,
    compile_model,
)
from seedance.graph_compiler.core import int8, runtime
from seedance.graph_compiler.core.accuracy import compare_outputs
from seedance.graph_compiler.measuring import OrtMeasurer


def _ops(data: bytes) -> set[str]:
    return {n.op_type for n in onnx.load_from_string(data).graph.node}


def test_int8_static_qdq_for_cnn(small_cnn):
    assert int8.classify(small_cnn) is int8.ModelKind.CONV
    result = compile_model(small_cnn, PrecisionPolicy(calibration_samples=4))
    rep = result.report
    assert rep.precision is Precision.INT8
    assert rep.model_kind == "conv"
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(result.model_bytes)
    assert "ConvInteger" not in _ops(result.model_bytes)  # dynamic INT8 on a CNN is a regression
    assert "fold_conv_bn" in rep.passes_fired
    assert rep.accuracy.min_cosine >= 0.95
    # The artifact runs and its reported accuracy is reproducible on fresh inputs.
    feeds = runtime.sample_inputs(small_cnn, 2, 99)
    ref = [run_ort(small_cnn, f) for f in feeds]
    got = [run_ort(result.model_bytes, f) for f in feeds]
    assert compare_outputs(ref, got).min_cosine > 0.99


def test_int8_dynamic_for_matmul_net(tiny_bert):
    assert int8.classify(tiny_bert) is int8.ModelKind.MATMUL
    result = compile_model(tiny_bert, PrecisionPolicy(calibration_samples=2))
    assert result.report.precision is Precision.INT8
    assert result.report.model_kind == "matmul"
    ops = _ops(result.model_bytes)
    assert "DynamicQuantizeLinear" in ops
    assert "MatMulInteger" in ops
    assert "QuantizeLinear" not in ops
    assert result.report.after.size_bytes < result.report.before.size_bytes / 2


def test_int8_below_threshold_falls_back_to_next_precision(small_cnn):
    policy = PrecisionPolicy(
        priority_order=(Precision.INT8, Precision.FP32),
        int8_failure_threshold=0.9999999,
        calibration_samples=2,
        max_fallback_attempts=2,
    )
    rep = compile_model(small_cnn, policy).report
    int8_outcome, fp32_outcome = rep.candidates
    assert not int8_outcome.accepted
    assert int8_outcome.attempts == 2
    assert "int8_failure_threshold" in int8_outcome.reason
    assert fp32_outcome.accepted
    assert rep.precision is Precision.FP32
    assert rep.accuracy.min_cosine > 0.99999


def test_no_precision_passing_raises_named_error(small_cnn):
    policy = PrecisionPolicy(
        priority_order=(Precision.INT8,),
        int8_failure_threshold=1.0,
        calibration_samples=2,
        max_fallback_attempts=1,
    )
    with pytest.raises(AccuracyCheckFailed, match="int8"):
        compile_model(small_cnn, policy)


def test_dead_branch_pruned_and_reported():
    rng = np.random.default_rng(0)
    model = make_model(
        [
            helper.make_node("MatMul", ["x", "W"], ["a"], name="live"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
            helper.make_node("MatMul", ["x", "D"], ["d1"], name="dead_mm"),
            helper.make_node("Tanh", ["d1"], ["d2"], name="dead_tanh"),
        ],
        [f32("x", [2, 16])],
        [f32("y", [2, 16])],
        [
            init("W", rng.standard_normal((16, 16)).astype(np.float32)),
            init("D", rng.standard_normal((16, 4096)).astype(np.float32)),
        ],
    )
    result = compile_model(
        model, PrecisionPolicy(priority_order=(Precision.FP32,), calibration_samples=2)
    )
    prune = next(p for p in result.report.passes if p.name == "prune_dead")
    assert prune.fired
    assert prune.detail == "2 nodes, 1 initializers removed"
    assert result.report.after.size_bytes < result.report.before.size_bytes / 10


def test_report_measures_before_and_after_in_subprocess(small_cnn):
    policy = PrecisionPolicy(calibration_samples=2, measure_runs=3)
    rep = compile_model(small_cnn, policy, OrtMeasurer(runs=3)).report
    for m in (rep.before, rep.after):
        assert m.latency_median_ms is not None
        assert m.latency_median_ms > 0
        assert m.peak_rss_mb is not None
        assert m.peak_rss_mb > 20
    assert rep.before.nodes == len(small_cnn.graph.node)


@pytest.mark.parametrize(
    "payload",
    [b"not an onnx model", b""],
)
def test_garbage_bytes_raise_invalid_model(payload):
    with pytest.raises(InvalidModel):
        compile_model(payload)


def test_missing_path_raises_invalid_model(tmp_path):
    with pytest.raises(InvalidModel, match="not a file"):
        compile_model(tmp_path / "nope.onnx")


def test_checker_failure_raises_invalid_model():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])], "g", [f32("x", [2])], [f32("y", [2])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModel) as info:
        compile_model(model.SerializeToString())
    assert info.value.reason == "invalid_model"
    assert not info.value.retryable


def test_unknown_operator_raises_unsupported_operator():
    graph = helper.make_graph(
        [helper.make_node("FancyOp", ["x"], ["y"], name="my_fancy_node", domain="acme.ops")],
        "g",
        [f32("x", [2])],
        [f32("y", [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("acme.ops", 1)]
    )
    with pytest.raises(UnsupportedOperator) as info:
        compile_model(model)
    assert isinstance(info.value, CompileError)
    assert "my_fancy_node" in info.value.nodes


def test_symbolic_input_without_pin_is_pinned_to_one():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")],
        [f32("x", ["n", 4])],
        [f32("y", ["n", 4])],
    )
    rep = compile_model(
        model, PrecisionPolicy(priority_order=(Precision.FP32,), calibration_samples=1)
    ).report
    pin = rep.passes[0]
    assert pin.name == "pin_static_shapes"
    assert pin.fired
    assert "x[0]=1" in pin.detail


def test_policy_validation_names_the_field():
    with pytest.raises(ValueError, match="int8_failure_threshold"):
        PrecisionPolicy(int8_failure_threshold=1.5)
    with pytest.raises(ValueError, match="priority_order"):
        PrecisionPolicy(priority_order=(Precision.FP16, Precision.FP16))
    with pytest.raises(ValueError, match="'bf16' is not a valid Precision"):
        PrecisionPolicy(priority_order=("bf16",))


def test_int8_with_nothing_to_quantise_is_rejected_with_reason():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Tanh", ["a"], ["y"])],
        [f32("x", [2, 8])],
        [f32("y", [2, 8])],
    )
    rep = compile_model(model, PrecisionPolicy(calibration_samples=1)).report
    assert rep.precision is Precision.FP32
    assert rep.candidates[0].reason == "nothing to quantise (matmul)"
