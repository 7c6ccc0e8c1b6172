"""Discovery documents as kubectl and client libraries read them: ``/version``, ``/api``,
``/apis``, ``/apis/<group>``, ``/api/v1`` and ``/apis/<group>/<version>`` (APIResourceList
with verbs, short names, scope, kind and the subresources), and the server-side ``Table``
that ``kubectl get`` asks for.

Pure functions of the resource table (and, for tables, of the objects); no HTTP. Aggregated
discovery (``apidiscovery.k8s.io/v2``) is not served: kubectl falls back to these documents
when it gets plain JSON back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from seedance.testing.kube_api.resources import ALL_VERBS, ResourceType

__all__ = ["api_groups", "api_resources", "api_versions", "table", "version_info"]

_SUB_VERBS = {
    "status": ["get", "patch", "update"],
    "scale": ["get", "patch", "update"],
    "binding": ["create"],
    "eviction": ["create"],
}
_SUB_KIND = {"binding": ("Binding", "", ""), "eviction": ("Eviction", "policy", "v1")}


def version_info(version: str) -> dict[str, str]:
    major, minor = version.lstrip("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": version,
        "gitCommit": "seedance-test-api-server",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def _groups(types: Iterable[ResourceType]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rt in types:
        if rt.group and rt.version not in out.setdefault(rt.group, []):
            out[rt.group].append(rt.version)
    return out


def api_groups(types: Iterable[ResourceType], group: str | None = None) -> dict[str, Any] | None:
    """``/apis`` (group None) or ``/apis/<group>`` (None when the group is not served)."""
    groups = _groups(types)
    if group is not None:
        if group not in groups:
            return None
        return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, groups[group])}
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in sorted(groups.items())],
    }


def api_resources(types: Iterable[ResourceType], group: str, version: str) -> dict[str, Any] | None:
    served = [rt for rt in types if rt.group == group and rt.version == version]
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for rt in sorted(served, key=lambda r: r.plural):
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(ALL_VERBS),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            kind, sub_group, sub_version = _SUB_KIND.get(sub, (rt.kind, "", ""))
            sub_entry: dict[str, Any] = {
                "name": f"{rt.plural}/{sub}",
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": kind,
                "verbs": _SUB_VERBS.get(sub, ["get"]),
            }
            if sub_group:
                sub_entry.update(group=sub_group, version=sub_version)
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


# --- server-side printing (``kubectl get``) -------------------------------------------------


def _age(created: str | None, now: datetime) -> str:
    if not created:
        return "<unknown>"
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=now.tzinfo)
    secs = max(0, int((now - then).total_seconds()))
    if secs < 120:
        return f"{secs}s"
    if secs < 7200:
        return f"{secs // 60}m"
    if secs < 172800:
        return f"{secs // 3600}h"
    return f"{secs // 86400}d"


def _pod_cells(obj: dict[str, Any], age: str) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("phase", "Pending")
    if obj["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    node = spec.get("nodeName") or "<none>"
    return [obj["metadata"]["name"], f"{ready}/{len(containers)}", phase, restarts, age, node]


def json_path(obj: Any, path: str) -> Any:
    """A printer column's ``jsonPath`` on `obj`: the subset CRDs use (``.a.b``, ``.a[0]``,
    ``.a[?(@.k=="v")].b``, as in ``.status.conditions[?(@.type=="Ready")].status``); None
    where nothing matches (kubectl shows ``<none>``)."""
    node = obj
    for key, index, fkey, fval in _STEP.findall(path.strip()):
        if key:
            node = node.get(key) if isinstance(node, dict) else None
        elif index:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        elif isinstance(node, list):
            node = next((x for x in node if isinstance(x, dict) and x.get(fkey) == fval), None)
        else:
            node = None
        if node is None:
            return None
    return node


_STEP = re.compile(r'\.([A-Za-z0-9_-]+)|\[([0-9]+)\]|\[\?\(@\.([A-Za-z0-9_-]+)=="([^"]*)"\)\]')


def _cells(obj: dict[str, Any], age: str) -> list[Any]:
    return [obj["metadata"]["name"], age]


#: (name, type, priority): priority 1 columns show with ``-o wide`` only, as on a real server.
_COLUMNS: dict[tuple[str, str], list[tuple[str, str, int]]] = {
    ("", "pods"): [
        ("Name", "string", 0),
        ("Ready", "string", 0),
        ("Status", "string", 0),
        ("Restarts", "integer", 0),
        ("Age", "string", 0),
        ("Node", "string", 1),
    ],
}
_DEFAULT_COLUMNS = [("Name", "string", 0), ("Age", "string", 0)]


def table(
    rt: ResourceType, objects: list[dict[str, Any]], rv: str, now: datetime, include: str
) -> dict[str, Any]:
    columns = _COLUMNS.get((rt.group, rt.plural), _DEFAULT_COLUMNS)
    cells_of = _pod_cells if (rt.group, rt.plural) == ("", "pods") else _cells
    if rt.printer_columns:  # as a real server: NAME, then exactly the CRD's columns
        columns = [("Name", "string", 0), *((n, t, p) for n, t, _, p in rt.printer_columns)]
        paths = [path for _, _, path, _ in rt.printer_columns]

        kinds = [kind for _, kind, _, _ in rt.printer_columns]

        def cells_of(obj: dict[str, Any], age: str) -> list[Any]:
            values = [json_path(obj, p) for p in paths]
            # a date column prints as an age, as the real server's table convertor does
            cells = [
                _age(v, now) if k == "date" and isinstance(v, str) else v
                for v, k in zip(values, kinds, strict=True)
            ]
            return [obj["metadata"]["name"], *cells]

    rows = []
    for obj in objects:
        row: dict[str, Any] = {
            "cells": cells_of(obj, _age(obj["metadata"].get("creationTimestamp"), now))
        }
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": [
            {
                "name": n,
                "type": t,
                "format": "name" if n == "Name" else "",
                "description": n,
                "priority": p,
            }
            for n, t, p in columns
        ],
        "rows": rows,
    }


# --- OpenAPI v3, as far as kubectl needs it -------------------------------------------------


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _patch_types(rt: ResourceType) -> tuple[str, ...]:
    base = ("application/json-patch+json", "application/merge-patch+json")
    return base if rt.custom else (*base, "application/strategic-merge-patch+json")


def openapi_root(types: Iterable[ResourceType]) -> dict[str, Any]:
    """``/openapi/v3``: one entry per served group/version."""
    gvs = sorted({(rt.group, rt.version) for rt in types})
    return {
        "paths": {
            _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash={n}"}
            for n, (g, v) in enumerate(gvs)
        }
    }


def openapi_group_version(
    types: Iterable[ResourceType], group: str, version: str, kube_version: str
) -> dict[str, Any] | None:
    """``/openapi/v3/<gv>``: the PATCH operation of each kind, tagged with its GVK and the
    ``fieldValidation`` parameter. That is what kubectl's query-parameter verifier reads to
    decide that the server validates (so it sends ``fieldValidation=Strict`` instead of
    validating on its side, which would need the whole OpenAPI v2 document). No schemas are
    served: kubectl then builds strategic merge patches from its compiled-in types."""
    served = [rt for rt in types if rt.group == group and rt.version == version]
    if not served:
        return None
    params = [
        {"name": p, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
        for p in ("dryRun", "fieldManager", "fieldValidation", "force")
    ]
    paths: dict[str, Any] = {}
    for rt in served:
        scope = "namespaces/{namespace}/" if rt.namespaced else ""
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[f"/{_gv_path(group, version)}/{scope}{rt.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "requestBody": {
                    "content": {t: {"schema": {"type": "object"}} for t in _patch_types(rt)}
                },
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": kube_version},
        "paths": paths,
        "components": {"schemas": {}},
    }
