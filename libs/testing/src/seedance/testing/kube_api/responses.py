"""How the test Kubernetes API server frames its answers: JSON bodies, Status objects, list
pages (``limit`` / ``continue``) and whether a client asked for a server-side Table.

Owns the response framing that does not depend on the store or a verb's rules. It must not read
or change objects (`store`), decide a verb's outcome (`strategy`), nor route requests (`server`).
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from aiohttp import web

from seedance.testing.kube_api import errors
from seedance.testing.kube_api.errors import ApiError, status_body

__all__ = ["JSON", "encode", "error_response", "json_response", "page", "success", "wants_table"]

JSON = "application/json"
encode = msgspec.json.Encoder().encode


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=encode(body), status=status, content_type=JSON)


def error_response(err: ApiError) -> web.Response:
    return json_response(status_body(err), err.code)


def _oid(obj: dict[str, Any]) -> list[str]:
    return [obj["metadata"].get("namespace", ""), obj["metadata"]["name"]]


def page(
    items: list[dict[str, Any]], query: dict[str, str], meta: dict[str, Any]
) -> list[dict[str, Any]]:
    """``limit``/``continue``: pages in key order. The token holds the last key served; a
    later page shows the objects as they are then (a real server serves the first page's
    snapshot, from etcd, until it is compacted)."""
    token = query.get("continue", "")
    if token:
        try:
            after = msgspec.json.decode(base64.urlsafe_b64decode(token.encode()))["after"]
        except (ValueError, KeyError, TypeError, msgspec.DecodeError):
            raise errors.bad_request("invalid continue token") from None
        items = [o for o in items if _oid(o) > after]
    limit = query.get("limit", "")
    if limit.isdigit() and 0 < int(limit) < len(items):
        rest = len(items) - int(limit)
        items = items[: int(limit)]
        last = encode({"after": _oid(items[-1])})
        meta["continue"] = base64.urlsafe_b64encode(last).decode()
        meta["remainingItemCount"] = rest
    return items


def success(code: int) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def wants_table(request: web.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")
