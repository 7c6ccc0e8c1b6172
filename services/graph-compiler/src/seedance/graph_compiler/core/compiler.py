"""``compile_model``: one ONNX model and a precision policy in, a checked artifact and a report out.

Owns the order of work: load and check, graph passes, then every candidate of the policy's
priority order built with per-node fallback and checked against the FP32 reference on the
calibration inputs (``candidates``; on the target provider too, for a GPU), then all accepted
candidates, each under the session profiles worth trying there, timed on the target through
the injected ``Measurer`` beside the FP32 baseline, and the fastest pair that beats the
baseline returned with its deployment profile in the artifact's metadata (``selection`` holds
the rule). Every returned artifact has been loaded and run by the injected ``SessionFactory``
and passed its check; anything else raises a ``CompileError``. Must not talk to the bus or the
object store (the service's adapter does), never imports a runtime, reads the clock or spawns
processes: sessions, the quantiser and timing are handed in (``seedance.graph_compiler``'s
``compile_model`` hands in ONNX Runtime's). Without a measurer a CPU compile takes the first
accepted candidate in priority order and says so in the report; a GPU compile without a
measurer on the GPU is refused (``TargetUnavailable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from seedance.graph_compiler.core import fp16, int8, passes
from seedance.graph_compiler.core.accuracy import Accuracy
from seedance.graph_compiler.core.candidates import (
    FP16_FUSED,
    IO_SUFFIX,
    Attempt,
    Checked,
    try_fp16,
    try_fp16_fused,
    try_fp16_io,
    try_int8,
)
from seedance.graph_compiler.core.checking import Checker, load, outputs
from seedance.graph_compiler.core.errors import (
    AccuracyCheckFailed,
    ModelRunTimeout,
    NoFasterCandidate,
    TargetUnavailable,
)
from seedance.graph_compiler.core.loading import all_node_count, load_model, node_count
from seedance.graph_compiler.core.passes import PassResult
from seedance.graph_compiler.core.policy import Precision, PrecisionPolicy, Target
from seedance.graph_compiler.core.profile import (
    CPU_EP,
    CUDA_EP,
    SessionProfile,
    TargetInfo,
    candidate_profiles,
    with_profile,
)
from seedance.graph_compiler.core.report import (
    CandidateOutcome,
    CompileReport,
    CompileResult,
    FallbackNode,
    VariantMetrics,
)
from seedance.graph_compiler.core.runtime import Feeds, SessionFactory, sample_inputs
from seedance.graph_compiler.core.selection import BASELINE, Measurer, Timing, TimingResult, select

__all__ = [
    "FP16_FUSED",
    "CandidateOutcome",
    "CompileReport",
    "CompileResult",
    "FallbackNode",
    "VariantMetrics",
    "classifier_outputs",
    "compile_model",
]

# Ops whose rank-2 float output is a classifier's scores (logits or probabilities).
_SCORE_OPS = frozenset({"Gemm", "MatMul", "Add", "Softmax", "LogSoftmax"})
_PROVIDER = {Target.CPU: CPU_EP, Target.CUDA: CUDA_EP}


def _base_pipeline(policy: PrecisionPolicy) -> list[passes.PassFn]:
    return [
        lambda m: passes.pin_static_shapes(m, policy.input_shapes),
        passes.infer_shapes,
        passes.remove_identity_dropout,
        # Pruning before folding: no work spent folding branches that are thrown away.
        passes.prune_dead,
        passes.fold_constants,
        passes.fold_conv_bn,
        passes.fuse_matmul_add,
        passes.infer_shapes,
    ]


def classifier_outputs(model: onnx.ModelProto) -> frozenset[int]:
    """Indices of outputs shaped like a classifier's scores: float, [batch, classes >= 2],
    produced directly by a score op (a Tanh pooler or a hidden state is not one)."""
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    out = set()
    for i, vi in enumerate(model.graph.output):
        tt = vi.type.tensor_type
        dims = tt.shape.dim
        if tt.elem_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            continue
        wide = len(dims) == 2 and dims[1].HasField("dim_value") and dims[1].dim_value >= 2
        if wide and producer.get(vi.name) in _SCORE_OPS:
            out.add(i)
    return frozenset(out)


def _check_target(policy: PrecisionPolicy, measurer: Measurer | None) -> TargetInfo | None:
    want = _PROVIDER[policy.target]
    if measurer is None:
        if policy.target is not Target.CPU:
            raise TargetUnavailable(
                f"a {policy.target} compile is timed on {want}: no measurer on it was given"
            )
        return None
    have = measurer.target.provider
    if have != want:
        raise TargetUnavailable(f"target {policy.target} needs {want}; the measurer runs {have}")
    return measurer.target


@dataclass(frozen=True, kw_only=True)
class _Prepared:
    """The model after loading and the graph passes, and the reference it is checked against."""

    original: onnx.ModelProto
    pinned: onnx.ModelProto  # the input model with its input shapes pinned: the FP32 baseline
    base: onnx.ModelProto  # after the passes: where INT8 and FP16 start
    fp32: onnx.ModelProto  # the FP32 candidate (base, fused where that kept the numerics)
    passes: list[PassResult]
    fuse_note: PassResult | None
    kind: int8.ModelKind
    checker: Checker


@dataclass(kw_only=True)
class _Found:
    """The candidates' outcomes and the accepted ones, by precision and by variant name."""

    outcomes: list[CandidateOutcome] = field(default_factory=list)
    by_precision: dict[Precision, Checked] = field(default_factory=dict)
    extra: dict[str, Checked] = field(default_factory=dict)  # FP16 variants: fused, float16 I/O

    def add(self, attempt: Attempt | None, name: str | None = None) -> None:
        if attempt is None:
            return
        outcome, checked = attempt
        self.outcomes.append(outcome)
        if checked is not None and name is not None:
            self.extra[name] = checked


