"""The status writes the policy reconciler makes: a CR's /status patched only when it changed.

Owns the JSON merge patch (RFC 7386, what ``application/merge-patch+json`` applies) that turns
the status a CR has into the one `seedance.k8s_bridge.core.policy.reconcile` computed: the keys
that changed, ``null`` for the keys that went (a usage dimension that dropped to nothing), and
nothing at all when the two are equal, so a reconcile after the bridge's own status write (its
watch event) writes nothing. Lists (``conditions``) are replaced whole, as a merge patch does.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["merge_patch", "status_patches"]

Key = tuple[str, str]


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch taking ``old`` to ``new``; ``{}`` when they are equal."""
    out: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                out[key] = sub
        elif key not in old or before != value:
            out[key] = _plain(value)
    for key in old:
        if key not in new:
            out[key] = None
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def status_patches(
    wanted: Mapping[Key, Mapping[str, Any]], objects: Mapping[Key, Mapping[str, Any]]
) -> dict[Key, dict[str, Any]]:
    """Per (kind, name) whose status differs from ``wanted``, the body to PATCH on its
    /status (``{"status": <merge patch>}``). A CR no longer in ``objects`` (deleted since) is
    left out; a key of the stored status the reconciler does not write is left alone."""
    out: dict[Key, dict[str, Any]] = {}
    for key, status in wanted.items():
        obj = objects.get(key)
        if obj is None:
            continue
        current = obj.get("status") or {}
        # only the fields the reconciler owns: a key it never writes is not deleted
        owned = {k: v for k, v in current.items() if k in status or k in _OWNED}
        patch = merge_patch(owned, status)
        if patch:
            out[key] = {"status": patch}
    return out


#: The status fields the reconciler writes (a field of these it stops writing is removed).
_OWNED = frozenset({"observedGeneration", "conditions", "usage", "borrowed"})
