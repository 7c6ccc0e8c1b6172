"""The API server's failures as the wire shows them: ``metav1.Status`` objects with the HTTP
code, reason and (for Invalid) ``details.causes`` that client libraries turn into exceptions.

It owns the mapping from a failure to its Status body; it must not decide when a request fails
(the store and the handlers do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ApiError",
    "Cause",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "gone",
    "invalid",
    "method_not_allowed",
    "not_found",
    "status_body",
    "unsupported_media_type",
]


@dataclass(frozen=True, kw_only=True)
class Cause:
    """One ``details.causes`` entry: the field path (``spec.containers[0].image``) and why."""

    field: str
    message: str
    reason: str = "FieldValueInvalid"


@dataclass(kw_only=True)
class ApiError(Exception):
    """A request the server refuses; ``status_body()`` renders it as the API's Status."""

    code: int
    reason: str
    message: str
    group: str = ""
    kind: str = ""
    name: str = ""
    causes: tuple[Cause, ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"


def status_body(err: ApiError) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if err.name:
        details["name"] = err.name
    if err.group:
        details["group"] = err.group
    if err.kind:
        details["kind"] = err.kind
    if err.causes:
        details["causes"] = [
            {"reason": c.reason, "message": c.message, "field": c.field} for c in err.causes
        ]
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": err.message,
        "reason": err.reason,
        "code": err.code,
    }
    if details:
        body["details"] = details
    return body


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        code=404,
        reason="NotFound",
        message=f'{_qualified(resource, group)} "{name}" not found',
        group=group,
        kind=resource,
        name=name,
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        code=409,
        reason="AlreadyExists",
        message=f'{_qualified(resource, group)} "{name}" already exists',
        group=group,
        kind=resource,
        name=name,
    )


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        code=409,
        reason="Conflict",
        message=f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
        group=group,
        kind=resource,
        name=name,
    )


def invalid(kind: str, group: str, name: str, causes: tuple[Cause, ...]) -> ApiError:
    listed = ", ".join(f"{c.field}: {c.message}" for c in causes)
    return ApiError(
        code=422,
        reason="Invalid",
        message=f"{kind}.{group or ''}".rstrip(".") + f' "{name}" is invalid: [{listed}]',
        group=group,
        kind=kind,
        name=name,
        causes=causes,
    )


def expired(message: str) -> ApiError:
    return ApiError(code=410, reason="Expired", message=message)


def gone(message: str) -> ApiError:
    return ApiError(code=410, reason="Gone", message=message)


def bad_request(message: str) -> ApiError:
    return ApiError(code=400, reason="BadRequest", message=message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(code=405, reason="MethodNotAllowed", message=message)


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        code=415,
        reason="UnsupportedMediaType",
        message=f"the body of the request was in an unknown format - accepted media types "
        f"include: application/json-patch+json, application/merge-patch+json, "
        f"application/strategic-merge-patch+json (got {content_type!r})",
    )
