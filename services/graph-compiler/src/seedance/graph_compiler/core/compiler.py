"""``compile_model``: one ONNX model and a precision policy in, a checked artifact and a report out.

Owns the order of work: load and check, graph passes, then every candidate of the policy's
priority order built with per-node fallback and checked against the FP32 reference on the
calibration inputs (on the target provider too, for a GPU), then all accepted candidates, each
under the session profiles worth trying there, timed on the target through the injected
``Measurer`` beside the FP32 baseline, and the fastest pair that beats the baseline returned
with its deployment profile in the artifact's metadata (``core/selection.py`` holds the rule).
Every returned artifact has been loaded and run by ONNX Runtime and passed its check; anything
else raises a ``CompileError``. Must not talk to the bus or the object store (the service's
adapter does), and never reads the clock or spawns processes: timing is the measurer's.
Without a measurer a CPU compile takes the first accepted candidate in priority order and says
so in the report; a GPU compile without a measurer on the GPU is refused (``TargetUnavailable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from seedance.graph_compiler.core import fp16, int8, passes, runtime
from seedance.graph_compiler.core.accuracy import Accuracy, compare_outputs
from seedance.graph_compiler.core.errors import (
    AccuracyCheckFailed,
    InvalidModel,
    NoFasterCandidate,
    TargetUnavailable,
    UnsupportedOperator,
)
from seedance.graph_compiler.core.loading import load_model, node_count
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
from seedance.graph_compiler.core.selection import BASELINE, Measurer, TimingResult, select

__all__ = [
    "CandidateOutcome",
    "CompileReport",
    "CompileResult",
    "FallbackNode",
    "VariantMetrics",
    "compile_model",
]

# The FP16 emulation runs node by node; a few samples find overflow as well as many do.
_FP16_SAMPLES = 2
# Ops whose rank-2 float output is a classifier's scores (logits or probabilities).
_SCORE_OPS = frozenset({"Gemm", "MatMul", "Add", "Softmax", "LogSoftmax"})
_PROVIDER = {Target.CPU: CPU_EP, Target.CUDA: CUDA_EP}
# The FP16 artifact with ORT's fused transformer ops (attention, SkipLayerNorm) on top: timed as
# its own candidate, since the fusions pay on one provider and not another.
FP16_FUSED = "fp16_fused"
# The same with FP16 graph inputs/outputs (no casts at the edges; callers feed float16).
_IO_SUFFIX = "_io"


@dataclass(frozen=True, kw_only=True)
class FallbackNode:
    node: str
    op_type: str
    kept_in: Precision  # the precision the node stayed in
    reason: str


@dataclass(frozen=True, kw_only=True)
class CandidateOutcome:
    precision: Precision
    accepted: bool
    reason: str
    accuracy: Accuracy | None = None
    attempts: int = 0
    fallback_nodes: int = 0
    latency_ms: float | None = None  # its best time on the target (None: not timed)
    verdict: str = ""  # why it was chosen or lost, from the timing
    name: str = ""  # the timed candidate's name where it differs from the precision

    @property
    def candidate(self) -> str:
        return self.name or str(self.precision)


@dataclass(frozen=True, kw_only=True)
class VariantMetrics:
    nodes: int
    size_bytes: int
    latency_median_ms: float | None = None  # on the target: baseline plain / chosen profile
    peak_rss_mb: float | None = None


@dataclass(frozen=True, kw_only=True)
class CompileReport:
    precision: Precision
    model_kind: str
    passes: tuple[PassResult, ...]
    accuracy: Accuracy
    fallback_nodes: tuple[FallbackNode, ...]
    candidates: tuple[CandidateOutcome, ...]
    before: VariantMetrics
    after: VariantMetrics
    profile: SessionProfile = field(default_factory=SessionProfile)
    target: TargetInfo | None = None  # None: untimed compile (no measurer)
    timings: tuple[TimingResult, ...] = ()

    @property
    def passes_fired(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes if p.fired)

    @property
    def machine(self) -> str:
        return self.target.machine if self.target else "untimed (no measurer)"


@dataclass(frozen=True, kw_only=True)
class CompileResult:
    model_bytes: bytes
    report: CompileReport


# ORT's load errors that mean "an operator has no kernel here", as opposed to a broken graph.
_UNSUPPORTED_MARKERS = (
    "NOT_IMPLEMENTED",
    "Could not find an implementation",
    "is not a registered function/op",
    "No Op registered",
)


def _ort_load(model: onnx.ModelProto, level: str = "disable"):
    try:
        return runtime.make_session(model, level, threads=2)
    except InvalidModel as exc:
        text = str(exc)
        if any(marker in text for marker in _UNSUPPORTED_MARKERS):
            nodes = tuple(
                n.name or f"<unnamed {n.op_type}>"
                for n in model.graph.node
                if (n.name and n.name in text) or f"{n.op_type}(" in text
            )
            raise UnsupportedOperator(text, nodes) from exc
        raise


def _outputs(model: onnx.ModelProto, feeds: Sequence[runtime.Feeds], level: str):
    sess = _ort_load(model, level)
    return [runtime.run(sess, f) for f in feeds]


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


def compile_model(
    model: bytes | str | Path | onnx.ModelProto,
    policy: PrecisionPolicy | None = None,
    measurer: Measurer | None = None,
) -> CompileResult:
    """Compile ``model`` under ``policy`` (defaults: INT8, then FP16, then FP32, CPU target),
    choosing among the accepted candidates by their time on ``measurer``'s provider."""
    policy = policy or PrecisionPolicy()
    target = _check_target(policy, measurer)
    original = load_model(model)
    pinned, pin_result = passes.pin_static_shapes(original, policy.input_shapes)
    _ort_load(pinned)  # refuses models ORT cannot even load, with a named error
    calib = runtime.sample_inputs(pinned, policy.calibration_samples, policy.seed)
    reference = _outputs(pinned, calib, "disable")
    scores = classifier_outputs(pinned) if policy.require_top1 else frozenset()

    def check(outs) -> Accuracy:
        return compare_outputs(reference, outs, scores)

    base, results = passes.run_pipeline(pinned, _base_pipeline(policy)[1:])
    results.insert(0, pin_result)
    base = fp16.name_nodes(base)
    if not check(_outputs(base, calib, "disable")).passes(policy.min_cosine, None):
        # A pass changed the numerics beyond float re-association: ship without the passes.
        base = fp16.name_nodes(pinned)
        results = [pin_result]

    fp32_model = base
    fuse_note: PassResult | None = None
    if policy.allow_ort_contrib_ops:
        fused, (fuse_result,) = passes.run_pipeline(base, [passes.fuse_transformer_ops])
        if fuse_result.fired and check(_outputs(fused, calib, "disable")).passes(
            policy.min_cosine, policy.max_abs_err
        ):
            fp32_model = fused
            fuse_note = fuse_result
        else:
            fuse_note = PassResult(
                name=fuse_result.name,
                fired=False,
                nodes_before=fuse_result.nodes_before,
                nodes_after=fuse_result.nodes_before,
                detail="nothing fused" if not fuse_result.fired else "rejected: accuracy",
            )

    kind = int8.classify(base)
    outcomes: list[CandidateOutcome] = []
    found_all: dict[Precision, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]]] = {}
    extra: dict[str, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]]] = {}
    for precision in policy.priority_order:
        if precision is Precision.INT8:
            if target is not None and not target.int8_accelerated:
                outcome = CandidateOutcome(
                    precision=precision,
                    accepted=False,
                    reason=f"skipped: {target.provider} has no fast INT8 kernels (QDQ runs "
                    "dequantised there); only an INT8-accelerating provider makes it a candidate",
                )
                found = None
            else:
                outcome, found = _try_int8(base, kind, calib, reference, scores, policy)
        elif precision is Precision.FP16:
            outcome, found = _try_fp16(base, calib, reference, scores, policy)
        else:
            acc = check(_outputs(fp32_model, calib, "all"))
            ok = acc.passes(policy.min_cosine, policy.max_abs_err)
            outcome = CandidateOutcome(
                precision=precision,
                accepted=ok,
                accuracy=acc,
                attempts=1,
                reason="accepted" if ok else f"fp32 graph drifted: cosine {acc.min_cosine:.6f}",
            )
            found = (fp32_model, acc, []) if ok else None
        if found is not None and target is not None and target.provider != CPU_EP:
            # The CPU provider hides FP16 arithmetic (it casts back to FP32): on a GPU target
            # the candidate must also match FP32 where it will run.
            on_target = check(
                measurer.outputs(  # type: ignore[union-attr]
                    found[0].SerializeToString(), SessionProfile(provider=target.provider), calib
                )
            )
            if not on_target.passes(policy.min_cosine, policy.max_abs_err):
                outcome = replace(
                    outcome,
                    accepted=False,
                    accuracy=on_target,
                    reason=f"on {target.provider}: min cosine {on_target.min_cosine:.6f}, "
                    f"top-1 mismatches {on_target.top1_mismatches}, non-finite "
                    f"{on_target.nonfinite_count}",
                )
                found = None
            else:
                outcome = replace(outcome, accuracy=on_target)
                found = (found[0], on_target, found[2])
        outcomes.append(outcome)
        if found is not None:
            found_all[precision] = found
            if measurer is None:
                break  # untimed: the first accepted candidate in priority order
            if precision is Precision.FP16 and policy.allow_ort_contrib_ops:
                fused_outcome, fused = _try_fp16_fused(found, measurer, calib, check, policy)
                if fused_outcome is not None:
                    outcomes.append(fused_outcome)
                if fused is not None:
                    extra[FP16_FUSED] = fused
            if precision is Precision.FP16 and target is not None and target.provider != CPU_EP:
                for name, src in [("fp16", found), *extra.items()]:
                    io_outcome, io = _try_fp16_io(name, src, measurer, calib, check, policy)
                    if io_outcome is not None:
                        outcomes.append(io_outcome)
                    if io is not None:
                        extra[f"{name}{_IO_SUFFIX}"] = io
    fp32_allowed = Precision.FP32 in policy.priority_order
    if not found_all and not (measurer is not None and fp32_allowed):
        raise AccuracyCheckFailed(
            "no precision passed its accuracy check: "
            + "; ".join(f"{o.precision}: {o.reason}" for o in outcomes)
        )

    timings: tuple[TimingResult, ...] = ()
    if measurer is None or target is None:
        precision = next(iter(found_all))
        artifact, acc, fallback = found_all[precision]
        profile = SessionProfile(
            notes=("untimed: no measurer was injected; chosen by priority order",)
        )
        before_ms = after_ms = None
    else:
        pick, verdicts, profiles, ms = _time_and_select(
            measurer, target, pinned, found_all, extra, kind, calib[0], policy
        )
        cand, label = pick
        timings = tuple(verdicts)
        if cand == BASELINE:
            if not fp32_allowed:
                raise NoFasterCandidate(
                    "no candidate beat the FP32 baseline on "
                    f"{target.provider}, and the policy leaves FP32 out: "
                    + "; ".join(f"{v.candidate}@{v.profile.label}: {v.reason}" for v in verdicts)
                )
            precision = Precision.FP32
            artifact, acc, fallback = fp16.name_nodes(pinned), check(reference), []
        elif cand in extra:
            precision = Precision.FP16  # every extra candidate is an FP16 variant
            artifact, acc, fallback = extra[cand]
        else:
            precision = Precision(cand)
            artifact, acc, fallback = found_all[precision]
        profile = _with_notes(profiles[label], cand, verdicts)
        if cand.endswith(_IO_SUFFIX):
            profile = replace(profile, io_dtype="float16")
        outcomes = [_with_timing(o, verdicts) for o in outcomes]
        before_ms, after_ms = ms[(BASELINE, _plain_label(target))], ms[pick]
    if fuse_note is not None:
        # The INT8 and FP16 candidates start from the unfused graph: fused attention then
        # dynamic INT8 ran slower than INT8 alone here (research note, §4.4), and contrib ops
        # stay FP32 in the FP16 plan. ORT fuses what it can at load either way.
        if precision is not Precision.FP32 and fuse_note.fired:
            fuse_note = PassResult(
                name=fuse_note.name,
                fired=False,
                nodes_before=fuse_note.nodes_before,
                nodes_after=fuse_note.nodes_before,
                detail=f"not used for {precision}: {fuse_note.detail}",
            )
        results.append(fuse_note)
    artifact = with_profile(artifact, profile)
    artifact_bytes = artifact.SerializeToString()
    before = VariantMetrics(
        nodes=node_count(original), size_bytes=original.ByteSize(), latency_median_ms=before_ms
    )
    after = VariantMetrics(
        nodes=node_count(artifact), size_bytes=len(artifact_bytes), latency_median_ms=after_ms
    )
    rss = getattr(measurer, "peak_rss_mb", None)
    if policy.measure_runs > 0 and rss is not None:
        plain = SessionProfile(provider=_PROVIDER[policy.target])
        before = replace(before, peak_rss_mb=rss(pinned.SerializeToString(), plain, calib[0]))
        after = replace(after, peak_rss_mb=rss(artifact_bytes, profile, calib[0]))
    report = CompileReport(
        precision=precision,
        model_kind=kind.value,
        passes=tuple(results),
        accuracy=acc,
        fallback_nodes=tuple(fallback),
        candidates=tuple(outcomes),
        before=before,
        after=after,
        profile=profile,
        target=target,
        timings=timings,
    )
    return CompileResult(model_bytes=artifact_bytes, report=report)


