"""Compatibility reports for transformer exports name every offending node."""

from __future__ import annotations

import numpy as np
import onnx
from gc_onnx_kit import f32, init, make_model
from onnx import TensorProto, helper

from seedance.graph_compiler import ORT_CPU, TRANSFORMER_GPU, CompatTarget, check_compatibility


def test_bert_export_passes_transformer_target(tiny_bert):
    report = check_compatibility(tiny_bert, TRANSFORMER_GPU)
    assert report.ok, report.problems
    assert report.opset == 17
    assert not report.external_data


def test_offending_nodes_named(tiny_bert):
    model = onnx.ModelProto()
    model.CopyFrom(tiny_bert)
    model.graph.node.append(
        helper.make_node("NonZero", ["attention_mask"], ["nz"], name="mask_nonzero")
    )
    model.graph.node.append(helper.make_node("Loop", ["", ""], [], name=""))
    report = check_compatibility(model, TRANSFORMER_GPU)
    ops = {p.node: p.op_type for p in report.problems if p.kind == "operator"}
    assert ops["mask_nonzero"] == "NonZero"
    assert any(n.startswith("<unnamed Loop") for n in ops)
    assert "mask_nonzero" in report.offending_nodes


def test_opset_read_from_file_and_inputs_checked():
    model = make_model(
        [helper.make_node("Relu", ["input_ids_f"], ["y"], name="r")],
        [f32("input_ids_f", ["batch", 8])],
        [f32("y", ["batch", 8])],
        opset=20,
    )
    report = check_compatibility(model, TRANSFORMER_GPU)
    kinds = [p.kind for p in report.problems]
    assert report.opset == 20
    assert "opset" in kinds
    msgs = " ".join(p.message for p in report.problems)
    assert "'input_ids' missing" in msgs
    assert "'attention_mask' missing" in msgs
    assert "input 'input_ids_f' is not static" in msgs


def test_required_static_shape_mismatch():
    ints = [
        helper.make_tensor_value_info(n, TensorProto.INT64, [1, 64])
        for n in ("input_ids", "attention_mask")
    ]
    model = make_model(
        [helper.make_node("Add", ["input_ids", "attention_mask"], ["y"], name="a")],
        ints,
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, 64])],
    )
    target = CompatTarget(
        name="seq128",
        min_opset=13,
        max_opset=18,
        allowed_ops=TRANSFORMER_GPU.allowed_ops,
        required_inputs={"input_ids": (1, 128), "attention_mask": (1, 128)},
    )
    report = check_compatibility(model, target)
    assert [p.kind for p in report.problems] == ["input_shape", "input_shape"]
    assert "need (1, 128)" in report.problems[0].message


def test_external_data_checked_by_path(tmp_path):
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        [f32("x", [1, 64])],
        [f32("y", [1, 64])],
        [init("W", w)],
    )
    path = tmp_path / "m.onnx"
    onnx.save(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="m.data",
        size_threshold=0,
    )
    report = check_compatibility(path, ORT_CPU)
    assert report.ok
    assert report.external_data
    assert report.weight_bytes == w.nbytes
    (tmp_path / "m.data").unlink()
    report = check_compatibility(path, ORT_CPU)
    assert [p.kind for p in report.problems] == ["external_data"]
    assert "missing file 'm.data'" in report.problems[0].message
