"""The one mapping between the graph events (``seedance.events.graph``) and the compiler's core.

Owns the translation both ways: a request's ``PrecisionPolicy`` and ``target`` into the core's
``PrecisionPolicy`` (and the compatibility target checked first), and the core's
``CompileReport`` into the result's ``CompileReport`` event. Every field on either side is
either carried here or listed below with the reason it is not (``POLICY_NOT_ON_WIRE``,
``REPORT_NOT_CARRIED``; a unit test keeps the lists complete, so a field added on one side
fails until it is mapped or refused). Validation is the core's: ``PrecisionPolicy`` checks its
own values, and this module only names the request field a ``ValueError`` came from. Must not
touch the bus, the object store or a runtime.
"""

from __future__ import annotations

from collections.abc import Mapping

from seedance.events.graph import CandidateTiming
from seedance.events.graph import CompileReport as ReportEvent
from seedance.events.graph import FallbackNode as FallbackEvent
from seedance.events.graph import PrecisionPolicy as PolicyEvent
from seedance.graph_compiler.core.compat import ORT_CPU, TRANSFORMER_GPU, CompatTarget
from seedance.graph_compiler.core.policy import Precision, PrecisionPolicy, Target
from seedance.graph_compiler.core.report import CompileReport, FallbackNode
from seedance.graph_compiler.core.selection import TimingResult

__all__ = [
    "FALLBACK_FIELDS",
    "POLICY_FIELDS",
    "POLICY_NOT_ON_WIRE",
    "REPORT_FIELDS",
    "REPORT_NOT_CARRIED",
    "TARGETS",
    "TIMING_FIELDS",
    "core_policy",
    "report_event",
]

#: A request's ``target`` → (the precision target, the compatibility target checked first).
TARGETS: dict[str, tuple[Target, CompatTarget]] = {
    "cpu": (Target.CPU, ORT_CPU),
    "cuda": (Target.CUDA, ORT_CPU),
    "transformer-gpu": (Target.CUDA, TRANSFORMER_GPU),
}

#: The wire policy's fields → the core policy's they set (the core's ``target`` comes from the
#: request's ``target`` through ``TARGETS``).
POLICY_FIELDS: Mapping[str, str] = {
    "priority_order": "priority_order",
    "int8_failure_threshold": "int8_failure_threshold",
    "fp16_min_cosine": "min_cosine",
}

#: The core policy's fields a request does not set, and why each keeps the core's default (or
#: the service's setting).
POLICY_NOT_ON_WIRE: Mapping[str, str] = {
    "require_top1": "always on: a tenant may not ship a classifier whose answers changed",
    "max_abs_err": "unchecked: logits and hidden states have no common scale to bound",
    "calibration_samples": "the compiler's choice (enough for MinMax calibration)",
    "seed": "fixed, so the same request compiles to the same artifact",
    "max_fallback_attempts": "the compiler's bound on work per precision",
    "input_shapes": "not on the v1 request: models with symbolic inputs are pinned to 1",
    "allow_ort_contrib_ops": "artifacts are served by ONNX Runtime, which has the ops",
    "measure_runs": "a service setting (``measure_runs``), not a tenant's",
    "measure_threads": "the compiler's choice: candidates are timed as they are served",
}

#: The report event's fields → the core report's (dotted: a field of a field) they carry.
#: ``passes`` goes as the names that fired, ``profile`` as its JSON; a report without a
#: ``target`` (untimed) says so in ``machine`` and has no ``provider``.
REPORT_FIELDS: Mapping[str, str] = {
    "nodes_before": "before.nodes",
    "nodes_after": "after.nodes",
    "precision": "precision",
    "passes_fired": "passes",
    "latency_ms_before": "before.latency_median_ms",
    "latency_ms_after": "after.latency_median_ms",
    "peak_rss_mb_before": "before.peak_rss_mb",
    "peak_rss_mb_after": "after.peak_rss_mb",
    "cosine": "accuracy.min_cosine",
    "max_abs_err": "accuracy.max_abs_err",
    "fallback_nodes": "fallback_nodes",
    "machine": "target.machine",
    "provider": "target.provider",
    "profile": "profile",
    "timings": "timings",
}
#: ``FallbackNode`` event ← core ``FallbackNode``; ``CandidateTiming`` ← ``TimingResult``
#: (the profile as its label): every field carried.
FALLBACK_FIELDS: Mapping[str, str] = {
    "node": "node",
    "op_type": "op_type",
    "precision": "kept_in",
    "reason": "reason",
}
TIMING_FIELDS: Mapping[str, str] = {
    "candidate": "candidate",
    "profile": "profile",
    "median_ms": "median_ms",
    "chosen": "chosen",
    "reason": "reason",
}

#: The core report's fields the result's ``CompileReport`` event does not carry, and why.
REPORT_NOT_CARRIED: Mapping[str, str] = {
    "model_kind": "the INT8 method's input; the chosen precision and timings tell the user",
    "candidates": "the timed verdicts (``timings``) carry what the user acts on; a v2 event "
    "would add untimed refusals",
    "accuracy.nonfinite_count": "an accepted artifact has none beyond FP32's (its check)",
    "accuracy.top1_mismatches": "an accepted artifact has none (its check)",
    "before.size_bytes": "the user holds the input; the artifact's size is in the result",
    "after.size_bytes": "the result's artifact carries it",
    "target.isa": "part of ``machine``",
    "target.gpu": "part of ``machine``",
    "target.int8_accelerated": "decided the INT8 skip, said in that candidate's reason",
    "target.extra": "the measurer's diagnostics; not on the v1 event",
}


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


def _fallback_event(f: FallbackNode) -> FallbackEvent:
    return FallbackEvent(node=f.node, op_type=f.op_type, precision=str(f.kept_in), reason=f.reason)


def _timing_event(t: TimingResult) -> CandidateTiming:
    return CandidateTiming(
        candidate=t.candidate,
        profile=t.profile.label,
        median_ms=t.median_ms,
        chosen=t.chosen,
        reason=t.reason,
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
        fallback_nodes=[_fallback_event(f) for f in report.fallback_nodes],
        machine=report.machine,
        provider=report.target.provider if report.target else None,
        profile=report.profile.to_json(),
        timings=[_timing_event(t) for t in report.timings],
    )