def _plain_label(target: TargetInfo) -> str:
    return SessionProfile(provider=target.provider).label


def _time_and_select(
    measurer: Measurer,
    target: TargetInfo,
    pinned: onnx.ModelProto,
    found: dict[Precision, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]]],
    extra: dict[str, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]]],
    kind: int8.ModelKind,
    feeds: runtime.Feeds,
    policy: PrecisionPolicy,
):
    """Every accepted candidate and the baseline under every profile, timed in one call."""
    profiles = {p.label: p for p in candidate_profiles(target, kind is int8.ModelKind.CONV)}
    models = {BASELINE: pinned.SerializeToString()}
    models.update({str(p): m.SerializeToString() for p, (m, _, _) in found.items()})
    models.update({name: m.SerializeToString() for name, (m, _, _) in extra.items()})
    variants = [
        (f"{cand}@{label}", data, prof)
        for cand, data in models.items()
        for label, prof in profiles.items()
    ]
    got = measurer.time(variants, feeds)
    ms = {tuple(name.split("@", 1)): t for name, t in got.items()}
    pick, verdicts = select(
        ms,
        profiles,
        accepted=[str(p) for p in found] + list(extra),
        priority=[str(p) for p in policy.priority_order] + list(extra),
        baseline_label=_plain_label(target),
    )
    medians = {k: (t.median_ms if t.error is None else None) for k, t in ms.items()}
    return pick, verdicts, profiles, medians


