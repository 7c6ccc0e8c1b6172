"""This node's pods that carry a placement annotation, and the Node itself, read from the API
server (kubernetes_asyncio).

Owns the node agent's calls to the API server. This node's Node (``ThisNode``): its
``status.allocatable`` (does another device plugin serve a resource already?), its labels
(does NVIDIA's mig-manager own MIG here?) and, where mig-manager does, the ``nvidia.com/mig.config``
label set on it. And the two pod queries, as ``PodView``s (uid, node, the annotation, labels,
the pod's extended-resource requests counted as the kubelet and the bridge count them, and its
containers' own, in the kubelet's allocation order): the pods Allocate may be meant for, as HAMi's
device plugin finds them (bound to this node and still Pending), and, at start, the pods that
already hold devices the kubelet granted (``holds_devices``: Running, or Pending with a
container that has started; or one the kubelet's pod-resources ``List`` names, found here by
namespace and name). And a Warning Event on a pod (``NodePods.warn``): why its container start is
refused. It must not decide which pod is meant, nor trust the annotation: that is
``core.placement``.
"""

from __future__ import annotations

import decimal
import hashlib
from collections.abc import Collection
from datetime import datetime
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.core.logs import get_logger
from seedance.events.pod_requests import ContainerRequest, containers_of, pod_resources
from seedance.events.quantity import to_count
from seedance.node_agent.core.placement import ANNOTATION_PLACEMENT, PodView

__all__ = [
    "USER_AGENT",
    "NodePods",
    "ThisNode",
    "allocatable_counts",
    "connect",
    "holds_devices",
    "node_cpu_memory",
    "pod_view",
    "quantity_int",
    "quantity_value",
]

USER_AGENT = "seedance-node-agent"


async def connect(kubeconfig: str | None) -> ApiClient:
    """An API client from a kubeconfig file, or (``None``) the pod's service account."""
    if kubeconfig:
        api_client = await config.new_client_from_config(config_file=kubeconfig)
    else:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        api_client = ApiClient(configuration)
    api_client.user_agent = USER_AGENT
    return api_client


log = get_logger(__name__)

_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_SUFFIXES: dict[str, decimal.Decimal] = {
    **{s: decimal.Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(_BINARY)},
    **{s: decimal.Decimal(10) ** e for s, e in _DECIMAL.items()},
}


def quantity_value(q: object) -> decimal.Decimal:
    """A Kubernetes quantity (``2``, ``500m``, ``1Ki``, ``1e3``, ``32Gi``) as an exact number.

    Raises:
        ValueError: not a quantity; the message names it.
    """
    text = str(q).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], _SUFFIXES[suffix]
            break
    else:
        number, factor = text, decimal.Decimal(1)
    try:
        return decimal.Decimal(number) * factor
    except decimal.InvalidOperation:
        raise ValueError(f"quantity {text!r} is not a number") from None


def quantity_int(q: object) -> int:
    """An extended resource's quantity as a whole number (the API server refuses fractions but
    accepts any integral quantity: ``2``, ``1k``, ``1e3``, ``1Ki``).

    Raises:
        ValueError: not a whole-number quantity; the message names it.
    """
    value = quantity_value(q)
    if value != value.to_integral_value() or value < 0:
        raise ValueError(f"quantity {str(q).strip()!r} is not a whole number of devices")
    return int(value)


