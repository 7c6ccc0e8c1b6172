"""Replica selection, retry classification, warm-up stopping rule, metric labels (pure)."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import CollectorRegistry

from seedance.router.gateway import (
    Candidate,
    GatewayMetrics,
    LeastOutstandingSelector,
    ReplicaSelector,
    WarmupPolicy,
    is_retryable,
    latency_settled,
    status_class,
)


def _state(name: str, outstanding: int, for_model: int = 0) -> Candidate:
    return Candidate(
        name=name,
        address=f"{name}:1",
        outstanding=outstanding,
        outstanding_for_model=for_model,
    )


def test_least_outstanding_picks_fewest_then_model_then_name() -> None:
    selector = LeastOutstandingSelector()
    assert isinstance(selector, ReplicaSelector)
    assert selector.choose("m", [_state("a", 3), _state("b", 1), _state("c", 2)]).name == "b"
    assert selector.choose("m", [_state("a", 2, 2), _state("b", 2, 1)]).name == "b"
    assert selector.choose("m", [_state("b", 0), _state("a", 0)]).name == "a"
    with pytest.raises(ValueError, match="no replica"):
        selector.choose("m", [])


def test_only_unavailable_is_retried() -> None:
    retryable = {code for code in grpc.StatusCode if is_retryable(code)}
    assert retryable == {grpc.StatusCode.UNAVAILABLE}


@pytest.mark.parametrize(
    ("code", "label"),
    [
        (grpc.StatusCode.OK, "ok"),
        (grpc.StatusCode.INVALID_ARGUMENT, "client_error"),
        (grpc.StatusCode.NOT_FOUND, "client_error"),
        (grpc.StatusCode.UNAVAILABLE, "unavailable"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"),
        (grpc.StatusCode.CANCELLED, "cancelled"),
        (grpc.StatusCode.INTERNAL, "server_error"),
        (grpc.StatusCode.UNKNOWN, "server_error"),
    ],
)
def test_status_classes(code: grpc.StatusCode, label: str) -> None:
    assert status_class(code) == label


POLICY = WarmupPolicy(window=3, tolerance=0.2, min_requests=6, max_requests=20)


def test_not_settled_before_min_requests() -> None:
    assert not latency_settled([0.01] * 5, POLICY)


def test_settled_once_latency_stops_falling() -> None:
    falling = [0.5, 0.3, 0.2, 0.1, 0.05, 0.03]
    assert not latency_settled(falling, POLICY)
    flat = [*falling, 0.011, 0.010, 0.012, 0.010, 0.011, 0.010]
    assert latency_settled(flat, POLICY)


def test_settled_when_budget_spent_even_if_noisy() -> None:
    noisy = [0.01, 0.1] * 10
    assert latency_settled(noisy, POLICY)
    assert not latency_settled(noisy[:19], POLICY)


def test_warmup_policy_validated() -> None:
    with pytest.raises(ValueError, match="max_requests"):
        WarmupPolicy(window=10, max_requests=15)
    with pytest.raises(ValueError, match="min_requests"):
        WarmupPolicy(min_requests=300, max_requests=200)


def test_metric_labels_come_from_closed_sets() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, models=["echo"], regions=["eu-west"])
    for model, region in (("echo", "EU-West"), ("unknown-model", "mars"), ("echo", None)):
        metrics.request_done(model=model, replica="a", status="ok", region=region, duration_s=0.002)
    metrics.decision("failover")

    def requests(model: str, region: str) -> float | None:
        return registry.get_sample_value(
            "seedance_router_requests_total",
            {"model": model, "replica": "a", "status_class": "ok", "region": region},
        )

    assert requests("echo", "eu-west") == 1
    assert requests("other", "other") == 1
    assert requests("echo", "other") == 1
    assert requests("unknown-model", "mars") is None
    assert registry.get_sample_value("seedance_router_decisions_total", {"reason": "failover"}) == 1
    assert (
        registry.get_sample_value(
            "seedance_router_request_duration_seconds_count",
            {"model": "echo", "status_class": "ok"},
        )
        == 2
    )
