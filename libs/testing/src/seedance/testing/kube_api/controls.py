"""The test Kubernetes API server's settings and test controls: injected faults, held requests
and the audit log's records.

Owns these values (`KubeApiSettings`, `Fault`, `Hold`, `AuditRecord`), the reason a fault's
status carries by default (`reason_for`) and which control a request meets (`take`). It must
not serve requests or hold state: the server (`seedance.testing.kube_api.server`) keeps the
controls, applies them and appends audit records.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from seedance.testing.kube_api.validation import KUBERNETES_VERSION

__all__ = ["AuditRecord", "Fault", "Hold", "KubeApiSettings", "reason_for", "take"]


@dataclass(frozen=True, kw_only=True)
class KubeApiSettings:
    """``bookmark_interval_s``: how often an idle watch that asked for bookmarks gets one (a
    real server: about a minute). ``history_window``: changes kept for watch resumption.
    ``state_path``: the journal that makes the store survive a process restart."""

    host: str = "127.0.0.1"
    port: int = 0
    bookmark_interval_s: float = 3.0
    history_window: int = 10_000
    watch_timeout_s: float = 1800.0
    kubernetes_version: str = KUBERNETES_VERSION
    validate: bool = True
    state_path: Path | None = None


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    verb: str
    api_group: str
    api_version: str
    resource: str
    subresource: str
    namespace: str
    name: str
    user_agent: str
    method: str
    path: str
    code: int


@dataclass(kw_only=True)
class Fault:
    """Fail the next ``remaining`` requests whose method and path match with ``code``."""

    method: str
    path: re.Pattern[str]
    code: int
    remaining: int
    message: str
    reason: str


@dataclass(kw_only=True)
class Hold:
    """Hold the next ``remaining`` requests whose method and path match, unanswered, until
    ``release`` is set (then each is served as usual): a call that hangs. ``arrived`` is set
    when one is held, so that a test waits for it instead of sleeping."""

    method: str
    path: re.Pattern[str]
    remaining: int
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


_Control = TypeVar("_Control", Fault, Hold)


def take(controls: Iterable[_Control], method: str, path: str) -> _Control | None:
    """The first of ``controls`` with requests left that ``method`` and ``path`` match (one
    request of it used up), or None."""
    for control in controls:
        if control.remaining > 0 and control.method in (method, "*") and control.path.search(path):
            control.remaining -= 1
            return control
    return None


def reason_for(code: int) -> str:
    return {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "Conflict",
        410: "Expired",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }.get(code, "Unknown")