@dataclass(frozen=True, kw_only=True)
class _Choice:
    precision: Precision
    artifact: onnx.ModelProto
    accuracy: Accuracy
    fallback: list[FallbackNode]
    profile: SessionProfile
    outcomes: list[CandidateOutcome]
    timings: tuple[TimingResult, ...] = ()
    before_ms: float | None = None
    after_ms: float | None = None


def compile_model(
    model: bytes | str | Path | onnx.ModelProto,
    policy: PrecisionPolicy | None = None,
    measurer: Measurer | None = None,
    *,
    sessions: SessionFactory,
    quantizer: int8.Quantizer,
) -> CompileResult:
    """Compile ``model`` under ``policy`` (defaults: INT8, then FP16, then FP32, CPU target),
    choosing among the accepted candidates by their time on ``measurer``'s provider; the
    reference and every check run on ``sessions``, INT8 candidates come from ``quantizer``."""
    policy = policy or PrecisionPolicy()
    target = _check_target(policy, measurer)
    prep = _prepare(model, policy, sessions)
    found = _search(prep, target, measurer, quantizer)
    if not found.by_precision and not (measurer is not None and _fp32_allowed(policy)):
        raise AccuracyCheckFailed(
            "no precision passed its accuracy check: "
            + "; ".join(f"{o.precision}: {o.reason}" for o in found.outcomes)
        )
    if measurer is None or target is None:
        choice = _untimed(found)
    else:
        choice = _timed(prep, found, measurer, target)
    return _result(prep, choice, measurer, target)


def _fp32_allowed(policy: PrecisionPolicy) -> bool:
    return Precision.FP32 in policy.priority_order


