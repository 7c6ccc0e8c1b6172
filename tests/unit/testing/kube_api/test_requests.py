"""How a request path and method become a RequestInfo (verb, group, resource, subresource,
namespace, name), as the apiserver's RequestInfoFactory decides."""

from __future__ import annotations

import pytest

from seedance.testing.kube_api.server import parse_request


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/t/pods", {}, ("list", "", "pods", "", "t", "")),
        ("GET", "/api/v1/namespaces/t/pods", {"watch": "true"}, ("watch", "", "pods", "", "t", "")),
        ("GET", "/api/v1/watch/namespaces/t/pods", {}, ("watch", "", "pods", "", "t", "")),
        ("GET", "/api/v1/pods", {}, ("list", "", "pods", "", "", "")),
        (
            "POST",
            "/api/v1/namespaces/t/pods/p/binding",
            {},
            ("create", "", "pods", "binding", "t", "p"),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/t/pods/p/status",
            {},
            ("patch", "", "pods", "status", "t", "p"),
        ),
        ("GET", "/api/v1/namespaces/t", {}, ("get", "", "namespaces", "", "t", "t")),
        (
            "PUT",
            "/api/v1/namespaces/t/status",
            {},
            ("update", "", "namespaces", "status", "t", "t"),
        ),
        (
            "DELETE",
            "/apis/coordination.k8s.io/v1/namespaces/t/leases",
            {},
            ("deletecollection", "coordination.k8s.io", "leases", "", "t", ""),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/t/leases/l",
            {},
            ("update", "coordination.k8s.io", "leases", "", "t", "l"),
        ),
        (
            "GET",
            "/apis/seedance.io/v1alpha1/slicingpolicies/default",
            {},
            ("get", "seedance.io", "slicingpolicies", "", "", "default"),
        ),
    ],
)
def test_resource_requests(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    info = parse_request(method, path, query)
    assert info.is_resource
    got = (info.verb, info.group, info.resource, info.subresource, info.namespace, info.name)
    assert got == expected


@pytest.mark.parametrize("path", ["/api", "/apis", "/apis/apps", "/version", "/openapi/v3"])
def test_non_resource_requests(path: str) -> None:
    assert not parse_request("GET", path, {}).is_resource
