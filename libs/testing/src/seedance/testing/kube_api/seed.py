"""Setup helpers for tests: namespaces, nodes and pods put straight into a running
``KubeApiServer``'s store through the same rules (validation, server-owned metadata) that its
HTTP verbs apply. They are for arranging a test; the code under test must talk HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seedance.testing.kube_api.server import KubeApiServer

__all__ = ["create", "endpoint_slice", "namespace", "node", "pod", "set_status"]


def create(
    api: KubeApiServer,
    group: str,
    version: str,
    plural: str,
    obj: dict[str, Any],
    namespace: str = "",
) -> dict[str, Any]:
    """Create any object (as a dict) as a POST would."""
    rt = api.api.resolve(group, version, plural)
    ns = (namespace or (obj.get("metadata") or {}).get("namespace", "")) if rt.namespaced else ""
    return api.api.create(rt, ns, obj)


def namespace(
    api: KubeApiServer, name: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return create(
        api, "", "v1", "namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}}
    )


def node(
    api: KubeApiServer,
    name: str,
    *,
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Node with ``nvidia.com/gpu`` capacity and a Ready condition (its status is kept on
    create, as for a kubelet registering)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}
            ],
        },
    }
    if extra:
        obj.update(extra)
    return create(api, "", "v1", "nodes", obj)


def pod(
    api: KubeApiServer,
    namespace: str,
    name: str,
    *,
    scheduler_name: str = "default-scheduler",
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    image: str = "registry.example/job:1",
    extra_spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pending Pod with one container asking for ``gpus`` ``nvidia.com/gpu``."""
    container: dict[str, Any] = {"name": "main", "image": image}
    if gpus:
        container["resources"] = {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"nvidia.com/gpu": str(gpus)},
        }
    obj = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {"schedulerName": scheduler_name, "containers": [container], **(extra_spec or {})},
    }
    return create(api, "", "v1", "pods", obj, namespace)


def endpoint_slice(
    api: KubeApiServer,
    namespace: str,
    name: str,
    *,
    service: str,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]],
    labels: dict[str, str] | None = None,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes one for ``service``: its labels
    are the Service's (``labels``) plus ``kubernetes.io/service-name`` and the controller's
    ``endpointslice.kubernetes.io/managed-by`` (this server runs no such controller)."""
    obj = {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                **(labels or {}),
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    }
    return create(api, "discovery.k8s.io", "v1", "endpointslices", obj, namespace)


def set_status(
    api: KubeApiServer,
    group: str,
    version: str,
    plural: str,
    namespace: str,
    name: str,
    status: dict[str, Any],
) -> dict[str, Any]:
    """Replace an object's status as its ``/status`` subresource would (a kubelet's report)."""
    rt = api.api.resolve(group, version, plural)
    current = api.api.get(rt, namespace, name)
    return api.api.update(rt, namespace, name, {**current, "status": status}, "status")
