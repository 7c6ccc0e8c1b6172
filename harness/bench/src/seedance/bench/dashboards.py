"""The shipped Grafana dashboards' queries, as Grafana sends them, and which of them a Prometheus
answers with series: shared by tests/e2e/test_dashboards_prometheus.py (a replay of the services
as processes) and `make compose-check` (the compose stack).

Owns: reading the boards in ``deploy/compose/grafana/dashboards``, substituting their variables
as Grafana does (``.*`` for "All", a custom variable's current value), and the list of queries
that cannot have series without real GPUs, each with its reason. Must not: start anything or
decide what counts as enough data (its callers do).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from seedance.bench.repo import REPO

__all__ = [
    "DASHBOARDS",
    "NO_SERIES_WITHOUT_GPUS",
    "dashboard_queries",
    "empty_queries",
    "prometheus_get",
    "substituted",
]

DASHBOARDS = sorted((REPO / "deploy" / "compose" / "grafana" / "dashboards").glob("*.json"))

#: Queries that cannot have series from a replayed fleet, and why. Callers require that exactly
#: these come back empty (a valid query, no series), so an entry that starts working fails them
#: until it is removed.
NO_SERIES_WITHOUT_GPUS = {
    "seedance-fleet: GPU utilisation [C]": (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE comes from NVML's GPM counters on a real GPU; the "
        "replayed fleet (FleetSim) models SM activity and memory, not the tensor pipe, so the "
        "collector exports no such series for it"
    ),
}


def substituted(expr: str, variables: list[dict[str, Any]]) -> str:
    """The query as Grafana sends it: "All" is ``.*``, a custom variable its current value."""
    for var in variables:
        if var["type"] == "datasource":
            continue
        value = ".*" if var.get("includeAll") else var["current"]["value"]
        expr = expr.replace(f"${var['name']}", value).replace(f"${{{var['name']}}}", value)
    expr = expr.replace("$__range", "1h")
    if "$" in expr:
        raise ValueError(f"an unknown variable in {expr}")
    return expr


def dashboard_queries(
    boards: list[Path] = DASHBOARDS,
) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """(panel title + refId -> PromQL, variable -> (series selector, label))."""
    panels: dict[str, str] = {}
    label_queries: dict[str, tuple[str, str]] = {}
    for path in boards:
        board = json.loads(path.read_text())
        variables = board["templating"]["list"]
        for panel in board["panels"]:
            for target in panel["targets"]:
                key = f"{path.stem}: {panel['title']} [{target['refId']}]"
                panels[key] = substituted(target["expr"], variables)
        for var in variables:
            if var["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            if not m:
                raise ValueError(f"{path.name}: variable {var['name']}: {var['query']}")
            label_queries[f"{path.stem}: ${var['name']}"] = (
                substituted(m.group(1), variables),
                m.group(2),
            )
    return panels, label_queries


def prometheus_get(url: str, path: str, **params: str) -> Any:
    """One call of Prometheus's HTTP API; its ``data``. A rejected query raises."""
    query = urllib.parse.urlencode(params)
    with urllib.request.urlopen(f"{url}{path}?{query}", timeout=10) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus {path} {params}: {body}")
    return body["data"]


def empty_queries(url: str) -> list[str]:
    """Panel queries and variables with no series (a query Prometheus rejects raises)."""
    panels, label_queries = dashboard_queries()
    empty = [
        k for k, q in panels.items() if not prometheus_get(url, "/api/v1/query", query=q)["result"]
    ]
    for key, (selector, label) in label_queries.items():
        if not prometheus_get(url, f"/api/v1/label/{label}/values", **{"match[]": selector}):
            empty.append(key)
    return empty
