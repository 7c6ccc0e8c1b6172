"""A pod's end (phase ``Succeeded``/``Failed``, or its deletion) as its job's end, and which
clock says when.

The billed clock. Three clocks see a pod end: the API server's (``creationTimestamp``,
``deletionTimestamp``; the latter is the *deadline* of a graceful deletion, not the end), the
kubelet's (the phase change and each container's ``state.terminated.finishedAt``, the closest
to the truth but on a node's clock, which may be skewed), and the bridge's own (when it saw the
change: always after the fact, late by the watch delay). The bridge bills

    at = min(observed_at, max(bound_at, finished_at))

``finished_at`` is the kubelet's latest container ``finishedAt`` when every container has
terminated (else ``observed_at``); ``bound_at`` is the bridge's time of the Binding (in the
placement annotation). So a kubelet clock ahead of ours cannot bill past what the bridge saw,
and one behind cannot end a job before it was bound; within those bounds the kubelet's finer
account wins. A pod deleted while running ends when the bridge sees it gone. A job's start is
billed by the slicer from its placement (``Placement.at``), which is the bridge's submit time.

Must not do I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["EndKind", "billed_end", "end_kind", "finished_at", "parse_k8s_time"]

Json = Mapping[str, Any]

#: "finished" | "failed" | "cancelled"
EndKind = str


def parse_k8s_time(raw: object) -> datetime | None:
    """An RFC 3339 time as the API server writes it (``Z`` or an offset, optional fraction)."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def finished_at(pod: Json) -> datetime | None:
    """The kubelet's latest ``finishedAt`` when every container has terminated, else None."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses:
        return None
    latest: datetime | None = None
    for s in statuses:
        t = parse_k8s_time(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        if t is None:
            return None
        latest = t if latest is None or t > latest else latest
    return latest


def end_kind(pod: Json, *, deleted: bool) -> tuple[EndKind, str] | None:
    """(outcome, reason) of a pod that ended, or None while it lives."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase == "Succeeded":
        return "finished", ""
    if phase == "Failed":
        return "failed", _failure_reason(status)
    if deleted:
        return "cancelled", "pod deleted"
    return None


def _failure_reason(status: Json) -> str:
    for s in status.get("containerStatuses") or []:
        term = (s.get("state") or {}).get("terminated") or {}
        if term.get("exitCode"):
            why = term.get("reason") or "Error"
            return f"container {s.get('name', '?')}: {why} (exit code {term['exitCode']})"
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    return (f"{reason}: {message}" if reason and message else reason or message or "pod failed")[
        :1024
    ]


def billed_end(pod: Json, *, observed_at: datetime, bound_at: datetime | None) -> datetime:
    """When the job is billed as ended (module docstring)."""
    finished = finished_at(pod) or observed_at
    if bound_at is not None and finished < bound_at:
        finished = bound_at
    return min(observed_at, finished)
