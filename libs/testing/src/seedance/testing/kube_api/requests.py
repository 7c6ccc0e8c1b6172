"""What a request to the test Kubernetes API server is, as the apiserver's RequestInfoFactory
decides it: resource or not, group, version, resource, subresource, namespace, name and verb.

Owns `RequestInfo`, `parse_request` and the query truths it reads (``watch=1``, Go's
strconv.ParseBool). It must not touch the store, answer a request or know aiohttp: the server
(`seedance.testing.kube_api.server`) calls it on each request's method, path and query.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TRUE", "RequestInfo", "parse_request"]

#: Go's strconv.ParseBool truths, which the apiserver uses for ``watch`` and friends.
TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})
#: Subresources of a namespace itself (``namespaces/x/status``), not namespaced resources.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@dataclass(frozen=True, kw_only=True)
class RequestInfo:
    """What a request is, as the apiserver's RequestInfoFactory decides it."""

    verb: str
    path: str
    is_resource: bool = False
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def parse_request(method: str, path: str, query: dict[str, str]) -> RequestInfo:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return RequestInfo(verb=method.lower(), path=path)
    watch = bool(rest) and rest[0] == "watch"
    if watch:
        rest = rest[1:]
    if not rest:
        return RequestInfo(verb=method.lower(), path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in _NAMESPACE_SUBRESOURCES:
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    verb = _verb(method, bool(name), watch or query.get("watch") in TRUE)
    return RequestInfo(
        verb=verb,
        path=path,
        is_resource=True,
        group=group,
        version=version,
        resource=resource,
        subresource=sub,
        namespace=namespace,
        name=name,
    )


def _verb(method: str, named: bool, watch: bool) -> str:
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
