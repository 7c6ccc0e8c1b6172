"""The wire-to-core mapping: every field on either side carried or refused with a reason, and
the values carried as they are."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from seedance.events.graph import CandidateTiming
from seedance.events.graph import CompileReport as ReportEvent
from seedance.events.graph import FallbackNode as FallbackEvent
from seedance.events.graph import PrecisionPolicy as PolicyEvent
from seedance.graph_compiler import mapping
from seedance.graph_compiler.core.accuracy import Accuracy
from seedance.graph_compiler.core.policy import Precision, PrecisionPolicy, Target
from seedance.graph_compiler.core.profile import SessionProfile, TargetInfo
from seedance.graph_compiler.core.report import (
    CompileReport,
    FallbackNode,
    VariantMetrics,
)
from seedance.graph_compiler.core.selection import TimingResult


def _wire_fields(struct: type[msgspec.Struct]) -> set[str]:
    return {f.name for f in msgspec.structs.fields(struct)}


_NESTED = {
    "accuracy": Accuracy,
    "before": VariantMetrics,
    "after": VariantMetrics,
    "target": TargetInfo,
}


def test_every_policy_field_is_carried_or_refused():
    assert set(mapping.POLICY_FIELDS) == _wire_fields(PolicyEvent)
    core = {f.name for f in dataclasses.fields(PrecisionPolicy)}
    carried = set(mapping.POLICY_FIELDS.values()) | {"target"}
    assert not carried & set(mapping.POLICY_NOT_ON_WIRE)
    assert carried | set(mapping.POLICY_NOT_ON_WIRE) == core


def test_every_report_field_is_carried_or_refused():
    assert set(mapping.REPORT_FIELDS) == _wire_fields(ReportEvent)
    core: set[str] = set()
    for f in dataclasses.fields(CompileReport):
        if f.name in _NESTED:
            core |= {f"{f.name}.{g.name}" for g in dataclasses.fields(_NESTED[f.name])}
        else:
            core.add(f.name)
    carried = set(mapping.REPORT_FIELDS.values())
    refused = set(mapping.REPORT_NOT_CARRIED)
    assert not carried & refused
    assert carried | refused == core
    assert all(mapping.REPORT_NOT_CARRIED.values())  # each with its reason
    assert set(mapping.FALLBACK_FIELDS) == _wire_fields(FallbackEvent)
    assert set(mapping.FALLBACK_FIELDS.values()) == {
        f.name for f in dataclasses.fields(FallbackNode)
    }
    assert set(mapping.TIMING_FIELDS) == _wire_fields(CandidateTiming)
    assert set(mapping.TIMING_FIELDS.values()) == {f.name for f in dataclasses.fields(TimingResult)}


def test_core_policy_carries_the_request():
    wire = PolicyEvent(
        priority_order=["fp16", "fp32"], int8_failure_threshold=0.99, fp16_min_cosine=0.98
    )
    core = mapping.core_policy(wire, "transformer-gpu", measure_runs=3)
    assert core.priority_order == (Precision.FP16, Precision.FP32)
    assert core.int8_failure_threshold == 0.99
    assert core.min_cosine == 0.98
    assert core.target is Target.CUDA
    assert core.measure_runs == 3


@pytest.mark.parametrize(
    ("wire", "target", "match"),
    [
        (PolicyEvent(), "tpu", "unknown target 'tpu'"),
        (PolicyEvent(priority_order=["int4"]), "cpu", "priority_order: 'int4'"),
        (PolicyEvent(fp16_min_cosine=1.5), "cpu", "min_cosine must be in"),
    ],
)
def test_core_policy_names_what_is_wrong(wire, target, match):
    with pytest.raises(ValueError, match=match):
        mapping.core_policy(wire, target, measure_runs=0)


def test_report_event_carries_every_mapped_field():
    profile = SessionProfile(provider="CPUExecutionProvider")
    report = CompileReport(
        precision=Precision.INT8,
        model_kind="conv",
        passes=(),
        accuracy=Accuracy(max_abs_err=0.25, min_cosine=0.9995, nonfinite_count=0),
        fallback_nodes=(
            FallbackNode(node="conv_0", op_type="Conv", kept_in=Precision.FP32, reason="stem"),
        ),
        candidates=(),
        before=VariantMetrics(nodes=10, size_bytes=100, latency_median_ms=2.0, peak_rss_mb=50.0),
        after=VariantMetrics(nodes=12, size_bytes=40, latency_median_ms=1.0, peak_rss_mb=30.0),
        profile=profile,
        target=TargetInfo(provider="CPUExecutionProvider", machine="CPU test"),
        timings=(
            TimingResult(
                candidate="int8", profile=profile, median_ms=1.0, chosen=True, reason="won"
            ),
        ),
    )
    event = mapping.report_event(report)
    assert event == ReportEvent(
        nodes_before=10,
        nodes_after=12,
        precision="int8",
        passes_fired=[],
        latency_ms_before=2.0,
        latency_ms_after=1.0,
        peak_rss_mb_before=50.0,
        peak_rss_mb_after=30.0,
        cosine=0.9995,
        max_abs_err=0.25,
        fallback_nodes=[
            FallbackEvent(node="conv_0", op_type="Conv", precision="fp32", reason="stem")
        ],
        machine="CPU test",
        provider="CPUExecutionProvider",
        profile=profile.to_json(),
        timings=[
            CandidateTiming(
                candidate="int8", profile=profile.label, median_ms=1.0, chosen=True, reason="won"
            )
        ],
    )
