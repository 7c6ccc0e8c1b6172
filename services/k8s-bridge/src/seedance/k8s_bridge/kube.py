"""The bridge's calls to the Kubernetes API server, through kubernetes_asyncio, as plain JSON.

kubernetes_asyncio is the official client generated from the API server's OpenAPI, on asyncio
(the loop every Seedance service runs on): it brings kubeconfig and in-cluster credentials,
TLS, and a typed call per endpoint (list/watch with resourceVersion and bookmarks, the Binding
subresource, status patches, Leases). Its calls run here with ``_preload_content=False``, so
objects stay the API's JSON (what the pure core reads) instead of being turned into generated
model classes and back: on the bind path that is most of the client's cost.

Owns the mapping of HTTP outcomes to the bridge's: `ApiStatus` (the server answered with an
error status: ``code``, ``reason`` from the Status body) and `ApiUnavailable` (no answer:
connection refused or reset, timeout; retried with backoff by the callers). Each call names
the RBAC rule it needs (`CALLS`, checked against `seedance.k8s_bridge.rbac` at import).

Lists come in pages (``limit`` = ``page_size``, then ``continue``), as client-go's pager reads
them, so a 17,000-node list is never one response the API server must build and hold whole.
Every page belongs to the first page's snapshot (its resourceVersion, where the watch starts);
a ``continue`` token that outlived that snapshot (etcd compacted it: ``410 Expired``) restarts
the list from its first page, at most `LIST_ATTEMPTS` times.

Requests go at a bounded rate, like a client-go client's ``QPS``/``Burst`` (a token bucket,
`seedance.core.ratelimit`): one bucket for the pod, node and list/watch calls, one of the same
size for Events, none for the Lease, as kube-scheduler builds a client, an event client and a
leader-election client apiece, so a burst of Bindings never delays a renewal.
Must not decide anything.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgspec
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient

from seedance.core import Clock
from seedance.core.clock import WALL_CLOCK
from seedance.core.logs import get_logger
from seedance.core.ratelimit import TokenBucket
from seedance.k8s_bridge import rbac

__all__ = [
    "CALLS",
    "CUSTOM_GROUP",
    "CUSTOM_VERSION",
    "LIST_ATTEMPTS",
    "USER_AGENT",
    "ApiStatus",
    "ApiUnavailable",
    "KubeApi",
    "connect",
]

Json = dict[str, Any]

#: KubeApi method -> the (resource, verb) it needs.
CALLS: dict[str, tuple[str, str]] = {
    "list_pods": ("pods", "list"),
    "watch_pods": ("pods", "watch"),
    "get_pod": ("pods", "get"),
    "delete_pod": ("pods", "delete"),
    "evict_pod": ("pods/eviction", "create"),
    "bind": ("pods/binding", "create"),
    "patch_pod_status": ("pods/status", "patch"),
    "list_nodes": ("nodes", "list"),
    "watch_nodes": ("nodes", "watch"),
    "patch_node": ("nodes", "patch"),
    "list_namespaces": ("namespaces", "list"),
    "watch_namespaces": ("namespaces", "watch"),
    "create_event": ("events", "create"),
    "get_lease": ("leases", "get"),
    "create_lease": ("leases", "create"),
    "replace_lease": ("leases", "update"),
    # the policy reconciler (seedance.k8s_bridge.policy_sync)
    "list_slicing_policies": ("slicingpolicies", "list"),
    "watch_slicing_policies": ("slicingpolicies", "watch"),
    "patch_slicing_policy_status": ("slicingpolicies/status", "patch"),
    "list_tenant_quotas": ("tenantquotas", "list"),
    "watch_tenant_quotas": ("tenantquotas", "watch"),
    "patch_tenant_quota_status": ("tenantquotas/status", "patch"),
    "list_priority_classes": ("priorityclasses", "list"),
    "watch_priority_classes": ("priorityclasses", "watch"),
    # the router replicas' registrar (seedance.k8s_bridge.replica_sync)
    "list_endpoint_slices": ("endpointslices", "list"),
    "watch_endpoint_slices": ("endpointslices", "watch"),
}
#: Seedance's custom resources (cluster-scoped), as the CRDs in deploy/k8s/crds/ serve them.
CUSTOM_GROUP, CUSTOM_VERSION = "seedance.io", "v1alpha1"
for _resource, _verb in CALLS.values():
    rbac.needs(_resource, _verb)

_decode = msgspec.json.Decoder()
log = get_logger(__name__)
#: A list whose continue token expired is started again this many times in all, then the
#: 410 goes to the caller (the informer lists again after its backoff).
LIST_ATTEMPTS = 3


class ApiStatus(Exception):
    """The API server answered with an error status (``causes``: its ``details.causes``'
    messages, e.g. which PodDisruptionBudget refused an eviction)."""

    def __init__(self, code: int, reason: str, message: str, causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes


class ApiUnavailable(Exception):
    """No answer from the API server (refused, reset, timed out): retry later."""


#: How the bridge names itself to the API server (its audit log, ``kubectl get events``).
USER_AGENT = "seedance-k8s-bridge/0.1"


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


async def _json(call: Any) -> Json:
    """Await a ``_preload_content=False`` call: its JSON body, or the error it is."""
    try:
        resp = await call
    except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as exc:
        raise ApiUnavailable(f"{type(exc).__name__}: {exc}") from exc
    try:
        data = await resp.read()
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        raise ApiUnavailable(f"{type(exc).__name__}: {exc}") from exc
    finally:
        resp.release()
    body = _body(data)
    if resp.status >= 400:
        details = body.get("details")
        causes = details.get("causes") if isinstance(details, dict) else None
        raise ApiStatus(
            resp.status,
            str(body.get("reason", "")),
            str(body.get("message", "")),
            tuple(str(c.get("message", "")) for c in causes or [] if isinstance(c, dict)),
        )
    return body


def _body(data: bytes) -> Json:
    try:
        body = _decode.decode(data) if data else {}
    except msgspec.DecodeError:
        return {"message": data[:200].decode(errors="replace")}
    return body if isinstance(body, dict) else {}


class KubeApi:
    """The calls the bridge makes (see `CALLS`), returning the API's JSON."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        request_timeout_s: float = 10.0,
        page_size: int = 500,
        qps: float = 50.0,
        burst: int = 100,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        """``page_size`` (0: whole lists), ``qps`` (0 or less: no limit) and ``burst``: the
        bridge's ``LIST_PAGE_SIZE``, ``API_QPS`` and ``API_BURST`` settings."""
        self.client = api_client
        self._core = client.CoreV1Api(api_client)
        self._coord = client.CoordinationV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._scheduling = client.SchedulingV1Api(api_client)
        self._discovery = client.DiscoveryV1Api(api_client)
        self._timeout_s = request_timeout_s
        self._page_size = page_size
        #: The pod/node/list/watch calls' bucket, and the Events' own.
        self.rate = TokenBucket(qps, burst, clock)
        self._events_rate = TokenBucket(qps, burst, clock)
        #: Lists started again because a continue token had expired (410).
        self.lists_expired = 0

    async def close(self) -> None:
        await self.client.close()

    def on_rate_wait(self, hook: Callable[[str, float], None]) -> None:
        """Call ``hook(bucket, seconds)`` for each request held back by the rate (``api`` or
        ``events``): the service's metric."""
        self.rate.on_wait = functools.partial(hook, "api")
        self._events_rate.on_wait = functools.partial(hook, "events")

    def _opts(self) -> dict[str, Any]:
        return {"_preload_content": False, "_request_timeout": self._timeout_s}

    async def _call(self, fn: Any, *args: Any, **kw: Any) -> Json:
        """``fn(*args, **kw)``, once the rate lets it go (the request is made only then: a
        stop while it waits leaves nothing half-made)."""
        await self.rate.take()
        return await _json(fn(*args, **{**self._opts(), **kw}))

    async def _list(self, fn: Any, **kw: Any) -> Json:
        """Every page of a list, as one list at the first page's resourceVersion."""
        for attempt in range(1, LIST_ATTEMPTS + 1):
            try:
                return await self._pages(fn, **kw)
            except _ContinueExpired as exc:
                self.lists_expired += 1
                log.info("list_continue_expired", attempt=attempt, error=str(exc.status))
                if attempt == LIST_ATTEMPTS:
                    raise exc.status from None
        raise AssertionError("unreachable")

    async def _pages(self, fn: Any, **kw: Any) -> Json:
        items: list[Json] = []
        first: Json | None = None
        token = ""
        while True:
            paging: dict[str, Any] = {"limit": self._page_size} if self._page_size > 0 else {}
            if token:
                paging["_continue"] = token
            try:
                body = await self._call(fn, **kw, **paging)
            except ApiStatus as exc:
                if token and exc.code == 410:
                    raise _ContinueExpired(exc) from exc
                raise
            first = first or body
            items.extend(body.get("items") or [])
            token = str((body.get("metadata") or {}).get("continue") or "")
            if not token:
                break
        rv = (first.get("metadata") or {}).get("resourceVersion", "")
        return {**first, "metadata": {"resourceVersion": rv}, "items": items}

    # --- lists and watches ------------------------------------------------------------------

    async def list_pods(self, field_selector: str) -> Json:
        return await self._list(
            self._core.list_pod_for_all_namespaces, field_selector=field_selector
        )

    async def list_nodes(self, field_selector: str = "") -> Json:
        return await self._list(self._core.list_node)

    async def list_namespaces(self, field_selector: str = "") -> Json:
        return await self._list(self._core.list_namespace)

    def watch_pods(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._stream(
            self._core.list_pod_for_all_namespaces,
            field_selector=field_selector,
            resource_version=resource_version,
            timeout_s=timeout_s,
        )

    def watch_nodes(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._stream(
            self._core.list_node, resource_version=resource_version, timeout_s=timeout_s
        )

    def watch_namespaces(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._stream(
            self._core.list_namespace, resource_version=resource_version, timeout_s=timeout_s
        )

    async def _stream(
        self, fn: Any, *, resource_version: str, timeout_s: int, **kw: Any
    ) -> AsyncIterator[Json]:
        """A watch's events (``{"type": ..., "object": ...}``) until the server ends it.

        Raises:
            ApiStatus: the watch was refused (410 Gone: the resourceVersion is compacted).
            ApiUnavailable: the connection failed or broke.
        """
        await self.rate.take()
        try:
            resp = await fn(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _preload_content=False,
                # the client-side bound: the server's timeout plus a margin
                _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_s + 30),
                **kw,
            )
        except (aiohttp.ClientError, TimeoutError, ConnectionError, OSError) as exc:
            raise ApiUnavailable(f"{type(exc).__name__}: {exc}") from exc
        try:
            if resp.status >= 400:
                body = _body(await resp.read())
                raise ApiStatus(
                    resp.status, str(body.get("reason", "")), str(body.get("message", ""))
                )
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
                    raise ApiUnavailable(f"watch broke: {type(exc).__name__}: {exc}") from exc
                if not line:
                    return
                if line.strip():
                    yield _decode.decode(line)
        finally:
            resp.release()

    # --- pods -------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> Json | None:
        try:
            return await self._call(self._core.read_namespaced_pod, name, namespace)
        except ApiStatus as exc:
            if exc.code == 404:
                return None
            raise

    async def bind(self, namespace: str, name: str, body: Any) -> None:
        await self._call(self._core.create_namespaced_pod_binding, name, namespace, body)

    async def patch_pod_status(self, namespace: str, name: str, body: Json) -> None:
        # A dict body is sent as a strategic-merge patch (conditions merge by type).
        await self._call(self._core.patch_namespaced_pod_status, name, namespace, body)

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        body: Any = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        await self._call(self._core.delete_namespaced_pod, name, namespace, body=body)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """``POST pods/{name}/eviction`` (policy/v1): 429 while a PodDisruptionBudget allows
        no disruption of the pod."""
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        await self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)

    async def patch_node(self, name: str, body: Json) -> None:
        """A JSON merge patch of the Node (its ``metadata.resourceVersion``: 409 if it moved);
        merge, not strategic: ``spec.taints`` is replaced whole either way, and a merge patch
        says so."""
        await self._call(
            self._core.patch_node, name, body, _content_type="application/merge-patch+json"
        )

    async def create_event(self, namespace: str, body: Any) -> None:
        await self._events_rate.take()
        await _json(self._core.create_namespaced_event(namespace, body, **self._opts()))

    # --- leases -----------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Json | None:
        try:
            return await _json(self._coord.read_namespaced_lease(name, namespace, **self._opts()))
        except ApiStatus as exc:
            if exc.code == 404:
                return None
            raise

    async def create_lease(self, namespace: str, body: Any) -> Json:
        return await _json(self._coord.create_namespaced_lease(namespace, body, **self._opts()))

    async def replace_lease(self, namespace: str, name: str, body: Any) -> Json:
        return await _json(
            self._coord.replace_namespaced_lease(name, namespace, body, **self._opts())
        )

    # --- the policy reconciler's: Seedance's cluster-scoped CRs, PriorityClasses ------------

    async def list_slicing_policies(self, field_selector: str = "") -> Json:
        return await self._list_custom("slicingpolicies")

    def watch_slicing_policies(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._watch_custom("slicingpolicies", resource_version, timeout_s)

    async def patch_slicing_policy_status(self, name: str, body: Json) -> Json:
        return await self._patch_custom_status("slicingpolicies", name, body)

    async def list_tenant_quotas(self, field_selector: str = "") -> Json:
        return await self._list_custom("tenantquotas")

    def watch_tenant_quotas(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._watch_custom("tenantquotas", resource_version, timeout_s)

    async def patch_tenant_quota_status(self, name: str, body: Json) -> Json:
        return await self._patch_custom_status("tenantquotas", name, body)

    async def list_priority_classes(self, field_selector: str = "") -> Json:
        return await self._list(self._scheduling.list_priority_class)

    def watch_priority_classes(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._stream(
            self._scheduling.list_priority_class,
            resource_version=resource_version,
            timeout_s=timeout_s,
        )

    # --- the replica registrar's: EndpointSlices of every namespace, by label -----------------

    async def list_endpoint_slices(self, label_selector: str) -> Json:
        return await self._list(
            self._discovery.list_endpoint_slice_for_all_namespaces, label_selector=label_selector
        )

    def watch_endpoint_slices(
        self, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        return self._stream(
            self._discovery.list_endpoint_slice_for_all_namespaces,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_s=timeout_s,
        )

    async def _list_custom(self, plural: str) -> Json:
        fn = functools.partial(
            self._custom.list_cluster_custom_object, CUSTOM_GROUP, CUSTOM_VERSION, plural
        )
        return await self._list(fn)

    def _watch_custom(
        self, plural: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[Json]:
        fn = functools.partial(
            self._custom.list_cluster_custom_object, CUSTOM_GROUP, CUSTOM_VERSION, plural
        )
        return self._stream(fn, resource_version=resource_version, timeout_s=timeout_s)

    async def _patch_custom_status(self, plural: str, name: str, body: Json) -> Json:
        """A JSON merge patch of the CR's /status (the client's default is a JSON patch)."""
        return await self._call(
            self._custom.patch_cluster_custom_object_status,
            CUSTOM_GROUP, CUSTOM_VERSION, plural, name, body,
            _content_type="application/merge-patch+json",
        )  # fmt: skip


class _ContinueExpired(Exception):
    """A continue token the server no longer serves (410): the list starts again."""

    def __init__(self, status: ApiStatus) -> None:
        super().__init__(str(status))
        self.status = status
