"""The compiler's bounds on what one tenant's model may cost it: each in-process run of a model
(``run_timeout_s``), the elements of a declared input, the nodes of a graph; each hostile model
answered with its named error, honest ones unaffected."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from gc_onnx_kit import (
    _hostile,
    big_alloc_model,
    big_input_model,
    f32,
    huge_dim_model,
    loop_forever_model,
    relu_chain_model,
)
from onnx import helper

from seedance.graph_compiler import (
    InvalidModel,
    ModelRunTimeout,
    Precision,
    PrecisionPolicy,
    compile_model,
    pool,
)
from seedance.graph_compiler.core.runtime import MAX_SAMPLE_BYTES, sample_inputs
from seedance.graph_compiler.sessions import make_session
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.graph_compiler.worker import compile_file

FP32 = PrecisionPolicy(priority_order=[Precision.FP32])


def test_a_loop_that_never_ends_is_stopped_after_run_timeout_s():
    model = loop_forever_model()
    assert model.ByteSize() < 400
    started = time.monotonic()
    with pytest.raises(ModelRunTimeout) as caught:
        compile_model(model, FP32, run_timeout_s=0.5)
    took_s = time.monotonic() - started
    assert isinstance(caught.value, InvalidModel)  # still "invalid" to callers that only ask that
    assert "FP32 reference run" in str(caught.value)
    assert "over 0.5 s" in str(caught.value)
    assert took_s < 30  # the run is stopped, not the compile's 1800 s timeout


def test_a_session_run_past_its_bound_raises_and_the_next_run_is_bounded_too():
    sess = make_session(loop_forever_model(), threads=1, run_timeout_s=0.2)
    feeds = {"x": np.zeros((1, 4), np.float32)}
    for _ in range(2):  # the watchdog re-arms: a second run is stopped as the first was
        with pytest.raises(ModelRunTimeout, match=r"over 0\.2 s"):
            sess.run(feeds)


def test_honest_models_compile_under_the_run_bound(small_cnn, tiny_bert):
    for model in (small_cnn, tiny_bert, relu_chain_model(50)):
        result = compile_model(model, PrecisionPolicy(calibration_samples=2), run_timeout_s=60)
        assert result.report.precision in (Precision.INT8, Precision.FP16, Precision.FP32)


def test_a_huge_declared_input_is_refused_naming_the_input_and_its_shape(tmp_path):
    """[2^40, 2^40] used to escape as numpy's ValueError (an internal error, retried)."""
    path = tmp_path / "huge.onnx"
    path.write_bytes(huge_dim_model().SerializeToString())
    outcome = compile_file(str(path), str(tmp_path / "out.onnx"), FP32, "cpu", run_timeout_s=60)
    assert outcome.error_kind == "InvalidModel", outcome
    assert f"input 'x' declares shape [{1 << 40}, {1 << 40}]" in (outcome.error or "")