def node_cpu_memory(node: dict[str, Any]) -> tuple[int, int]:
    """A Node's allocatable CPU (millicores, rounded down: never more than it has) and memory
    (MiB, rounded down), what the slicer may place there; (0, 0) for what does not parse."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu = int(quantity_value(alloc.get("cpu", 0)) * 1000)
        memory = int(quantity_value(alloc.get("memory", 0)) / 2**20)
    except ValueError as exc:
        log.warning("node_agent_bad_quantity", resource="cpu/memory", error=str(exc))
        return 0, 0
    return max(cpu, 0), max(memory, 0)


def _requests(pod: dict[str, Any]) -> tuple[dict[str, int], tuple[ContainerRequest, ...]]:
    """The pod's extended-resource requests (names with a ``/``) as the kubelet counts them
    (``seedance.events.pod_requests``, the bridge's rule), and its containers in the kubelet's
    allocation order. A pod whose quantities do not parse, or whose total of a resource is not
    a whole number of devices, asks for nothing of it (logged): one pod's odd quantity must not
    stop Allocate for the node's other pods; its own Allocate is refused."""
    spec = pod.get("spec") or {}
    try:
        containers = tuple(containers_of(spec))
        total = pod_resources(spec)
    except ValueError as exc:
        log.warning("node_agent_bad_quantity", resource="pod", error=str(exc))
        return {}, ()
    out: dict[str, int] = {}
    for name, q in total.items():
        if "/" in name:
            try:
                out[name] = to_count(q, name)
            except ValueError as exc:
                log.warning("node_agent_bad_quantity", resource=name, error=str(exc))
    return out, containers


def pod_view(pod: dict[str, Any]) -> PodView:
    meta = pod.get("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    requests, containers = _requests(pod)
    return PodView(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        node_name=str(pod.get("spec", {}).get("nodeName", "")),
        annotations=annotations,
        labels=dict(meta.get("labels") or {}),
        requests=requests,
        containers=containers,
        bound_at=_bound_at(pod),
        created_at=str(meta.get("creationTimestamp") or ""),
        started=holds_devices(pod),
    )


def _bound_at(pod: dict[str, Any]) -> str:
    """When the API server bound the pod: the ``PodScheduled=True`` condition's
    ``lastTransitionTime``, which the binding subresource writes (tenants do not write
    ``pods/status``). Never the annotation's ``boundAt``: a tenant could edit that to take an
    Allocate meant for another pod. Empty when the pod has none."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return str(c.get("lastTransitionTime") or "")
    return ""


def _started(statuses: Any) -> bool:
    return any(
        "running" in (st.get("state") or {}) or "terminated" in (st.get("state") or {})
        for st in statuses or []
    )


def holds_devices(pod: dict[str, Any]) -> bool:
    """Whether the API server shows the kubelet past the pod's Allocate: phase Running, or
    Pending with an init or app container that has run (the kubelet allocates every
    container's devices when it admits the pod, before the first one starts). A Pending pod
    whose containers are all still waiting may or may not be past Allocate: not knowable
    here, so not counted."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Running":
        return True
    return phase == "Pending" and (
        _started(status.get("initContainerStatuses")) or _started(status.get("containerStatuses"))
    )


def _annotated(pod: dict[str, Any]) -> bool:
    return ANNOTATION_PLACEMENT in ((pod.get("metadata") or {}).get("annotations") or {})


def _named(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class NodePods:
    """Lists this node's annotated pods through an ``ApiClient`` (the caller owns it).

    Each list is bounded by ``timeout_s`` (kubernetes_asyncio's default has none): an API server
    that accepts but never answers fails the agent's start, and the DaemonSet restarts it,
    instead of leaving it alive with no plugin registered; an Allocate then fails with the
    reason instead of hanging until the kubelet's own deadline.
    """

    def __init__(self, api_client: Any, node: str, *, timeout_s: float = 10.0) -> None:
        self._core = client.CoreV1Api(api_client)
        self._node = node
        self._timeout_s = timeout_s

    async def warn(self, namespace: str, pod: str, reason: str, message: str, at: datetime) -> None:
        """A Warning Event on pod ``namespace/pod`` at ``at``; its name is derived from the pod
        and the message, so the same fact posted again is refused as AlreadyExists rather than
        shown twice."""
        now = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        key = message
        digest = hashlib.blake2b(f"{namespace}/{pod}/{key}".encode(), digest_size=8).hexdigest()
        body: Any = {  # kubernetes_asyncio sends a plain dict as the JSON body
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod[:200]}.{digest}", "namespace": namespace},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": USER_AGENT, "host": self._node},
            "reportingComponent": USER_AGENT,
            "reportingInstance": self._node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._core.create_namespaced_event(
                namespace, body, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: posted before
                raise

    async def pending(self) -> list[PodView]:
        """The pods Allocate may be meant for: bound here, Pending."""
        items = await self._list("status.phase=Pending")
        return [pod_view(p) for p in items if _annotated(p)]

    async def holding(self, allocated: Collection[tuple[str, str]] = ()) -> list[PodView]:
        """The pods that hold devices already: ``holds_devices``, or named (namespace, name) in
        ``allocated`` (the pods the kubelet reports holding devices, which include those whose
        containers have not started); terminated ones do not."""
        items = await self._list("status.phase!=Succeeded,status.phase!=Failed")
        return [
            pod_view(p)
            for p in items
            if _annotated(p) and (holds_devices(p) or _named(p) in allocated)
        ]

    async def _list(self, phases: str) -> list[dict[str, Any]]:
        resp: Any = await self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node},{phases}",
            _preload_content=False,
            _request_timeout=self._timeout_s,
        )
        try:
            body = await resp.json()
        finally:
            resp.release()
        return list(body.get("items") or [])


def allocatable_counts(node: dict[str, Any]) -> dict[str, int]:
    """A Node's ``status.allocatable`` extended resources (names with a ``/``) as counts; an
    unreadable quantity counts 0 (logged: it cannot be what a device plugin reported)."""
    out: dict[str, int] = {}
    for name, q in ((node.get("status") or {}).get("allocatable") or {}).items():
        if "/" not in name:
            continue
        try:
            out[name] = quantity_int(q)
        except ValueError as exc:
            log.warning("node_agent_bad_quantity", resource=name, error=str(exc))
    return out


class ThisNode:
    """This node's Node object through an ``ApiClient`` (the caller owns it); each call bounded
    by ``timeout_s`` like ``NodePods``'. Reads need ``get nodes``; ``set_labels`` needs ``patch
    nodes`` (the mig-manager component's ClusterRole, docs/node-agent.md)."""

    def __init__(self, api_client: Any, node: str, *, timeout_s: float = 10.0) -> None:
        self._core = client.CoreV1Api(api_client)
        self.name = node
        self._timeout_s = timeout_s

    async def get(self) -> dict[str, Any]:
        """The Node as the API server has it; ``{}`` where it does not exist (yet)."""
        # Raw: kubernetes_asyncio's models would drop what this reads as typed objects, and
        # with _preload_content=False an error status raises nothing (read it here).
        resp: Any = await self._core.read_node(
            self.name, _preload_content=False, _request_timeout=self._timeout_s
        )
        try:
            if resp.status == 404:
                return {}
            if resp.status >= 400:
                raise client.ApiException(status=resp.status, reason=await resp.text())
            body: dict[str, Any] = await resp.json()
        finally:
            resp.release()
        return body

    async def set_labels(self, labels: dict[str, str | None]) -> None:
        """Merge ``labels`` into the Node's (None removes one)."""
        # A JSON merge patch (the client's default for a dict body is a JSON patch).
        opts: dict[str, Any] = {
            "_content_type": "application/merge-patch+json",
            "_request_timeout": self._timeout_s,
        }
        await self._core.patch_node(self.name, {"metadata": {"labels": labels}}, **opts)