def _prepare(
    model: bytes | str | Path | onnx.ModelProto, policy: PrecisionPolicy, sessions: SessionFactory
) -> _Prepared:
    original = load_model(model)
    pinned, pin_result = passes.pin_static_shapes(original, policy.input_shapes)
    load(sessions, pinned)  # refuses models the runtime cannot even load, with a named error
    calib = sample_inputs(pinned, policy.calibration_samples, policy.seed)
    try:
        reference = outputs(sessions, pinned, calib, "disable")
    except ModelRunTimeout as exc:
        # The first run of the model: every later one (passes, candidates, calibration) runs
        # a graph derived from it, so a model that never finishes is answered here.
        raise ModelRunTimeout(f"the FP32 reference run of the model: {exc}") from exc
    checker = Checker(
        sessions=sessions,
        policy=policy,
        calib=calib,
        reference=reference,
        scores=classifier_outputs(pinned) if policy.require_top1 else frozenset(),
    )
    base, results = passes.run_pipeline(pinned, _base_pipeline(policy)[1:])
    results.insert(0, pin_result)
    base = fp16.name_nodes(base)
    if not checker.check(checker.run(base, "disable")).passes(policy.min_cosine, None):
        # A pass changed the numerics beyond float re-association: ship without the passes.
        base = fp16.name_nodes(pinned)
        results = [pin_result]
    fp32, fuse_note = _fuse_fp32(base, checker)
    return _Prepared(
        original=original,
        pinned=pinned,
        base=base,
        fp32=fp32,
        passes=results,
        fuse_note=fuse_note,
        kind=int8.classify(base),
        checker=checker,
    )


def _fuse_fp32(
    base: onnx.ModelProto, checker: Checker
) -> tuple[onnx.ModelProto, PassResult | None]:
    """The FP32 candidate with ORT's fused transformer ops where they keep the numerics."""
    if not checker.policy.allow_ort_contrib_ops:
        return base, None
    n = all_node_count(base)
    if n > passes.FUSE_MAX_NODES:
        return base, PassResult(
            name="fuse_transformer_ops",
            fired=False,
            nodes_before=len(base.graph.node),
            nodes_after=len(base.graph.node),
            detail=f"skipped: {n:,} nodes, over {passes.FUSE_MAX_NODES:,} (its time grows "
            "with the square of the node count)",
        )
    fused, (fuse_result,) = passes.run_pipeline(base, [passes.fuse_transformer_ops])
    if fuse_result.fired and checker.passes(checker.check(checker.run(fused, "disable"))):
        return fused, fuse_result
    return base, PassResult(
        name=fuse_result.name,
        fired=False,
        nodes_before=fuse_result.nodes_before,
        nodes_after=fuse_result.nodes_before,
        detail="nothing fused" if not fuse_result.fired else "rejected: accuracy",
    )


def _search(
    prep: _Prepared,
    target: TargetInfo | None,
    measurer: Measurer | None,
    quantizer: int8.Quantizer,
) -> _Found:
    """Every candidate of the priority order built and checked; untimed, the first accepted."""
    found = _Found()
    checker = prep.checker
    for precision in checker.policy.priority_order:
        outcome, checked = _candidate(precision, prep, target, quantizer)
        if checked is not None and target is not None and target.provider != CPU_EP:
            assert measurer is not None  # a target comes from the measurer
            outcome, checked = _on_target(outcome, checked, measurer, checker)
        found.outcomes.append(outcome)
        if checked is None:
            continue
        found.by_precision[precision] = checked
        if measurer is None:
            break  # untimed: the first accepted candidate in priority order
        if precision is Precision.FP16:
            _fp16_variants(found, checked, measurer, checker)
    return found


def _candidate(
    precision: Precision,
    prep: _Prepared,
    target: TargetInfo | None,
    quantizer: int8.Quantizer,
) -> Attempt:
    checker = prep.checker
    if precision is Precision.INT8:
        if target is not None and not target.int8_accelerated:
            return CandidateOutcome(
                precision=precision,
                accepted=False,
                reason=f"skipped: {target.provider} has no fast INT8 kernels (QDQ runs "
                "dequantised there); only an INT8-accelerating provider makes it a candidate",
            ), None
        return try_int8(prep.base, prep.kind, checker, quantizer)
    if precision is Precision.FP16:
        return try_fp16(prep.base, checker)
    acc = checker.check(checker.run(prep.fp32, "all"))
    ok = checker.passes(acc)
    outcome = CandidateOutcome(
        precision=precision,
        accepted=ok,
        accuracy=acc,
        attempts=1,
        reason="accepted" if ok else f"fp32 graph drifted: cosine {acc.min_cosine:.6f}",
    )
    return outcome, ((prep.fp32, acc, []) if ok else None)


