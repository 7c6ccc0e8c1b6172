"""The router's data plane: an Open Inference Protocol (KServe v2) gateway to Triton, gRPC
and REST (`RestGateway`, translated to the same gRPC requests).

Public surface: `OipGateway` with its `GatewaySettings` / `ModelRoute`, the `ReplicaSelector`
protocol (and `Candidate`, `LeastOutstandingSelector`) a routing policy implements,
`LayoutConversion` for per-model tensor layouts, `WarmupPolicy`, and `GatewayMetrics`.
"""

from seedance.router.gateway.metrics import GatewayMetrics
from seedance.router.gateway.outcomes import is_retryable, status_class
from seedance.router.gateway.ports import (
    Candidate,
    ExplainingSelector,
    FinishedRequest,
    GatewayObserver,
    LeastOutstandingSelector,
    ReplicaSelector,
    RoutedRequest,
)
from seedance.router.gateway.replicas import ReplicaPhase, WarmupReport
from seedance.router.gateway.rest import RestGateway, http_status
from seedance.router.gateway.rest_tensors import (
    RestRequestError,
    infer_request_from_json,
    infer_response_to_json,
)
from seedance.router.gateway.server import InferenceError, OipGateway
from seedance.router.gateway.settings import GatewaySettings, ModelRoute
from seedance.router.gateway.tensors import LayoutConversion, LayoutError
from seedance.router.gateway.warmup import WarmupPolicy, latency_settled

__all__ = [
    "Candidate",
    "ExplainingSelector",
    "FinishedRequest",
    "GatewayMetrics",
    "GatewayObserver",
    "GatewaySettings",
    "InferenceError",
    "LayoutConversion",
    "LayoutError",
    "LeastOutstandingSelector",
    "ModelRoute",
    "OipGateway",
    "ReplicaPhase",
    "ReplicaSelector",
    "RestGateway",
    "RestRequestError",
    "RoutedRequest",
    "WarmupPolicy",
    "WarmupReport",
    "http_status",
    "infer_request_from_json",
    "infer_response_to_json",
    "is_retryable",
    "latency_settled",
    "status_class",
]
