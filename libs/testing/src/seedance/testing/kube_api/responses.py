"""How the test Kubernetes API server frames its answers: JSON bodies, Status objects, list
pages (``limit`` / ``continue``) and whether a client asked for a server-side Table.

Owns the response framing that does not depend on the store or a verb's rules. It must not read
or change objects (`store`), decide a verb's outcome (`strategy`), nor route requests (`server`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from seedance.testing.kube_api import errors
from seedance.testing.kube_api.errors import ApiError, status_body

__all__ = [
    "JSON",
    "Continue",
    "continued",
    "encode",
    "error_response",
    "json_response",
    "page",
    "success",
    "wants_table",
]

JSON = "application/json"
encode = msgspec.json.Encoder().encode
#: kube-apiserver's words for a continue token whose snapshot was compacted away.
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter."
)


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type=JSON)


def error_response(err: ApiError) -> web.Response:
    return json_response(status_body(err), err.code)


def _oid(obj: dict[str, Any]) -> list[str]:
    return [obj["metadata"].get("namespace", ""), obj["metadata"]["name"]]


@dataclass(frozen=True, slots=True)
class Continue:
    """What a continue token holds: the last key served and the list's snapshot revision."""

    after: list[str]
    rv: int


def continued(query: dict[str, str], floor: int) -> Continue | None:
    """The request's continue token, if any. A token from before ``floor`` (the history was
    compacted past its snapshot) is ``410 Expired``, as etcd's compaction makes it on a real
    server; the client lists again from the start."""
    token = query.get("continue", "")
    if not token:
        return None
    try:
        doc = msgspec.json.decode(base64.urlsafe_b64decode(token.encode()))
        cont = Continue(after=[str(k) for k in doc["after"]], rv=int(doc["rv"]))
    except (ValueError, KeyError, TypeError, msgspec.DecodeError):
        raise errors.bad_request("invalid continue token") from None
    if cont.rv < floor:
        raise errors.expired(CONTINUE_EXPIRED)
    return cont


def page(
    items: list[dict[str, Any]], query: dict[str, str], meta: dict[str, Any], cont: Continue | None
) -> list[dict[str, Any]]:
    """``limit``/``continue``: pages in key order of one snapshot. ``items`` are the objects as
    of the list's revision (``meta["resourceVersion"]``: the first page's, which every later
    page repeats, as a real server serves one etcd snapshot until it is compacted); the token
    holds that revision and the last key served."""
    if cont is not None:
        items = [o for o in items if _oid(o) > cont.after]
    limit = query.get("limit", "")
    if limit.isdigit() and 0 < int(limit) < len(items):
        rest = len(items) - int(limit)
        items = items[: int(limit)]
        last = encode({"after": _oid(items[-1]), "rv": int(meta["resourceVersion"])})
        meta["continue"] = base64.urlsafe_b64encode(last).decode()
        meta["remainingItemCount"] = rest
    return items


def success(code: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")