def _on_target(
    outcome: CandidateOutcome, checked: Checked, measurer: Measurer, checker: Checker
) -> Attempt:
    """The CPU provider hides FP16 arithmetic (it casts back to FP32): on a GPU target the
    candidate must also match FP32 where it will run."""
    provider = measurer.target.provider
    on_target = checker.check(
        measurer.outputs(
            checked[0].SerializeToString(), SessionProfile(provider=provider), checker.calib
        )
    )
    if not checker.passes(on_target):
        return replace(
            outcome,
            accepted=False,
            accuracy=on_target,
            reason=f"on {provider}: min cosine {on_target.min_cosine:.6f}, "
            f"top-1 mismatches {on_target.top1_mismatches}, non-finite "
            f"{on_target.nonfinite_count}",
        ), None
    return replace(outcome, accuracy=on_target), (checked[0], on_target, checked[2])


def _fp16_variants(found: _Found, fp16_checked: Checked, measurer: Measurer, c: Checker) -> None:
    """The accepted FP16 model's variants: with ORT's fused ops, and (on a GPU) each of them
    with float16 graph I/O."""
    if c.policy.allow_ort_contrib_ops:
        found.add(try_fp16_fused(fp16_checked, measurer, c), FP16_FUSED)
    if measurer.target.provider != CPU_EP:
        for name, src in [("fp16", fp16_checked), *found.extra.items()]:
            found.add(try_fp16_io(name, src, measurer, c), f"{name}{IO_SUFFIX}")


def _untimed(found: _Found) -> _Choice:
    precision = next(iter(found.by_precision))
    artifact, acc, fallback = found.by_precision[precision]
    return _Choice(
        precision=precision,
        artifact=artifact,
        accuracy=acc,
        fallback=fallback,
        profile=SessionProfile(
            notes=("untimed: no measurer was injected; chosen by priority order",)
        ),
        outcomes=found.outcomes,
    )


def _timed(prep: _Prepared, found: _Found, measurer: Measurer, target: TargetInfo) -> _Choice:
    policy = prep.checker.policy
    pick, verdicts, profiles, ms = _time_and_select(measurer, target, prep, found, policy)
    cand, label = pick
    if cand == BASELINE:
        if not _fp32_allowed(policy):
            raise NoFasterCandidate(
                "no candidate beat the FP32 baseline on "
                f"{target.provider}, and the policy leaves FP32 out: "
                + "; ".join(f"{v.candidate}@{v.profile.label}: {v.reason}" for v in verdicts)
            )
        precision = Precision.FP32
        checker = prep.checker
        fallback: list[FallbackNode] = []
        artifact, acc = fp16.name_nodes(prep.pinned), checker.check(checker.reference)
    elif cand in found.extra:
        precision = Precision.FP16  # every extra candidate is an FP16 variant
        artifact, acc, fallback = found.extra[cand]
    else:
        precision = Precision(cand)
        artifact, acc, fallback = found.by_precision[precision]
    profile = _with_notes(profiles[label], cand, verdicts)
    if cand.endswith(IO_SUFFIX):
        profile = replace(profile, io_dtype="float16")
    return _Choice(
        precision=precision,
        artifact=artifact,
        accuracy=acc,
        fallback=fallback,
        profile=profile,
        outcomes=[_with_timing(o, verdicts) for o in found.outcomes],
        timings=tuple(verdicts),
        before_ms=ms[(BASELINE, _plain_label(target))],
        after_ms=ms[pick],
    )


