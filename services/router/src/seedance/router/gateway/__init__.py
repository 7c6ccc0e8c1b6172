"""The router's data plane: an Open Inference Protocol (KServe v2) gRPC gateway to Triton.

Public surface: `OipGateway` with its `GatewaySettings` / `ModelRoute`, the `ReplicaSelector`
protocol (and `ReplicaState`, `LeastOutstandingSelector`) a routing policy implements,
`LayoutConversion` for per-model tensor layouts, `WarmupPolicy`, and `GatewayMetrics`.
"""

from seedance.router.gateway.metrics import GatewayMetrics
from seedance.router.gateway.outcomes import is_retryable, status_class
from seedance.router.gateway.replicas import ReplicaPhase, WarmupReport
from seedance.router.gateway.selection import (
    ExplainingSelector,
    FinishedRequest,
    GatewayObserver,
    LeastOutstandingSelector,
    ReplicaSelector,
    ReplicaState,
    RoutedRequest,
)
from seedance.router.gateway.server import GatewaySettings, ModelRoute, OipGateway
from seedance.router.gateway.tensors import LayoutConversion, LayoutError
from seedance.router.gateway.warmup import WarmupPolicy, latency_settled

__all__ = [
    "ExplainingSelector",
    "FinishedRequest",
    "GatewayMetrics",
    "GatewayObserver",
    "GatewaySettings",
    "LayoutConversion",
    "LayoutError",
    "LeastOutstandingSelector",
    "ModelRoute",
    "OipGateway",
    "ReplicaPhase",
    "ReplicaSelector",
    "ReplicaState",
    "RoutedRequest",
    "WarmupPolicy",
    "WarmupReport",
    "is_retryable",
    "latency_settled",
    "status_class",
]