def _with_notes(profile: SessionProfile, cand: str, verdicts: Sequence[TimingResult]):
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


def _int8_exclusion_plan(candidates: list[str], attempts: int) -> list[list[str]]:
    """Exclusion sets to try after the full INT8 model fails: the stem and head first (the
    layers most sensitive to quantisation in CNNs and encoders alike), then growing shares of
    the graph from the output end, where quantisation error has compounded most."""
    n = len(candidates)
    plans: list[list[str]] = []
    if n >= 2:
        plans.append([candidates[0], candidates[-1]])
    for share in (0.25, 0.5):
        tail = candidates[n - max(1, int(n * share)) :]
        plans.append(list(dict.fromkeys([candidates[0], *tail])))
    return plans[: max(0, attempts - 1)]


def _try_int8(
    base: onnx.ModelProto,
    kind: int8.ModelKind,
    calib: Sequence[runtime.Feeds],
    reference,
    scores: frozenset[int],
    policy: PrecisionPolicy,
) -> tuple[CandidateOutcome, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]] | None]:
    ops = {n.name: n.op_type for n in base.graph.node}
    candidates = int8.quantizable_nodes(base, kind)
    if not candidates:
        return CandidateOutcome(
            precision=Precision.INT8, accepted=False, reason=f"nothing to quantise ({kind})"
        ), None
    plans: list[list[str]] = [[]]
    plans += _int8_exclusion_plan(candidates, policy.max_fallback_attempts)
    last: Accuracy | None = None
    first: Accuracy | None = None
    for attempt, exclude in enumerate(plans, start=1):
        try:
            q = int8.quantize(base, kind, calib, exclude)
            acc = compare_outputs(reference, _outputs(q, calib, "all"), scores)
        except Exception as exc:  # the quantiser raises bare Exceptions on graphs it cannot type
            return CandidateOutcome(
                precision=Precision.INT8,
                accepted=False,
                attempts=attempt,
                reason=f"{kind} quantisation failed: {exc}",
            ), None
        last = acc
        if acc.passes(policy.int8_failure_threshold, policy.max_abs_err):
            full_cos = f"{first.min_cosine:.6f}" if first is not None else ""
            fallback = [
                FallbackNode(
                    node=n,
                    op_type=ops[n],
                    kept_in=Precision.FP32,
                    reason=f"full INT8 min cosine {full_cos} < "
                    f"{policy.int8_failure_threshold}; kept in float",
                )
                for n in exclude
            ]
            return CandidateOutcome(
                precision=Precision.INT8,
                accepted=True,
                accuracy=acc,
                attempts=attempt,
                fallback_nodes=len(fallback),
                reason=f"accepted ({kind}, {attempt} attempt(s))",
            ), (q, acc, fallback)
        if first is None:
            first = acc
    return CandidateOutcome(
        precision=Precision.INT8,
        accepted=False,
        accuracy=last,
        attempts=len(plans),
        reason=f"{kind} INT8 min cosine {last.min_cosine if last else float('nan'):.6f} "
        f"(top-1 mismatches {last.top1_mismatches if last else 0}) below "
        f"int8_failure_threshold {policy.int8_failure_threshold} after {len(plans)} attempts",
    ), None


