"""core.endpoints: EndpointSlices (as the API serves them) → replica registrations, each owned
by its namespace's tenant or the operator's shared pool; what cannot register, and why."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from seedance.events import replicas
from seedance.events.replicas import ReplicaRegistration, registration_changes
from seedance.k8s_bridge.core.endpoints import (
    ProblemKind,
    refused_event,
    registrations,
    replica_owners,
)

NS = "inf"
#: The namespace's owner: the tenant acme (as a TenantQuota or label binds it).
OWNERS = {NS: "acme"}


def endpoint(
    pod: str | None,
    address: str,
    *,
    ready: bool | None = True,
    terminating: bool | None = None,
    ns: str | None = NS,
    kind: str | None = "Pod",
) -> dict[str, Any]:
    conditions: dict[str, Any] = {}
    if ready is not None:
        conditions["ready"] = ready
    if terminating is not None:
        conditions["terminating"] = terminating
    out: dict[str, Any] = {"addresses": [address], "conditions": conditions}
    if pod is not None:
        out["targetRef"] = {"kind": kind, "name": pod, "namespace": ns}
    return out


def es(
    endpoints: list[dict[str, Any]],
    *,
    model: str | None = "echo",
    fleet: str | None = None,
    ports: list[dict[str, Any]] | None = None,
    address_type: str = "IPv4",
    namespace: str = NS,
    name: str = "triton-x1",
) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": "triton"}
    if model is not None:
        labels["seedance.io/model"] = model
    if fleet is not None:
        labels["seedance.io/router-fleet"] = fleet
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "labels": labels},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports if ports is not None else [
            {"name": "metrics", "port": 8002}, {"name": "grpc", "port": 8001},
        ],
    }  # fmt: skip


def regs(*slices: dict[str, Any], owners: dict[str, str] = OWNERS) -> list[tuple[str, Any]]:
    out = registrations(slices, port_name="grpc", default_fleet="default", owners=owners)
    assert out.problems == ()
    return list(out.desired)


def acme(replica: str, address: str, *, ready: bool = True) -> ReplicaRegistration:
    return ReplicaRegistration(
        model="echo", replica=replica, address=address, ready=ready, owner="acme"
    )


def test_each_endpoint_is_a_replica_of_the_namespaces_tenant_at_the_grpc_port() -> None:
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
        ("default", acme("inf_triton-0", "10.0.0.1:8001")),
        ("default", acme("inf_triton-1", "10.0.0.2:8001", ready=False)),
        ("default", acme("inf_triton-2", "10.0.0.3:8001", ready=False)),
        ("default", acme("inf_triton-3", "10.0.0.4:8001")),
    ]
    # under acme's own keys
    changes = registration_changes({}, got, registrar="k8s-bridge/x/y")
    assert sorted(changes.put) == [f"default.acme.echo.inf_triton-{i}" for i in range(4)]


def test_the_fleet_label_ipv6_brackets_and_dotted_pod_names() -> None:
    got = regs(
        es(
            [endpoint("a.b.c", "fd00::2"), endpoint("d", "fd00::3", ns=None)],  # ns: the slice's
            fleet="blue",
            address_type="IPv6",
        )
    )
    # a pod name's dots become '_' (no namespace or pod name holds one): a valid KV key
    assert [(f, r.replica, r.address) for f, r in got] == [
        ("blue", "inf_a_b_c", "[fd00::2]:8001"),
        ("blue", "inf_d", "[fd00::3]:8001"),
    ]


def test_the_operators_shared_namespaces_register_into_the_shared_pool() -> None:
    owners = replica_owners(shared=["pool"], bindings={NS: "acme"}, labelled={"pool": "globex"})
    assert owners == {NS: "acme", "pool": ""}  # listed as shared: the label does not matter
    (got,) = regs(es([endpoint("t", "10.0.0.1", ns="pool")], namespace="pool"), owners=owners)
    assert got == ("default", ReplicaRegistration(model="echo", replica="pool_t",
                                                  address="10.0.0.1:8001"))  # fmt: skip
    changes = registration_changes({}, [got], registrar="r")
    assert list(changes.put) == ["default.echo.pool_t"]


def test_a_tenant_comes_from_the_binding_then_a_valid_label() -> None:
    owners = replica_owners(
        shared=[], bindings={"a": "acme"}, labelled={"a": "globex", "b": "globex", "c": "Bad"}
    )
    assert owners == {"a": "acme", "b": "globex"}  # "Bad" is no tenant id: c is bound to none


def test_a_namespace_bound_to_no_tenant_and_not_shared_registers_nothing() -> None:
    rogue = es([endpoint("r", "10.6.6.6", ns="rogue")], namespace="rogue", name="rogue")
    out = registrations([rogue], port_name="grpc", default_fleet="default", owners=OWNERS)
    assert out.desired == ()
    (p,) = out.problems
    assert (p.namespace, p.name, p.uid, p.kind) == ("rogue", "rogue", "uid-rogue",
                                                   ProblemKind.NAMESPACE_UNBOUND)  # fmt: skip
    assert "namespace 'rogue' is bound to no tenant" in p.reason
    assert p.slice == "rogue/rogue"


@pytest.mark.parametrize(
    ("bad", "kind", "words"),
    [
        (endpoint(None, "10.0.0.9"), ProblemKind.NO_TARGET, "has no targetRef"),
        (endpoint("t", "10.0.0.9", ns="kube-system"), ProblemKind.TARGET_ELSEWHERE,
         "pod kube-system/t"),
        (endpoint("t", "10.0.0.9", kind="Service"), ProblemKind.NOT_A_POD, "Service/t"),
        (endpoint("T_x", "10.0.0.9"), ProblemKind.INVALID_NAME, "'T_x' is not a pod name"),
        (endpoint("x" * 128, "10.0.0.9"), ProblemKind.INVALID_NAME, "endpoint replica"),
    ],
)  # fmt: skip
def test_an_endpoint_that_is_not_a_pod_of_the_slices_namespace_is_refused_alone(
    bad: dict[str, Any], kind: ProblemKind, words: str
) -> None:
    out = registrations(
        [es([bad, endpoint("ok", "10.0.0.1")])],
        port_name="grpc", default_fleet="default", owners=OWNERS,
    )  # fmt: skip
    assert [r.replica for _, r in out.desired] == ["inf_ok"]
    (p,) = out.problems
    assert p.kind is kind
    assert words in p.reason
    assert "10.0.0.9" in p.reason


def test_a_slice_that_cannot_be_registered_names_its_problem_and_spares_the_others() -> None:
    good = es([endpoint("ok", "10.0.0.1")])
    no_port = es([endpoint("p", "10.0.0.2")], ports=[{"name": "http", "port": 8000}])
    bad_model = es([endpoint("p", "10.0.0.3")], model="a.b")
    unlabelled = es([endpoint("p", "10.0.0.4")], model=None)
    odd_type = es([endpoint("p", "10.0.0.5")], address_type="Unix")
    out = registrations(
        [good, no_port, bad_model, unlabelled, odd_type],
        port_name="grpc", default_fleet="default", owners=OWNERS,
    )  # fmt: skip
    assert [r.replica for _, r in out.desired] == ["inf_ok"]
    assert [(p.kind, p.reason) for p in out.problems] == [
        (ProblemKind.NO_PORT, "no port named 'grpc' (ports: ['http'])"),
        (ProblemKind.INVALID_LABEL, "label seedance.io/model 'a.b' is not a valid subject token "
         "(letters, digits, '_', '-' and ':' only, 1-128 characters)"),
        (ProblemKind.INVALID_LABEL, "label seedance.io/model '' is not a valid subject token "
         "(letters, digits, '_', '-' and ':' only, 1-128 characters)"),
        (ProblemKind.ADDRESS_TYPE, "addressType 'Unix' is not IPv4, IPv6 or FQDN"),
    ]  # fmt: skip


def test_every_registration_is_a_valid_kv_key_that_decodes_under_it() -> None:
    got = regs(es([endpoint("a.b-1.c", "10.0.0.1"), endpoint("z", "10.0.0.2")]))
    for key, reg in registration_changes({}, got, registrar="r").put.items():
        assert all(c.isalnum() or c in "-_=./" for c in key), key  # nats KV's key alphabet
        assert replicas.decode("default", key, replicas.encode(reg)) == reg


def test_the_refusal_event_is_a_warning_on_the_slice_named_from_the_problem() -> None:
    rogue = es([endpoint("r", "10.6.6.6", ns="rogue")], namespace="rogue", name="rogue")
    (p,) = registrations([rogue], port_name="grpc", default_fleet="d", owners={}).problems
    at = datetime(2026, 12, 1, tzinfo=UTC)
    body = refused_event(p, at, "bridge-0")
    assert body["involvedObject"] == {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "namespace": "rogue",
        "name": "rogue", "uid": "uid-rogue",
    }  # fmt: skip
    assert (body["type"], body["reason"]) == ("Warning", "ReplicaRefused")
    assert p.reason in body["message"]
    assert body["metadata"]["namespace"] == "rogue"
    # the same problem later: the same name (AlreadyExists, not a second Event)
    assert refused_event(p, at.replace(hour=5), "bridge-1")["metadata"] == body["metadata"]


def test_an_endpoint_without_an_address_and_an_empty_slice_register_nothing() -> None:
    assert regs(es([{"addresses": [], "conditions": {}}]), es([])) == []