def test_inputs_over_max_sample_bytes_are_refused_before_any_sample_is_drawn():
    """A 108-byte model declaring [1, 2^25] cost the compile child 1,413 MiB of samples (drawn
    in float64); the bound is now on one sample's bytes, in the inputs' own types."""
    over = (MAX_SAMPLE_BYTES // 4) + 1  # float32: 4 bytes over
    with pytest.raises(InvalidModel) as caught:
        compile_model(big_input_model(over), FP32, run_timeout_s=60)
    text = str(caught.value)
    assert f"input 'x' declares shape [1, {over}] of float32 ({over * 4:,} bytes" in text, text
    assert f"over the {MAX_SAMPLE_BYTES:,} bytes (256.0 MiB) per sample" in text
    # under the bound it still compiles
    assert compile_model(big_input_model(1 << 16), FP32, run_timeout_s=60).model_bytes
    assert MAX_SAMPLE_BYTES == 256 << 20  # the documented default


def test_a_4k_frame_and_a_batch_of_8_megapixel_images_are_sampled_in_float32():
    """Both were refused by the 2^24-element cap (24.9 M and 25.2 M elements)."""
    for shape in ([1, 3, 2160, 3840], [8, 3, 1024, 1024]):
        model = _hostile([helper.make_node("Relu", ["x"], ["y"])], [], [f32("x", shape)],
                         [f32("y", shape)])  # fmt: skip
        (feeds,) = sample_inputs(model, 1, 0)
        assert feeds["x"].shape == tuple(shape)
        assert feeds["x"].dtype == np.float32
        assert 0.9 < float(feeds["x"][0, 0, :64, :64].std()) < 1.1  # standard normal


def test_several_inputs_are_bounded_together_naming_the_largest():
    shape = [1, (MAX_SAMPLE_BYTES // 4) // 2 + 1]  # each half the bound, and 4 bytes
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = _hostile(nodes, [], [f32("a", shape), f32("b", shape)], [f32("y", shape)])
    with pytest.raises(InvalidModel, match=r"input 'a' declares shape .*, input 'b' declares"):
        sample_inputs(model, 1, 0)


def test_the_compile_child_s_memory_is_bounded_and_an_allocation_past_it_is_named(
    tmp_path, small_cnn
):
    """A 190-byte ConstantOfShape of 2^31 floats (8 GiB; the probe's 2^28 reached 4,486 MiB
    and compiled "ok") is answered CompileOutOfMemory by a child under the default bound, which
    then still compiles an honest model."""
    bomb, honest = tmp_path / "alloc.onnx", tmp_path / "cnn.onnx"
    bomb.write_bytes(big_alloc_model(1 << 31).SerializeToString())
    assert bomb.stat().st_size < 250
    honest.write_bytes(small_cnn.SerializeToString())
    child = pool.new_pool(GraphCompilerSettings().compile_memory_mib)
    try:
        refused = child.submit(
            compile_file, str(bomb), str(tmp_path / "a.out"), FP32, "cpu", 2, 60
        ).result(timeout=100)
        ok = child.submit(
            compile_file, str(honest), str(tmp_path / "c.out"), FP32, "cpu", 2, 60
        ).result(timeout=100)
    finally:
        pool.kill_pool(child)
    assert refused.error_kind == "CompileOutOfMemory", refused
    assert "more memory than the compiler may use" in (refused.error or "")
    assert ok.error_kind is None, ok
    assert (tmp_path / "c.out").stat().st_size > 0


def test_a_graph_over_max_nodes_is_refused_by_the_compat_check_counting_subgraphs(tmp_path):
    """Compile time grew with the square of the node count (20k Relus: 64.4 s)."""
    path = tmp_path / "chain.onnx"
    path.write_bytes(relu_chain_model(2_001).SerializeToString())
    out = str(tmp_path / "out.onnx")
    refused = compile_file(str(path), out, FP32, "cpu", 2, 60, max_nodes=2_000)
    assert refused.error_kind == "IncompatibleModel", refused
    assert "model has 2,001 nodes (subgraphs included), over the compiler's max_nodes of 2,000" in (
        refused.error or ""
    )
    # the Loop's body counts: 1 Loop + 2 body nodes
    loop = tmp_path / "loop.onnx"
    loop.write_bytes(loop_forever_model().SerializeToString())
    nested = compile_file(str(loop), out, FP32, "cpu", 2, 60, max_nodes=2)
    assert "model has 3 nodes" in (nested.error or ""), nested
    assert GraphCompilerSettings().max_nodes == 50_000


def test_the_fusion_pass_is_skipped_over_its_node_bound_and_said_so(monkeypatch, tiny_bert):
    from seedance.graph_compiler.core import passes

    fused = compile_model(tiny_bert, FP32, run_timeout_s=60).report
    assert "fuse_transformer_ops" in fused.passes_fired  # the honest transformer is fused
    monkeypatch.setattr(passes, "FUSE_MAX_NODES", 10)  # tiny_bert has ~100 after the passes
    skipped = compile_model(tiny_bert, FP32, run_timeout_s=60).report
    assert "fuse_transformer_ops" not in skipped.passes_fired
    note = next(p for p in skipped.passes if p.name == "fuse_transformer_ops")
    assert note.detail.startswith("skipped: ")
    assert "nodes, over 10 " in note.detail


@pytest.mark.parametrize(
    ("providers", "capped"),
    [(["CPUExecutionProvider"], True), (["CUDAExecutionProvider", "CPUExecutionProvider"], False)],
)
def test_the_memory_cap_is_left_off_where_onnxruntime_offers_cuda(
    providers: list[str], capped: bool
) -> None:
    """CUDA reserves far more address space than it uses: under the default cap a GPU worker
    (onnxruntime-gpu lists CUDA) could not run a model on its GPU at all, so the cap is left
    off there and said; a CPU worker is capped. In a child process: the cap is for life."""
    code = (
        "import resource; from seedance.graph_compiler import pool; "
        f"pool.limit_memory(4096, {providers!r}); "
        "print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    limit = int(done.stdout.split()[-1])
    assert (limit == 4096 * 1024 * 1024) is capped, done.stdout
    assert ("compile_memory_limit_off_for_cuda" in done.stdout + done.stderr) is not capped
