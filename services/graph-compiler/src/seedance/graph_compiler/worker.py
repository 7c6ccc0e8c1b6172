"""What runs in the compile child process: compatibility check, compile, artifact to a file.

Owns the mapping from a request's event types to the core's inputs (policy, target) and from
the core's report and errors to the result's event types. It runs in a separate process so a
CPU-heavy compile never blocks the service's event loop, and a crash or a timeout kills only
the child. It builds the measurer for the request's target (``OrtMeasurer`` on the target's
execution provider: candidates are timed where they will run) and reports which providers this
process has (``capability``), which the service announces on the bus. Must not touch the bus or
the object store: paths in, a picklable outcome out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from seedance.events.graph import CandidateTiming
from seedance.events.graph import CompileReport as ReportEvent
from seedance.events.graph import FallbackNode as FallbackEvent
from seedance.events.graph import PrecisionPolicy as PolicyEvent
from seedance.graph_compiler.core.compat import (
    ORT_CPU,
    TRANSFORMER_GPU,
    CompatTarget,
    check_compatibility,
)
from seedance.graph_compiler.compiling import compile_model
from seedance.graph_compiler.core.errors import CompileError, IncompatibleModel, TargetUnavailable
from seedance.graph_compiler.core.policy import Precision, PrecisionPolicy, Target
from seedance.graph_compiler.core.profile import CPU_EP, CUDA_EP
from seedance.graph_compiler.core.report import CompileReport
from seedance.graph_compiler.measuring import (
    OrtMeasurer,
    available_providers,
    describe_machine,
    provider_loads,
)

__all__ = [
    "PROVIDERS",
    "TARGETS",
    "Capability",
    "Outcome",
    "capability",
    "compile_file",
    "core_policy",
    "needs_provider",
    "report_event",
]

#: A request's ``target`` → (the precision target, the compatibility target checked first).
TARGETS: dict[str, tuple[Target, CompatTarget]] = {
    "cpu": (Target.CPU, ORT_CPU),
    "cuda": (Target.CUDA, ORT_CPU),
    "transformer-gpu": (Target.CUDA, TRANSFORMER_GPU),
}


#: The execution provider each precision target is timed and served on.
PROVIDERS: dict[Target, str] = {Target.CPU: CPU_EP, Target.CUDA: CUDA_EP}


def needs_provider(target: str) -> str:
    """The execution provider a request's ``target`` must be compiled on (KeyError: unknown)."""
    return PROVIDERS[TARGETS[target][0]]


@dataclass(frozen=True)
class Capability:
    providers: tuple[str, ...]
    machine: str
    targets: tuple[str, ...]


def capability() -> Capability:
    """This process's execution providers (onnxruntime-gpu lists CUDA only where it loads) and
    the request targets it can therefore answer."""
    have = available_providers()
    if CUDA_EP in have and not provider_loads(CUDA_EP):
        # The GPU wheel lists CUDA even where no driver or CUDA libraries are (it then falls
        # back to the CPU silently): only a provider that loads a session is announced.
        have = [p for p in have if p != CUDA_EP]
    machine = describe_machine(CUDA_EP if CUDA_EP in have else CPU_EP).machine
    targets = tuple(t for t in TARGETS if needs_provider(t) in have)
    return Capability(providers=tuple(have), machine=machine, targets=targets)


@dataclass(frozen=True)
class Outcome:
    """A compile's result as the child reports it: a report and the artifact's digest, or a
    named error (the core error's class name) and its message."""

    report: ReportEvent | None = None
    artifact_sha256: str | None = None
    artifact_bytes: int = 0
    error_kind: str | None = None
    error: str | None = None


def core_policy(policy: PolicyEvent, target: str, measure_runs: int) -> PrecisionPolicy:
    """The request's policy as the core's; ValueError names what is wrong."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; known: {', '.join(sorted(TARGETS))}")
    try:
        order = tuple(Precision(p) for p in policy.priority_order)
    except ValueError as exc:
        raise ValueError(f"priority_order: {exc}") from exc
    return PrecisionPolicy(
        priority_order=order,
        int8_failure_threshold=policy.int8_failure_threshold,
        min_cosine=policy.fp16_min_cosine,
        target=TARGETS[target][0],
        measure_runs=measure_runs,
    )


def report_event(report: CompileReport) -> ReportEvent:
    return ReportEvent(
        nodes_before=report.before.nodes,
        nodes_after=report.after.nodes,
        precision=str(report.precision),
        passes_fired=list(report.passes_fired),
        latency_ms_before=report.before.latency_median_ms,
        latency_ms_after=report.after.latency_median_ms,
        peak_rss_mb_before=report.before.peak_rss_mb,
        peak_rss_mb_after=report.after.peak_rss_mb,
        cosine=report.accuracy.min_cosine,
        max_abs_err=report.accuracy.max_abs_err,
        fallback_nodes=[
            FallbackEvent(node=f.node, op_type=f.op_type, precision=str(f.kept_in), reason=f.reason)
            for f in report.fallback_nodes
        ],
        machine=report.machine,
        provider=report.target.provider if report.target else None,
        profile=report.profile.to_json(),
        timings=[
            CandidateTiming(
                candidate=t.candidate,
                profile=t.profile.label,
                median_ms=t.median_ms,
                chosen=t.chosen,
                reason=t.reason,
            )
            for t in report.timings
        ],
    )


def compile_file(
    model_path: str, out_path: str, policy: PrecisionPolicy, target: str, select_runs: int = 20
) -> Outcome:
    """Check, compile and write the artifact to ``out_path`` (only when the compile passed).
    Candidates are timed on the target's provider with ``select_runs`` runs each."""
    try:
        provider = needs_provider(target)
        try:
            measurer = OrtMeasurer(provider, runs=select_runs, threads=policy.measure_threads)
        except ValueError as exc:
            raise TargetUnavailable(f"target {target}: {exc}") from exc
        compat = check_compatibility(model_path, TARGETS[target][1])
        if not compat.ok:
            problems = tuple(p.message for p in compat.problems)
            raise IncompatibleModel(
                f"{len(problems)} problem(s) for target {target}: " + "; ".join(problems[:10]),
                problems,
            )
        result = compile_model(Path(model_path), policy, measurer)
    except CompileError as exc:
        return Outcome(error_kind=type(exc).__name__, error=str(exc) or exc.reason)
    Path(out_path).write_bytes(result.model_bytes)
    return Outcome(
        report=report_event(result.report),
        artifact_sha256=hashlib.sha256(result.model_bytes).hexdigest(),
        artifact_bytes=len(result.model_bytes),
    )
