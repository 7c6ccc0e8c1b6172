"""A container's environment as the kubelet gives it: the Secrets of its ``envFrom`` first, then
each ``env`` entry in order, a ``value``'s ``$(VAR)`` references expanded from what is defined
before it, and ``metadata.name`` from the downward API (the only field the manifests read)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["kubelet_expand", "pod_env"]

#: A kubelet variable reference: ``$$`` (a literal ``$``) or ``$(NAME)``.
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def kubelet_expand(value: str, env: Mapping[str, str]) -> str:
    """``value`` as the kubelet gives it to a container: each ``$(NAME)`` of a variable defined
    before it (``envFrom``, earlier ``env``) replaced by its value, ``$$`` by ``$``, and an
    undefined reference left as it is."""

    def one(m: re.Match[str]) -> str:
        return "$" if m[0] == "$$" else env.get(m[1], m[0])

    return _REFERENCE.sub(one, value)


def pod_env(
    container: Mapping[str, Any], secrets: Mapping[str, Mapping[str, str]], pod_name: str
) -> dict[str, str]:
    """``container``'s environment in pod ``pod_name``, its ``envFrom`` Secrets' values from
    ``secrets`` (by name: each must be there)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= secrets[source["secretRef"]["name"]]
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = kubelet_expand(var["value"], env)
            continue
        assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", var
        env[var["name"]] = pod_name
    return env