def _try_fp16(
    base: onnx.ModelProto,
    calib: Sequence[runtime.Feeds],
    reference,
    scores: frozenset[int],
    policy: PrecisionPolicy,
) -> tuple[CandidateOutcome, tuple[onnx.ModelProto, Accuracy, list[FallbackNode]] | None]:
    if policy.target is Target.CPU:
        # ORT's CPU provider casts FP16 weights back to FP32: no compute gain, often slower.
        return CandidateOutcome(
            precision=Precision.FP16,
            accepted=False,
            reason="skipped: FP16 has no compute path on the CPU target",
        ), None
    # The mask fill first: finfo(float32).min is not an FP16 number, and left alone it pins
    # every attention Add+Softmax to FP32 (24 fallbacks and their casts in BERT-base).
    base, _filled = fp16.safe_mask_fill(base)
    emulator = fp16.Fp16Emulator(base)
    samples = calib[:_FP16_SAMPLES]
    refs = [emulator.run(f, None) for f in samples]
    dtypes = emulator.dtypes(refs[0])
    outs = [o.name for o in base.graph.output]
    ops = {n.name: n.op_type for n in base.graph.node}
    block: dict[str, str] = {}
    acc: Accuracy | None = None
    for attempt in range(1, policy.max_fallback_attempts + 1):
        plan = fp16.fp16_plan(base, dtypes, block)
        emus = [emulator.run(f, plan) for f in samples]
        acc = compare_outputs(
            [[r[o] for o in outs] for r in refs], [[e[o] for o in outs] for e in emus], scores
        )
        findings = emulator.findings(refs, emus)
        new = _fp16_blocks(findings, plan, emus, base)
        if not new and acc.passes(policy.min_cosine, policy.max_abs_err):
            converted = fp16.convert_to_fp16(base, dtypes, block)
            try:
                got = _outputs(converted, calib, "disable")
            except (InvalidModel, UnsupportedOperator) as exc:
                return CandidateOutcome(
                    precision=Precision.FP16,
                    accepted=False,
                    attempts=attempt,
                    reason=f"converted model does not load: {exc}",
                ), None
            # On the CPU provider this only shows weight rounding; the emulation above is the
            # check that counts, and it is what the reported accuracy says.
            if not compare_outputs(reference, got, scores).passes(
                policy.min_cosine, policy.max_abs_err
            ):
                return CandidateOutcome(
                    precision=Precision.FP16,
                    accepted=False,
                    attempts=attempt,
                    reason="converted model disagrees with FP32",
                ), None
            fallback = [
                FallbackNode(node=n, op_type=ops[n], kept_in=Precision.FP32, reason=r)
                for n, r in block.items()
            ]
            return CandidateOutcome(
                precision=Precision.FP16,
                accepted=True,
                accuracy=acc,
                attempts=attempt,
                fallback_nodes=len(fallback),
                reason=f"accepted ({attempt} attempt(s))",
            ), (converted, acc, fallback)
        if not new:
            # No overflow left to blame: keep the nodes with the largest FP16 error in FP32.
            ranked = sorted(
                (f for f in findings if plan.get(f.node) is None),
                key=lambda f: f.rel_err,
                reverse=True,
            )
            k = max(1, len(ranked) // 10)
            new = {
                f.node: f"among the largest FP16 errors (rel {f.rel_err:.2e})" for f in ranked[:k]
            }
        block.update(new)
    reason = "no FP16 plan passed the emulated check"
    if acc is not None:
        reason += f" (last min cosine {acc.min_cosine:.6f}, non-finite {acc.nonfinite_count})"
    return CandidateOutcome(
        precision=Precision.FP16,
        accepted=False,
        accuracy=acc,
        attempts=policy.max_fallback_attempts,
        reason=reason,
    ), None


def _try_fp16_fused(found, measurer, calib, check, policy):
    """ORT's fused attention / SkipLayerNorm / GELU ops on the accepted FP16 model (GPU only:
    the emulator cannot run contrib ops, so this candidate is checked where it will run)."""
    if measurer.target.provider == CPU_EP:
        return None, None
    model, _, fallback = found
    fused, (res,) = passes.run_pipeline(model, [passes.fuse_transformer_ops])
    if not res.fired:
        return None, None
    return _checked_on_target(
        fused, FP16_FUSED, fallback, measurer, calib, check, policy,
        what="fused FP16", accepted=f"accepted: FP16 + {res.detail}",
    )  # fmt: skip


def _try_fp16_io(name, found, measurer, calib, check, policy):
    """``found`` with FP16 graph inputs/outputs, checked on the target (GPU only)."""
    model, _, fallback = found
    io_model, changed = fp16.fp16_io(model)
    if not changed:
        return None, None
    return _checked_on_target(
        io_model, f"{name}{_IO_SUFFIX}", fallback, measurer, calib, check, policy,
        what=f"{name} with float16 I/O",
        accepted=f"accepted: {name} with float16 I/O ({', '.join(changed)})",
    )  # fmt: skip


def _checked_on_target(variant, cand, fallback, measurer, calib, check, policy, *, what, accepted):
    """An FP16 variant run and checked for accuracy on the target itself: its outcome, and the
    (model, accuracy, fallback nodes) to time when it is accepted."""
    provider = measurer.target.provider
    try:
        outs = measurer.outputs(
            variant.SerializeToString(), SessionProfile(provider=provider), calib
        )
    except Exception as exc:  # ORT's load/run errors: the candidate is dropped with the reason
        return CandidateOutcome(
            precision=Precision.FP16,
            name=cand,
            accepted=False,
            reason=f"{what} does not run on {provider}: {exc}"[:500],
        ), None
    acc = check(outs)
    ok = acc.passes(policy.min_cosine, policy.max_abs_err)
    outcome = CandidateOutcome(
        precision=Precision.FP16,
        name=cand,
        accepted=ok,
        accuracy=acc,
        attempts=1,
        fallback_nodes=len(fallback),
        reason=(
            accepted
            if ok
            else f"{what} on {provider}: min cosine {acc.min_cosine:.6f}, "
            f"non-finite {acc.nonfinite_count}"
        ),
    )
    return outcome, ((variant, acc, fallback) if ok else None)


def _fp16_blocks(findings, plan, emus, base: onnx.ModelProto) -> dict[str, str]:
    """Nodes to move to FP32: those whose FP32 values leave the FP16 range, and the first
    nodes (root causes, not their downstream victims) that produce Inf/NaN in the emulation."""
    new: dict[str, str] = {}
    for f in findings:
        if plan.get(f.node) is None and f.ref_max_abs > fp16.FP16_MAX:
            new[f.node] = f"FP32 magnitude {f.ref_max_abs:.3g} exceeds FP16 max {fp16.FP16_MAX:.0f}"
    if new:
        return new
    bad_tensors: set[str] = set()
    for node in base.graph.node:
        outs_bad = any(
            e.get(o) is not None and e[o].dtype == np.float32 and not np.all(np.isfinite(e[o]))
            for e in emus
            for o in node.output
        )
        ins_bad = any(i in bad_tensors for i in node.input)
        if outs_bad:
            bad_tensors.update(node.output)
            if not ins_bad and plan.get(node.name) is None:
                new[node.name] = "produces Inf/NaN in FP16 from finite inputs"
    return new
