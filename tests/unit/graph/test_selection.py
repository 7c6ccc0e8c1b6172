"""Choosing by time on the target: a candidate slower than FP32 is refused, the fastest accepted
one wins, GPU compiles need a GPU measurer, and the chosen profile travels with the artifact
(metadata, ``load_session``, Triton config). Accuracy now also means the classifier's top-1."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from gc_onnx_kit import StandInMeasurer, run_ort

from seedance.graph_compiler import (
    Precision,
    PrecisionPolicy,
    Target,
    TargetUnavailable,
    compile_model,
)
from seedance.graph_compiler.core import runtime
from seedance.graph_compiler.core.accuracy import compare_outputs
from seedance.graph_compiler.core.compiler import classifier_outputs
from seedance.graph_compiler.core.profile import (
    CUDA_EP,
    SessionProfile,
    TargetInfo,
    candidate_profiles,
    profile_from_model,
    triton_config,
    with_profile,
)
from seedance.graph_compiler.core.selection import BASELINE, select
from seedance.graph_compiler.deployment import load_session, write_triton_model
from seedance.graph_compiler.measuring import (
    OrtMeasurer,
    ProfiledRunner,
    Variant,
    describe_machine,
    measure_latency,
    session_providers,
)

CPU_POLICY = PrecisionPolicy(calibration_samples=2)


def test_candidate_slower_than_fp32_baseline_is_refused(small_cnn):
    # INT8 passes its accuracy check but is scripted slower than the unchanged FP32 model on
    # this target, as dynamic INT8 is on a CPU without VNNI: it must not be returned.
    slow_int8 = StandInMeasurer({"baseline": 1.0, "int8": 1.5, "fp32": 1.2})
    rep = compile_model(small_cnn, CPU_POLICY, slow_int8).report
    int8_outcome = next(c for c in rep.candidates if c.precision is Precision.INT8)
    assert int8_outcome.accepted  # accurate enough: refused for its time alone
    assert "refused" in int8_outcome.verdict
    assert "not faster than the FP32 baseline" in int8_outcome.verdict
    assert int8_outcome.latency_ms == pytest.approx(1.5)
    assert rep.precision is Precision.FP32
    chosen = [t for t in rep.timings if t.chosen]
    assert [(t.candidate, t.median_ms) for t in chosen] == [(BASELINE, 1.0)]
    assert "no candidate beat the FP32 baseline" in chosen[0].reason
    assert rep.after.latency_median_ms <= rep.before.latency_median_ms


def test_fastest_accepted_candidate_wins_and_every_candidate_is_timed(small_cnn):
    m = StandInMeasurer({"baseline": 1.0, "int8": 0.4, "fp32": 0.9})
    rep = compile_model(small_cnn, CPU_POLICY, m).report
    assert rep.precision is Precision.INT8
    assert {n.split("@")[0] for n in m.timed} == {BASELINE, "int8", "fp32"}
    fp32 = next(c for c in rep.candidates if c.precision is Precision.FP32)
    assert fp32.verdict.endswith("for int8 (cpu)")
    assert "lost: 0.900 ms vs 0.400 ms" in fp32.verdict
    assert rep.target is not None
    assert rep.machine == "stand-in CPUExecutionProvider"


def test_no_faster_candidate_without_fp32_in_the_policy_is_a_named_error(small_cnn):
    from seedance.graph_compiler import NoFasterCandidate

    m = StandInMeasurer({"baseline": 1.0, "int8": 1.5})
    policy = PrecisionPolicy(priority_order=(Precision.INT8,), calibration_samples=2)
    with pytest.raises(NoFasterCandidate, match="not faster than the FP32 baseline"):
        compile_model(small_cnn, policy, m)


def test_cuda_compile_without_a_gpu_measurer_is_refused(small_cnn):
    policy = PrecisionPolicy(target=Target.CUDA, calibration_samples=2)
    with pytest.raises(TargetUnavailable, match="CUDAExecutionProvider"):
        compile_model(small_cnn, policy)
    with pytest.raises(TargetUnavailable, match="the measurer runs CPUExecutionProvider"):
        compile_model(small_cnn, policy, StandInMeasurer({"baseline": 1.0}))


def test_int8_is_no_candidate_on_a_provider_without_fast_int8(small_cnn):
    gpu = StandInMeasurer(
        {"baseline": 2.0, "fp32": 1.9, "fp16": 1.0}, provider=CUDA_EP, int8_accelerated=False
    )
    policy = PrecisionPolicy(target=Target.CUDA, calibration_samples=2)
    rep = compile_model(small_cnn, policy, gpu).report
    int8_outcome = rep.candidates[0]
    assert int8_outcome.precision is Precision.INT8
    assert not int8_outcome.accepted
    assert "no fast INT8 kernels" in int8_outcome.reason
    assert not any(n.startswith("int8@") for n in gpu.timed)
    # The CNN's profiles on CUDA include CUDA graphs and NHWC; the fastest (scripted) wins.
    assert rep.precision is Precision.FP16
    assert rep.profile.cuda_graph
    assert rep.profile.io_binding
    assert profile_from_model(onnx.load_from_string(_artifact(small_cnn, gpu))) == rep.profile


def _artifact(model, measurer) -> bytes:
    policy = PrecisionPolicy(target=Target.CUDA, calibration_samples=2)
    return compile_model(model, policy, measurer).model_bytes


def test_select_keeps_the_baseline_when_nothing_beats_it():
    plain = SessionProfile()
    timings = {
        (BASELINE, "cpu"): _t(1.0),
        ("int8", "cpu"): _t(1.0),  # a tie is not faster
        ("fp32", "cpu"): _t(float("nan"), "could not load"),
    }
    pick, verdicts = select(
        timings,
        {"cpu": plain},
        accepted=["int8", "fp32"],
        priority=["int8", "fp32"],
        baseline_label="cpu",
    )
    assert pick == (BASELINE, "cpu")
    reasons = {v.candidate: v.reason for v in verdicts}
    assert reasons["int8"].startswith("refused")
    assert reasons["fp32"].startswith("could not run")


def _t(ms, error=None):
    from types import SimpleNamespace

    return SimpleNamespace(median_ms=ms, error=error)


def test_top1_mismatch_fails_even_at_high_cosine():
    ref = [[np.array([[1.0, 1.001, 0.0, 0.0]], np.float32)]]
    cand = [[np.array([[1.001, 1.0, 0.0, 0.0]], np.float32)]]
    loose = compare_outputs(ref, cand)
    strict = compare_outputs(ref, cand, classifier_outputs={0})
    assert loose.min_cosine > 0.9999
    assert loose.passes(0.999, None)
    assert strict.top1_mismatches == 1
    assert not strict.passes(0.999, None)


def test_classifier_shaped_outputs(small_cnn, tiny_bert):
    assert classifier_outputs(small_cnn) == {0}  # Gemm logits [1, classes]
    # BERT's outputs are a hidden state and a Tanh pooler: not classifier scores.
    assert classifier_outputs(tiny_bert) == frozenset()


def test_default_acceptance_is_cosine_0999_for_int8_too():
    policy = PrecisionPolicy()
    assert policy.int8_failure_threshold == 0.999
    assert policy.min_cosine == 0.999
    assert policy.require_top1


def test_profile_round_trips_through_metadata_and_load_session(tiny_bert, tmp_path):
    result = compile_model(tiny_bert, CPU_POLICY, OrtMeasurer(runs=3))
    model = onnx.load_from_string(result.model_bytes)
    assert profile_from_model(model) == result.report.profile
    assert result.report.target is not None
    assert "CPU" in result.report.machine
    feeds = runtime.sample_inputs(tiny_bert, 2, 7)
    served = load_session(result.model_bytes)
    for f in feeds:
        ref = run_ort(tiny_bert, f)
        assert compare_outputs([ref], [served.run(f)]).min_cosine > 0.999
    root = write_triton_model(result.model_bytes, tmp_path, "bert")
    assert (root / "1" / "model.onnx").read_bytes() == result.model_bytes
    assert 'backend: "onnxruntime"' in (root / "config.pbtxt").read_text()


def test_triton_config_carries_the_cuda_profile(small_cnn):
    prof = SessionProfile(
        provider=CUDA_EP,
        io_binding=True,
        cuda_graph=True,
        prefer_nhwc=True,
        notes=("example note",),
    )
    text = triton_config("cnn", with_profile(small_cnn, prof), prof)
    assert "kind: KIND_GPU" in text
    assert 'parameters { key: "enable_cuda_graph" value: "1" }' in text
    assert 'parameters { key: "prefer_nhwc" value: "1" }' in text
    assert f'name: "{small_cnn.graph.input[0].name}" data_type: TYPE_FP32' in text
    assert "# note: example note" in text


def test_cuda_profiles_to_try():
    gpu = TargetInfo(provider=CUDA_EP, machine="gpu")
    labels = [p.label for p in candidate_profiles(gpu, conv_model=True)]
    assert labels == [
        "cuda",
        "cuda+iob",
        "cuda+iob+graph",
        "cuda+iob+graph+nhwc",
        "cuda+iob+graph+fcb",
        "cuda+iob+graph+nhwc+fcb",
        "cuda+iob+graph+nhwc+heur+fcb",
    ]
    # A transformer gets the attention-kernel choices, no convolution levers.
    labels = [p.label for p in candidate_profiles(gpu, conv_model=False)]
    assert labels == [
        "cuda",
        "cuda+iob",
        "cuda+iob+graph",
        "cuda+iob+graph+sdpa_kernel=8",
        "cuda+iob+graph+sdpa_kernel=2",
    ]
    cpu = TargetInfo(provider="CPUExecutionProvider", machine="cpu")
    assert [p.label for p in candidate_profiles(cpu, conv_model=True)] == ["cpu"]


def test_io_binding_runner_matches_plain_run(tiny_bert):
    data = tiny_bert.SerializeToString()
    plain = ProfiledRunner(data, {"provider": "CPUExecutionProvider"})
    bound = ProfiledRunner(data, {"provider": "CPUExecutionProvider", "io_binding": True})
    feeds = runtime.sample_inputs(tiny_bert, 3, 5)
    outs = [bound.run(f) for f in feeds]  # kept: each run must hand out its own arrays
    for f, got in zip(feeds, outs, strict=True):
        for a, b in zip(plain.run(f), got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_measurer_refuses_a_provider_this_build_lacks():
    with pytest.raises(ValueError, match="CUDAExecutionProvider is not available"):
        OrtMeasurer(CUDA_EP)


def test_machine_description_names_the_isa():
    info = describe_machine()
    assert info.machine.startswith("CPU ")
    with open("/proc/cpuinfo") as f:
        has_avx2 = " avx2" in f.read()
    assert ("avx2" in info.isa) == has_avx2


def test_fp16_io_candidate_drops_the_edge_casts_and_says_so(small_cnn):
    gpu = StandInMeasurer(
        {"baseline": 2.0, "fp32": 1.9, "fp16": 1.0, "fp16_io": 0.9},
        provider=CUDA_EP,
        int8_accelerated=False,
    )
    policy = PrecisionPolicy(target=Target.CUDA, calibration_samples=2)
    result = compile_model(small_cnn, policy, gpu)
    rep = result.report
    io = next(c for c in rep.candidates if c.candidate == "fp16_io")
    assert io.accepted, io.reason
    assert rep.profile.io_dtype == "float16"
    model = onnx.load_from_string(result.model_bytes)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    assert "TYPE_FP16" in triton_config("cnn", model, rep.profile)
    # load_session converts float32 feeds for a caller that has no float16 at hand.
    served = ProfiledRunner(result.model_bytes, {"provider": "CPUExecutionProvider"})
    feeds = runtime.sample_inputs(small_cnn, 2, 3)
    got = [served.run(f) for f in feeds]
    ref = [run_ort(small_cnn, f) for f in feeds]
    assert compare_outputs(ref, got).min_cosine > 0.999


def test_provider_options_win_only_by_time_and_travel_with_the_artifact(small_cnn, tmp_path):
    # The fused convolution bias scripted faster on this (stand-in) GPU: it is chosen, and the
    # artifact's metadata, the loader's providers and the Triton config all carry it.
    gpu = StandInMeasurer(
        {"baseline": 2.0, "fp32": 1.9, "fp16": 1.0, "fp16_io": 1.0},
        provider=CUDA_EP,
        int8_accelerated=False,
        profile_ms={"fcb": -0.05, "heur": 0.01},
    )
    policy = PrecisionPolicy(target=Target.CUDA, calibration_samples=2)
    result = compile_model(small_cnn, policy, gpu)
    prof = result.report.profile
    assert prof.label == "cuda+iob+graph+fcb"
    assert prof.provider_options == (("fuse_conv_bias", "1"),)
    model = onnx.load_from_string(result.model_bytes)
    assert profile_from_model(model) == prof
    providers = session_providers(json.loads(prof.to_json()))
    assert providers == [
        (CUDA_EP, {"device_id": "0", "enable_cuda_graph": "1", "fuse_conv_bias": "1"})
    ]
    root = write_triton_model(result.model_bytes, tmp_path, "cnn")
    text = (root / "config.pbtxt").read_text()
    assert 'parameters { key: "fuse_conv_bias" value: "1" }' in text
    assert "profile cuda+iob+graph+fcb" in text
    heur = next(t for t in result.report.timings if "+heur" in t.profile.label)
    assert heur.reason.startswith("lost")
    # Scripted slower, the same lever loses to the plain CUDA graph.
    gpu.profile_ms = {"fcb": 0.05}
    slower = compile_model(small_cnn, policy, gpu).report
    assert slower.profile.provider_options == ()
    assert all(t.reason.startswith("lost") for t in slower.timings if "fcb" in t.profile.label)


def test_provider_options_are_sorted_and_may_not_shadow_profile_fields():
    a = SessionProfile(provider=CUDA_EP, provider_options=(("b", "2"), ("a", "1")))
    assert a.provider_options == (("a", "1"), ("b", "2"))
    assert SessionProfile.from_json(a.to_json()) == a
    assert json.loads(a.to_json())["provider_options"] == {"a": "1", "b": "2"}
    with pytest.raises(ValueError, match="may not set enable_cuda_graph"):
        SessionProfile(provider=CUDA_EP, provider_options=(("enable_cuda_graph", "1"),))
    with pytest.raises(ValueError, match="names a key twice"):
        SessionProfile(provider=CUDA_EP, provider_options=(("a", "1"), ("a", "2")))
    # An artifact written before the field existed still loads its profile.
    old = json.loads(SessionProfile(provider=CUDA_EP, cuda_graph=True).to_json())
    del old["provider_options"]
    assert SessionProfile.from_json(json.dumps(old)).provider_options == ()


def test_triton_config_keeps_the_algorithm_search_beside_model_parameters(small_cnn):
    # With model-level parameters present the onnxruntime backend resets cudnn_conv_algo_search
    # from them: the config writes it there too.
    prof = SessionProfile(
        provider=CUDA_EP,
        intra_op_threads=2,
        provider_options=(("cudnn_conv_algo_search", "HEURISTIC"),),
    )
    text = triton_config("cnn", with_profile(small_cnn, prof), prof)
    assert 'parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" }' in text
    assert 'key: "cudnn_conv_algo_search" value: { string_value: "1" }' in text


def test_latency_protocol_reports_spread_and_blocks(small_cnn, tmp_path):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(small_cnn.SerializeToString())
    feeds = runtime.sample_inputs(small_cnn, 1, 0)[0]
    v = Variant(name="cnn", path=path)
    got = measure_latency([v], feeds, runs=12, warmup=5, rounds=3)["cnn"]
    assert got.runs == 12
    assert len(got.round_medians) == 3
    assert got.min_ms <= got.p10_ms <= got.median_ms <= got.p90_ms
    with pytest.raises(ValueError, match="runs >= rounds"):
        measure_latency([v], feeds, runs=2, rounds=3)