def _result(
    prep: _Prepared, choice: _Choice, measurer: Measurer | None, target: TargetInfo | None
) -> CompileResult:
    policy = prep.checker.policy
    results = list(prep.passes)
    if prep.fuse_note is not None:
        results.append(_fuse_note_for(prep.fuse_note, choice.precision))
    artifact = with_profile(choice.artifact, choice.profile)
    artifact_bytes = artifact.SerializeToString()
    before = VariantMetrics(
        nodes=node_count(prep.original),
        size_bytes=prep.original.ByteSize(),
        latency_median_ms=choice.before_ms,
    )
    after = VariantMetrics(
        nodes=node_count(artifact),
        size_bytes=len(artifact_bytes),
        latency_median_ms=choice.after_ms,
    )
    rss = getattr(measurer, "peak_rss_mb", None)
    if policy.measure_runs > 0 and rss is not None:
        feeds: Feeds = prep.checker.calib[0]
        plain = SessionProfile(provider=_PROVIDER[policy.target])
        before = replace(before, peak_rss_mb=rss(prep.pinned.SerializeToString(), plain, feeds))
        after = replace(after, peak_rss_mb=rss(artifact_bytes, choice.profile, feeds))
    report = CompileReport(
        precision=choice.precision,
        model_kind=prep.kind.value,
        passes=tuple(results),
        accuracy=choice.accuracy,
        fallback_nodes=tuple(choice.fallback),
        candidates=tuple(choice.outcomes),
        before=before,
        after=after,
        profile=choice.profile,
        target=target,
        timings=choice.timings,
    )
    return CompileResult(model_bytes=artifact_bytes, report=report)


def _fuse_note_for(note: PassResult, precision: Precision) -> PassResult:
    """The INT8 and FP16 candidates start from the unfused graph: fused attention then dynamic
    INT8 ran slower than INT8 alone here (research note, §4.4), and contrib ops stay FP32 in
    the FP16 plan. ORT fuses what it can at load either way."""
    if precision is Precision.FP32 or not note.fired:
        return note
    return PassResult(
        name=note.name,
        fired=False,
        nodes_before=note.nodes_before,
        nodes_after=note.nodes_before,
        detail=f"not used for {precision}: {note.detail}",
    )


def _plain_label(target: TargetInfo) -> str:
    return SessionProfile(provider=target.provider).label


def _time_and_select(
    measurer: Measurer,
    target: TargetInfo,
    prep: _Prepared,
    found: _Found,
    policy: PrecisionPolicy,
) -> tuple[
    tuple[str, str],
    list[TimingResult],
    dict[str, SessionProfile],
    dict[tuple[str, str], float | None],
]:
    """Every accepted candidate and the baseline under every profile, timed in one call."""
    profiles = {p.label: p for p in candidate_profiles(target, prep.kind is int8.ModelKind.CONV)}
    models = {BASELINE: prep.pinned.SerializeToString()}
    models.update({str(p): m.SerializeToString() for p, (m, _, _) in found.by_precision.items()})
    models.update({name: m.SerializeToString() for name, (m, _, _) in found.extra.items()})
    variants = [
        (f"{cand}@{label}", data, prof)
        for cand, data in models.items()
        for label, prof in profiles.items()
    ]
    got = measurer.time(variants, prep.checker.calib[0])
    ms: dict[tuple[str, str], Timing] = {}
    for name, t in got.items():
        cand, _, label = name.partition("@")
        ms[(cand, label)] = t
    pick, verdicts = select(
        ms,
        profiles,
        accepted=[str(p) for p in found.by_precision] + list(found.extra),
        priority=[str(p) for p in policy.priority_order] + list(found.extra),
        baseline_label=_plain_label(target),
    )
    medians = {k: (t.median_ms if t.error is None else None) for k, t in ms.items()}
    return pick, verdicts, profiles, medians


def _with_notes(
    profile: SessionProfile, cand: str, verdicts: Sequence[TimingResult]
) -> SessionProfile:
    """The chosen profile, saying why CUDA-graph capture is off when it is (on a GPU)."""
    if profile.provider != CUDA_EP or profile.cuda_graph:
        return profile
    graph = [v for v in verdicts if v.candidate == cand and v.profile.cuda_graph]
    notes = [f"cuda_graph off: {v.reason}" for v in graph[:1]]
    return replace(profile, notes=profile.notes + tuple(notes))


def _with_timing(o: CandidateOutcome, verdicts: Sequence[TimingResult]) -> CandidateOutcome:
    mine = [v for v in verdicts if v.candidate == o.candidate]
    if not mine:
        return o
    timed = [v for v in mine if v.median_ms is not None]
    best = min(timed, key=lambda v: v.median_ms or 0.0) if timed else mine[0]
    chosen = next((v for v in mine if v.chosen), None)
    v = chosen or best
    return replace(o, latency_ms=v.median_ms, verdict=f"{v.profile.label}: {v.reason}")
