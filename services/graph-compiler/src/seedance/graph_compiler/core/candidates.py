"""Each precision's candidate built with per-node fallback and checked against FP32.

Owns the INT8 search (the full model, then exclusion sets from the stem and head towards the
output end), the FP16 search (the emulated plan, nodes that overflow or err most moved to FP32,
then the converted model loaded and compared), and the FP16 variants checked on the target
itself (ORT's fused transformer ops; float16 graph I/O). Each returns the candidate's
``CandidateOutcome`` and, when it is accepted, the ``Checked`` triple to time. Must not time
anything or choose between candidates (the compiler and ``selection`` do).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from seedance.graph_compiler.core import fp16, int8, passes
from seedance.graph_compiler.core.accuracy import Accuracy, compare_outputs
from seedance.graph_compiler.core.checking import Checker
from seedance.graph_compiler.core.errors import (
    InvalidModel,
    RunBudgetExhausted,
    UnsupportedOperator,
)
from seedance.graph_compiler.core.policy import Precision, Target
from seedance.graph_compiler.core.profile import CPU_EP, SessionProfile
from seedance.graph_compiler.core.report import CandidateOutcome, FallbackNode
from seedance.graph_compiler.core.selection import Measurer

__all__ = [
    "FP16_FUSED",
    "IO_SUFFIX",
    "Attempt",
    "Checked",
    "try_fp16",
    "try_fp16_fused",
    "try_fp16_io",
    "try_int8",
]

#: An accepted candidate: the model, its accuracy, the nodes it kept in a wider precision.
Checked = tuple[onnx.ModelProto, Accuracy, list[FallbackNode]]
#: A candidate's outcome, and what to time when it was accepted.
Attempt = tuple[CandidateOutcome, Checked | None]

# The FP16 emulation runs node by node; a few samples find overflow as well as many do.
_FP16_SAMPLES = 2
# The FP16 artifact with ORT's fused transformer ops (attention, SkipLayerNorm) on top: timed as
# its own candidate, since the fusions pay on one provider and not another.
FP16_FUSED = "fp16_fused"
# The same with FP16 graph inputs/outputs (no casts at the edges; callers feed float16).
IO_SUFFIX = "_io"


# --- INT8 ---------------------------------------------------------------------------------------


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


def try_int8(
    base: onnx.ModelProto, kind: int8.ModelKind, checker: Checker, quantizer: int8.Quantizer
) -> Attempt:
    policy = checker.policy
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
            q = quantizer.quantize(base, kind, checker.calib, exclude)
            acc = checker.check(checker.run(q, "all"))
        except RunBudgetExhausted:
            raise  # the compile's, not this candidate's: it ends the compile
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


# --- FP16 ---------------------------------------------------------------------------------------


def try_fp16(base: onnx.ModelProto, checker: Checker) -> Attempt:
    policy = checker.policy
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
    emulator = fp16.Fp16Emulator(base, checker.sessions)
    samples = checker.calib[:_FP16_SAMPLES]
    refs = [emulator.run(f, None) for f in samples]
    dtypes = emulator.dtypes(refs[0])
    outs = [o.name for o in base.graph.output]
    block: dict[str, str] = {}
    acc: Accuracy | None = None
    for attempt in range(1, policy.max_fallback_attempts + 1):
        plan = fp16.fp16_plan(base, dtypes, block)
        emus = [emulator.run(f, plan) for f in samples]
        acc = compare_outputs(
            [[r[o] for o in outs] for r in refs],
            [[e[o] for o in outs] for e in emus],
            checker.scores,
        )
        findings = emulator.findings(refs, emus)
        new = _fp16_blocks(findings, plan, emus, base)
        if not new and checker.passes(acc):
            return _fp16_converted(base, dtypes, block, acc, attempt, checker)
        block.update(new or _largest_errors(findings, plan))
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


def _fp16_converted(
    base: onnx.ModelProto,
    dtypes: Mapping[str, np.dtype],
    block: Mapping[str, str],
    acc: Accuracy,
    attempt: int,
    checker: Checker,
) -> Attempt:
    """The plan that passed the emulated check, converted, loaded and compared with FP32."""
    converted = fp16.convert_to_fp16(base, dtypes, block)
    try:
        got = checker.run(converted, "disable")
    except (InvalidModel, UnsupportedOperator) as exc:
        return CandidateOutcome(
            precision=Precision.FP16,
            accepted=False,
            attempts=attempt,
            reason=f"converted model does not load: {exc}",
        ), None
    # On the CPU provider this only shows weight rounding; the emulation is the check that
    # counts, and it is what the reported accuracy says.
    if not checker.passes(checker.check(got)):
        return CandidateOutcome(
            precision=Precision.FP16,
            accepted=False,
            attempts=attempt,
            reason="converted model disagrees with FP32",
        ), None
    ops = {n.name: n.op_type for n in base.graph.node}
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


def _largest_errors(
    findings: Sequence[fp16.NodeFinding], plan: Mapping[str, str | None]
) -> dict[str, str]:
    """No overflow left to blame: the nodes with the largest FP16 error, to keep in FP32."""
    ranked = sorted(
        (f for f in findings if plan.get(f.node) is None),
        key=lambda f: f.rel_err,
        reverse=True,
    )
    k = max(1, len(ranked) // 10)
    return {f.node: f"among the largest FP16 errors (rel {f.rel_err:.2e})" for f in ranked[:k]}


def _fp16_blocks(
    findings: Sequence[fp16.NodeFinding],
    plan: Mapping[str, str | None],
    emus: Sequence[Mapping[str, np.ndarray]],
    base: onnx.ModelProto,
) -> dict[str, str]:
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


# --- FP16 variants checked on the target --------------------------------------------------------


def try_fp16_fused(found: Checked, measurer: Measurer, checker: Checker) -> Attempt | None:
    """ORT's fused attention / SkipLayerNorm / GELU ops on the accepted FP16 model (GPU only:
    the emulator cannot run contrib ops, so this candidate is checked where it will run).
    None: nothing to try."""
    if measurer.target.provider == CPU_EP:
        return None
    model, _, fallback = found
    fused, (res,) = passes.run_pipeline(model, [passes.fuse_transformer_ops])
    if not res.fired:
        return None
    return _checked_on_target(
        fused, FP16_FUSED, fallback, measurer, checker,
        what="fused FP16", accepted=f"accepted: FP16 + {res.detail}",
    )  # fmt: skip


def try_fp16_io(name: str, found: Checked, measurer: Measurer, checker: Checker) -> Attempt | None:
    """``found`` with FP16 graph inputs/outputs, checked on the target (GPU only). None:
    nothing to change."""
    model, _, fallback = found
    io_model, changed = fp16.fp16_io(model)
    if not changed:
        return None
    return _checked_on_target(
        io_model, f"{name}{IO_SUFFIX}", fallback, measurer, checker,
        what=f"{name} with float16 I/O",
        accepted=f"accepted: {name} with float16 I/O ({', '.join(changed)})",
    )  # fmt: skip


def _checked_on_target(
    variant: onnx.ModelProto,
    cand: str,
    fallback: list[FallbackNode],
    measurer: Measurer,
    checker: Checker,
    *,
    what: str,
    accepted: str,
) -> Attempt:
    """An FP16 variant run and checked for accuracy on the target itself: its outcome, and the
    (model, accuracy, fallback nodes) to time when it is accepted."""
    provider = measurer.target.provider
    try:
        outs = measurer.outputs(
            variant.SerializeToString(), SessionProfile(provider=provider), checker.calib
        )
    except RunBudgetExhausted:
        raise  # the compile's, not this candidate's: it ends the compile
    except Exception as exc:  # ORT's load/run errors: the candidate is dropped with the reason
        return CandidateOutcome(
            precision=Precision.FP16,
            name=cand,
            accepted=False,
            reason=f"{what} does not run on {provider}: {exc}"[:500],
        ), None
    acc = checker.check(outs)
    ok = checker.passes(acc)
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
