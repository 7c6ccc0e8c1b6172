"""core.endpoints: EndpointSlices (as the API serves them) → replica registrations."""

from __future__ import annotations

from typing import Any

from seedance.events.replicas import ReplicaRegistration
from seedance.k8s_bridge.core.endpoints import registrations


def endpoint(
    pod: str | None, address: str, *, ready: bool | None = True, terminating: bool | None = None
) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if ready is not None:
        conditions["ready"] = ready
    if terminating is not None:
        conditions["terminating"] = terminating
    out: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if pod is not None:
        out["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "inf"}
    return out


def es(
    endpoints: list[dict[str, Any]],
    *,
    model: str | None = "echo",
    fleet: str | None = None,
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": "triton"}
    if model is not None:
        labels["seedance.io/model"] = model
    if fleet is not None:
        labels["seedance.io/router-fleet"] = fleet
    return {
        "metadata": {"name": "triton-x1", "namespace": "inf", "labels": labels},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports if ports is not None else [
            {"name": "metrics", "port": 8002}, {"name": "grpc", "port": 8001},
        ],
    }  # fmt: skip


def regs(*slices: dict[str, Any]) -> list[tuple[str, ReplicaRegistration]]:
    out = registrations(slices, port_name="grpc", default_fleet="default")
    assert out.problems == ()
    return list(out.desired)


def test_each_endpoint_is_a_replica_at_the_grpc_port_with_its_readiness() -> None:
    got = regs(
        es(
            [
                endpoint("triton-0", "10.0.0.1"),
                endpoint("triton-1", "10.0.0.2", ready=False),
                endpoint("triton-2", "10.0.0.3", ready=True, terminating=True),
                endpoint("triton-3", "10.0.0.4", ready=None),  # unknown: ready, as the API says
            ]
        )
    )
    assert got == [
        ("default", ReplicaRegistration(model="echo", replica="triton-0", address="10.0.0.1:8001")),
        (
            "default",
            ReplicaRegistration(
                model="echo", replica="triton-1", address="10.0.0.2:8001", ready=False
            ),
        ),
        (
            "default",
            ReplicaRegistration(
                model="echo", replica="triton-2", address="10.0.0.3:8001", ready=False
            ),
        ),
        ("default", ReplicaRegistration(model="echo", replica="triton-3", address="10.0.0.4:8001")),
    ]


def test_the_fleet_label_ipv6_brackets_and_names_without_a_pod() -> None:
    got = regs(
        es(
            [endpoint(None, "fd00::1"), endpoint("a.b", "fd00::2")],
            fleet="blue",
            address_type="IPv6",
        )
    )
    assert [(f, r.replica, r.address) for f, r in got] == [
        ("blue", "fd00::1", "[fd00::1]:8001"),
        ("blue", "a:b", "[fd00::2]:8001"),  # a pod name's dots: ':' (tokens hold no dots)
    ]


def test_a_slice_that_cannot_be_registered_names_its_problem_and_spares_the_others() -> None:
    good = es([endpoint("ok", "10.0.0.1")])
    no_port = es([endpoint("p", "10.0.0.2")], ports=[{"name": "http", "port": 8000}])
    bad_model = es([endpoint("p", "10.0.0.3")], model="a.b")
    unlabelled = es([endpoint("p", "10.0.0.4")], model=None)
    long_pod = es([endpoint("x" * 129, "10.0.0.5"), endpoint("short", "10.0.0.6")])
    out = registrations(
        [good, no_port, bad_model, unlabelled, long_pod], port_name="grpc", default_fleet="default"
    )
    assert [r.replica for _, r in out.desired] == ["ok", "short"]
    reasons = [p.reason for p in out.problems]
    assert len(reasons) == 4
    assert "no port named 'grpc' (ports: ['http'])" in reasons[0]
    assert "seedance.io/model 'a.b'" in reasons[1]
    assert "seedance.io/model ''" in reasons[2]
    assert "endpoint replica" in reasons[3]
    assert {p.slice for p in out.problems} == {"inf/triton-x1"}


def test_an_endpoint_without_an_address_and_an_empty_slice_register_nothing() -> None:
    assert regs(es([{"addresses": [], "conditions": {}}]), es([])) == []
