"""Graph-compiler events: compile requests and their results with a report."""

from __future__ import annotations

import msgspec

from seedance.events.base import Event
from seedance.events.tokens import Name, TenantId

__all__ = [
    "CandidateTiming",
    "CompileReport",
    "CompileRequest",
    "CompileResult",
    "CompilerCapability",
    "FallbackNode",
    "GraphEvent",
    "PrecisionPolicy",
    "artifact_object_name",
    "chunk_bytes",
    "input_object_name",
]


class PrecisionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Precisions to try, best first; a candidate failing its accuracy check falls back."""

    priority_order: list[str] = msgspec.field(default_factory=lambda: ["int8", "fp16", "fp32"])
    #: Minimum cosine similarity of an INT8 candidate's outputs against FP32, over every output
    #: and calibration sample (the product brief's knob). 0.999 by default, the bar every other
    #: candidate meets: 0.95 let a classifier through whose top-1 answers changed (issue 16).
    int8_failure_threshold: float = 0.999
    fp16_min_cosine: float = 0.999


class CompileRequest(Event, frozen=True, kw_only=True, tag="graph.compile_request.v1"):
    """Compile the model stored under ``model_object`` (object store), at ``model_url``, or
    uploaded in ``model_chunks`` chunks on ``seedance.models.<tenant>.upload.<request_id>.<n>``
    (``n`` from 0; what a tenant's user can do: it gets no object store)."""

    request_id: Name
    tenant: TenantId
    model_name: Name
    model_object: str | None = None
    model_url: str | None = None
    model_sha256: str | None = None
    policy: PrecisionPolicy = msgspec.field(default_factory=PrecisionPolicy)
    target: str = "cpu"
    model_chunks: int = 0


class FallbackNode(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    op_type: str
    precision: str
    reason: str


class CandidateTiming(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate under one session profile, timed on the target, and its verdict."""

    candidate: str  # int8 | fp16 | fp32 | baseline (the unchanged FP32 model)
    profile: str  # e.g. cuda+iob+graph
    median_ms: float | None = None
    chosen: bool = False
    reason: str = ""


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
    #: What the figures were measured on: CPU model and ISA, or the GPU.
    machine: str | None = None
    #: The execution provider the candidates were timed on.
    provider: str | None = None
    #: The deployment profile (JSON, as in the artifact's ``seedance.deployment_profile``
    #: metadata) and every candidate's time with the reason it won or lost.
    profile: str | None = None
    timings: list[CandidateTiming] = msgspec.field(default_factory=list)


class CompilerCapability(msgspec.Struct, frozen=True, kw_only=True):
    """What one graph-compiler worker can compile for, announced in the
    ``seedance-graph-workers`` KV bucket under its worker id while it runs (the bucket's TTL
    drops a worker that stopped re-announcing). A ``cuda`` compile is answered only by a worker
    listing ``CUDAExecutionProvider``."""

    worker_id: str
    providers: list[str]
    machine: str = ""
    targets: list[str] = msgspec.field(default_factory=list)


class CompileResult(Event, frozen=True, kw_only=True, tag="graph.compile_result.v1"):
    """A compile's outcome: an artifact and its report, or a named error and no artifact."""

    request_id: Name
    tenant: TenantId
    model_name: Name
    ok: bool
    artifact_object: str | None = None
    #: The artifact's chunks on ``seedance.models.<tenant>.artifact.<request_id>.<n>`` (the
    #: answer to an uploaded model), 0 when it is elsewhere.
    artifact_chunks: int = 0
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


def chunk_bytes(max_payload: int) -> int:
    """How many bytes of a model or artifact one chunk carries on a server whose
    ``max_payload`` is given: at most 1 MiB, leaving room for the headers."""
    return max(1024, min(max_payload, 1024**2) - 4096)
