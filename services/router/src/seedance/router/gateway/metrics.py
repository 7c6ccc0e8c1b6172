"""The gateway's Prometheus metrics, on an injected registry.

Owns: metric names, label sets and the mapping of free-form request values (model name, region
header) onto small closed label sets, so a client cannot blow up the series count.

Must not: use the global default registry (tests and several gateways in one process each get
their own), or take a label value straight from a request.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from seedance.router.gateway.outcomes import StatusClass

__all__ = ["OTHER", "DecisionReason", "GatewayMetrics", "LabelSet"]

OTHER = "other"

# The gateway's own reasons; an `ExplainingSelector` adds its own closed set (the policy's
# `Reason` values), so the label stays bounded by the two sets together.
DecisionReason = Literal["selected", "only_candidate", "failover", "no_ready_replica"]

# Inference on CPU Triton is ~1–10 ms, on GPU LLMs seconds: buckets span 1 ms to 60 s.
_LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Time inside the gateway before the request leaves for a replica: sub-millisecond normally.
_QUEUE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0)


class LabelSet:
    """A closed set of label values; anything else maps to `other`."""

    def __init__(self, values: Iterable[str]) -> None:
        self._values = frozenset(v.strip().lower() for v in values if v.strip())

    def __call__(self, value: str | None) -> str:
        if value is None:
            return OTHER
        normalised = value.strip().lower()
        return normalised if normalised in self._values else OTHER


class GatewayMetrics:
    """`seedance_router_*` metrics of one gateway."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        models: Iterable[str],
        regions: Iterable[str],
    ) -> None:
        self.model_label = LabelSet(models)
        self.region_label = LabelSet(regions)
        self._requests = Counter(
            "seedance_router_requests",
            "Inference requests answered by the gateway, by final status class.",
            ["model", "replica", "status_class", "region"],
            registry=registry,
        )
        self._duration = Histogram(
            "seedance_router_request_duration_seconds",
            "Gateway end-to-end latency of ModelInfer, retries included.",
            ["model", "status_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self._queue = Histogram(
            "seedance_router_queue_duration_seconds",
            "Time from a request's arrival to its first send to a replica.",
            ["model"],
            buckets=_QUEUE_BUCKETS_S,
            registry=registry,
        )
        self._decisions = Counter(
            "seedance_router_decisions",
            "Replica choices, by reason.",
            ["reason"],
            registry=registry,
        )
        self._attempts = Counter(
            "seedance_router_upstream_attempts",
            "Requests sent to a replica (a retried request counts once per attempt).",
            ["replica", "status_class"],
            registry=registry,
        )
        self._outstanding = Gauge(
            "seedance_router_replica_outstanding_requests",
            "Requests sent to a replica and not yet answered.",
            ["replica"],
            registry=registry,
        )
        self._ready = Gauge(
            "seedance_router_replica_ready",
            "1 when a replica takes traffic (ready and warmed up), else 0.",
            ["replica"],
            registry=registry,
        )
        self._warmup_requests = Counter(
            "seedance_router_warmup_requests",
            "Warm-up requests sent to new or recovered replicas.",
            ["replica"],
            registry=registry,
        )

    def request_done(
        self,
        *,
        model: str,
        replica: str | None,
        status: StatusClass,
        region: str | None,
        duration_s: float,
    ) -> None:
        model_value = self.model_label(model)
        self._requests.labels(
            model=model_value,
            replica=replica or "none",
            status_class=status,
            region=self.region_label(region),
        ).inc()
        self._duration.labels(model=model_value, status_class=status).observe(duration_s)

    def queued(self, *, model: str, duration_s: float) -> None:
        self._queue.labels(model=self.model_label(model)).observe(duration_s)

    def decision(self, reason: DecisionReason | str) -> None:
        self._decisions.labels(reason=reason).inc()

    def attempt(self, *, replica: str, status: StatusClass) -> None:
        self._attempts.labels(replica=replica, status_class=status).inc()

    def outstanding(self, *, replica: str, count: int) -> None:
        self._outstanding.labels(replica=replica).set(count)

    def ready(self, *, replica: str, ready: bool) -> None:
        self._ready.labels(replica=replica).set(1 if ready else 0)

    def warmup_request(self, *, replica: str) -> None:
        self._warmup_requests.labels(replica=replica).inc()
