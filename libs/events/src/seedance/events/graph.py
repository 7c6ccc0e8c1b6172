"""Graph-compiler events: compile requests and their results with a report."""

from __future__ import annotations

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name, TenantId

__all__ = [
    "CompileReport",
    "CompileRequest",
    "CompileResult",
    "FallbackNode",
    "GraphEvent",
    "PrecisionPolicy",
    "artifact_object_name",
    "input_object_name",
]


class PrecisionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Precisions to try, best first; a candidate failing its accuracy check falls back."""

    priority_order: list[str] = msgspec.field(default_factory=lambda: ["int8", "fp16", "fp32"])
    #: Minimum cosine similarity of an INT8 candidate's outputs against FP32.
    int8_failure_threshold: float = 0.95
    fp16_min_cosine: float = 0.999


class CompileRequest(Event, frozen=True, kw_only=True, tag="graph.compile_request.v1"):
    """Compile the model stored under ``model_object`` (object store) or at ``model_url``."""

    request_id: Name
    tenant: TenantId
    model_name: Name
    model_object: str | None = None
    model_url: str | None = None
    model_sha256: str | None = None
    policy: PrecisionPolicy = msgspec.field(default_factory=PrecisionPolicy)
    target: str = "cpu"


class FallbackNode(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    op_type: str
    precision: str
    reason: str


class CompileReport(msgspec.Struct, frozen=True, kw_only=True):
    nodes_before: int
    nodes_after: int
    precision: str
    passes_fired: list[str] = msgspec.field(default_factory=list)
    latency_ms_before: float | None = None
    latency_ms_after: float | None = None
    peak_rss_mb_before: float | None = None
    peak_rss_mb_after: float | None = None
    cosine: float | None = None
    max_abs_err: float | None = None
    fallback_nodes: list[FallbackNode] = msgspec.field(default_factory=list)


class CompileResult(Event, frozen=True, kw_only=True, tag="graph.compile_result.v1"):
    """A compile's outcome: an artifact and its report, or a named error and no artifact."""

    request_id: Name
    tenant: TenantId
    model_name: Name
    ok: bool
    artifact_object: str | None = None
    artifact_url: str | None = None
    artifact_sha256: str | None = None
    report: CompileReport | None = None
    error_kind: str | None = None
    error: str | None = None


GraphEvent = CompileRequest | CompileResult


# Object names in the graph-compiler's object store (``seedance-graph-models``): the SDK uploads
# inputs under the first, the compiler stores artifacts under the second. The tenant prefix is
# what the compiler checks before it reads an input (the bucket is shared by all tenants).


def input_object_name(tenant: str, request_id: str, model_name: str) -> str:
    return f"inputs/{tenant}/{request_id}/{model_name}.onnx"


def artifact_object_name(tenant: str, request_id: str, model_name: str) -> str:
    return f"artifacts/{tenant}/{request_id}/{model_name}.onnx"
