"""FP16: our converter loads where the stock one breaks, and the emulation catches overflow
that ORT's CPU provider hides."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gc_onnx_kit import StandInMeasurer, f32, init, make_model, run_ort
from onnx import TensorProto, helper
from onnxconverter_common import float16 as stock_float16

from seedance.graph_compiler import Precision, PrecisionPolicy, Target, compile_model, sessions
from seedance.graph_compiler.core import fp16, runtime
from seedance.graph_compiler.core.accuracy import compare_outputs
from seedance.graph_compiler.core.errors import InvalidModel

FP16_POLICY = PrecisionPolicy(
    priority_order=(Precision.FP16, Precision.FP32), target=Target.CUDA, calibration_samples=2
)


def _gpu() -> StandInMeasurer:
    """A CUDA target is compiled only with a measurer on it: FP16 scripted as the fastest."""
    return StandInMeasurer(
        {"baseline": 2.0, "fp32": 1.9, "fp16": 1.0},
        provider="CUDAExecutionProvider",
        int8_accelerated=False,
    )


@pytest.fixture
def unnamed_with_cast() -> onnx.ModelProto:
    """Unnamed nodes reading one graph input twice, an explicit Cast(to=FLOAT), and a graph
    output (``y``) that another node also reads: the three ways the stock converter breaks."""
    w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Cast", ["b"], ["c"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["c", "x"], ["y"]),
        helper.make_node("Tanh", ["y"], ["z"]),
    ]
    return make_model(
        nodes, [f32("x", [2, 8])], [f32("y", [2, 8]), f32("z", [2, 8])], [init("W", w)]
    )


def _loads(model: onnx.ModelProto) -> bool:
    try:
        sessions.make_session(model)
    except InvalidModel:
        return False
    return True


def test_stock_converter_breaks_ours_loads_and_matches(unnamed_with_cast):
    stock = stock_float16.convert_float_to_float16(unnamed_with_cast, keep_io_types=True)
    assert not _loads(stock)  # "two nodes with same node name (x_cast_to_)"

    result = compile_model(unnamed_with_cast, FP16_POLICY, _gpu())
    assert result.report.precision is Precision.FP16
    converted = onnx.load_from_string(result.model_bytes)
    assert [o.name for o in converted.graph.output] == ["y", "z"]
    assert all(o.type.tensor_type.elem_type == TensorProto.FLOAT for o in converted.graph.output)
    assert any(i.data_type == TensorProto.FLOAT16 for i in converted.graph.initializer)
    casts = [n for n in converted.graph.node if n.op_type == "Cast" and n.name.startswith("Cast")]
    assert all(a.i == TensorProto.FLOAT16 for n in casts for a in n.attribute if a.name == "to")
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    ref = run_ort(unnamed_with_cast, {"x": x})
    got = run_ort(converted, {"x": x})
    assert compare_outputs([ref], [got]).min_cosine > 0.9999


def test_converter_keeps_output_also_read_inside(tiny_bert):
    """BERT's last_hidden_state is a graph output and the pooler's input."""
    model = fp16.name_nodes(tiny_bert)
    feeds = runtime.sample_inputs(model, 1, 0)[0]
    em = fp16.Fp16Emulator(model, sessions.OrtSessions())
    dtypes = em.dtypes(em.run(feeds, None))
    converted = fp16.convert_to_fp16(model, dtypes, {})
    onnx.checker.check_model(converted)
    ref = run_ort(model, feeds)
    got = run_ort(converted, feeds)
    assert [o.name for o in converted.graph.output] == ["last_hidden_state", "pooler_output"]
    assert any(n.name == "last_hidden_state__out_cast" for n in converted.graph.node)
    assert got[0].dtype == np.float32
    # The mask is finfo.min: in FP16 it becomes -inf; exp(-inf) is 0, so rows survive here.
    assert compare_outputs([ref], [got]).min_cosine > 0.999


def test_emulation_sees_overflow_that_ort_cpu_hides(overflow_ln):
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    ref = run_ort(overflow_ln, {"x": x})
    # The stock FP16 model on ORT CPU: computed in FP32 after casts, so it "passes".
    stock = stock_float16.convert_float_to_float16(overflow_ln, keep_io_types=True)
    assert compare_outputs([ref], [run_ort(stock, {"x": x})]).min_cosine > 0.999
    # True FP16 storage: the variance (~1e6) is Inf, the normalised output collapses to 0.
    em = fp16.Fp16Emulator(overflow_ln, sessions.OrtSessions())
    refs = em.run({"x": x}, None)
    plan = fp16.fp16_plan(overflow_ln, em.dtypes(refs), {})
    emu = em.run({"x": x}, plan)
    assert np.isinf(emu["var"]).all()
    assert not np.isinf(refs["var"]).any()
    assert compare_outputs([ref], [[emu["y"]]]).min_cosine < 0.5


def test_fp16_overflow_triggers_fallback(overflow_ln):
    result = compile_model(overflow_ln, FP16_POLICY, _gpu())
    rep = result.report
    assert rep.precision is Precision.FP16
    kept = {f.node: f.reason for f in rep.fallback_nodes}
    assert {"square", "variance", "add_eps", "std"} <= set(kept)
    assert all("exceeds FP16 max" in r for r in kept.values())
    assert "proj" not in kept
    assert "normalise" not in kept
    assert rep.accuracy.min_cosine >= FP16_POLICY.min_cosine
    assert rep.accuracy.nonfinite_count == 0
    # The fallback plan really fixes true FP16: emulate the artifact's plan.
    model = fp16.name_nodes(overflow_ln)
    em = fp16.Fp16Emulator(model, sessions.OrtSessions())
    x = np.random.default_rng(3).standard_normal((4, 64)).astype(np.float32)
    refs = em.run({"x": x}, None)
    plan = fp16.fp16_plan(model, em.dtypes(refs), kept)
    assert compare_outputs([[refs["y"]]], [[em.run({"x": x}, plan)["y"]]]).min_cosine > 0.999


def test_cpu_target_skips_fp16_with_reason(overflow_ln):
    policy = PrecisionPolicy(priority_order=(Precision.FP16, Precision.FP32), calibration_samples=2)
    rep = compile_model(overflow_ln, policy).report
    assert rep.precision is Precision.FP32
    assert "CPU" in rep.candidates[0].reason
    assert not rep.candidates[0].accepted


def test_round_fp16_overflows_to_inf():
    got = fp16.round_fp16(np.array([1.0, 65504.0, 65520.0, -1e6, 1e-8], np.float32))
    assert got[0] == 1.0
    assert got[1] == 65504.0
    assert np.isinf(got[2])
    assert np.isinf(got[3])
    assert got[3] < 0
    assert got[4] == 0.0


def test_mask_fill_keeps_attention_in_fp16_and_fused_fp16_is_a_candidate(tiny_bert):
    # finfo(float32).min as the additive mask fill cannot be held in FP16: without the fill
    # change every attention Add+Softmax stayed FP32 (BERT-base on the H200: 24 fallbacks).
    filled, names = fp16.safe_mask_fill(tiny_bert)
    assert len(names) == 1
    value = next(i for i in filled.graph.initializer if i.name == names[0])
    assert float(onnx.numpy_helper.to_array(value).reshape(())) == -1.0e4
    result = compile_model(tiny_bert, FP16_POLICY, _gpu())
    rep = result.report
    assert rep.precision is Precision.FP16
    assert not [f for f in rep.fallback_nodes if f.op_type in ("Softmax", "Add")]
    fused = next(c for c in rep.candidates if c.candidate == "fp16_fused")
    assert fused.accepted, fused.reason
    assert "skip_layer_normalization" in fused.reason
    # The returned artifact still matches FP32 on fresh inputs.
    feeds = runtime.sample_inputs(tiny_bert, 2, 11)
    got = [run_ort(result.model_bytes, f) for f in feeds]
    ref = [run_ort(tiny_bert, f) for f in feeds]
    assert compare_outputs(ref, got).min_cosine > 0.999


def test_mask_fill_leaves_large_constants_off_the_softmax_path():
    big = np.array(np.finfo(np.float32).min, np.float32)
    nodes = [helper.make_node("Mul", ["x", "big"], ["y"], name="scale")]
    model = make_model(nodes, [f32("x", [2])], [f32("y", [2])], [init("big", big)])
    _, names = fp16.safe_mask_fill(model)
    assert names == []
