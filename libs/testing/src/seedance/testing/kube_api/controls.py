"""The test Kubernetes API server's settings and test controls: injected faults and the audit log's
records.

Owns these values (`KubeApiSettings`, `Fault`, `AuditRecord`) and the reason a fault's status
carries by default (`reason_for`). It must not serve requests or hold state: the server
(`seedance.testing.kube_api.server`) matches faults and appends audit records.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from seedance.testing.kube_api.validation import KUBERNETES_VERSION

__all__ = ["AuditRecord", "Fault", "KubeApiSettings", "reason_for"]


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
