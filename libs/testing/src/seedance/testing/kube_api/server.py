"""The test Kubernetes API server's HTTP side (aiohttp): the REST paths, verbs and watch
streams of the real wire protocol, discovery, fault injection and the request audit log.

``KubeApiServer`` runs in-process (``async with KubeApiServer() as api``) and can be stopped
and started on the same port keeping its store, dropping open watches mid-stream the way a
restarting apiserver does. It owns routing each request to its verb, the watch streams, fault
injection and the audit log; what a request is is ``requests``', response framing
``responses``', the settings and test-control values ``controls``', the verbs' rules
``strategy``'s and the objects ``store``'s. It must not validate or store objects itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog
import yaml
from aiohttp import web

from seedance.core.clock import Clock, WallClock
from seedance.testing.kube_api import controls, discovery, errors
from seedance.testing.kube_api.admission import ANONYMOUS, UserInfo, service_account
from seedance.testing.kube_api.controls import AuditRecord, Fault, Hold, KubeApiSettings
from seedance.testing.kube_api.errors import ApiError, status_body
from seedance.testing.kube_api.requests import TRUE, RequestInfo, parse_request
from seedance.testing.kube_api.resources import ResourceType
from seedance.testing.kube_api.responses import (
    JSON,
    continued,
    encode,
    error_response,
    json_response,
    page,
    success,
    wants_table,
)
from seedance.testing.kube_api.selectors import SelectorError, parse_fields, parse_labels
from seedance.testing.kube_api.store import Journal, Store
from seedance.testing.kube_api.strategy import Api, WriteOptions
from seedance.testing.kube_api.validation import builtin_schemas

__all__ = [
    "ADMIN_TOKEN",
    "COMPACT_PATH",
    "AuditRecord",
    "Fault",
    "Hold",
    "KubeApiServer",
    "KubeApiSettings",
    "RequestInfo",
]

_log = structlog.get_logger(__name__)
#: ``POST`` here compacts (``?rv=N``, default now): the process form of ``compact()``.
COMPACT_PATH = "/_testing/compact"
_decode = msgspec.json.Decoder().decode
#: Encodings a real apiserver also accepts, which this one does not decode.
_UNDECODED = frozenset({"application/vnd.kubernetes.protobuf", "application/cbor"})
_INFO = web.RequestKey("kube_api_info", RequestInfo)
_USER = web.RequestKey("kube_api_user", UserInfo)
#: The token every kubeconfig this server writes carries unless a test names another user:
#: a cluster admin (``system:masters``), as a test's own setup and kubectl act.
ADMIN_TOKEN = "seedance-test"
ADMIN = UserInfo("seedance-test", ("system:masters", "system:authenticated"))
_AUDITED = web.RequestKey("kube_api_audited", bool)


class KubeApiServer:
    """A Kubernetes API server for tests, over real HTTP. See the package docstring."""

    def __init__(self, settings: KubeApiSettings | None = None, clock: Clock | None = None) -> None:
        self.settings = settings or KubeApiSettings()
        self.clock = clock or WallClock()
        journal = Journal(self.settings.state_path) if self.settings.state_path else None
        self.store = Store(history_window=self.settings.history_window, journal=journal)
        schemas = (
            builtin_schemas(self.settings.kubernetes_version) if self.settings.validate else None
        )
        self.api = Api(self.store, self.clock, schemas)
        self.audit: list[AuditRecord] = []
        self.faults: list[Fault] = []
        self.holds: list[Hold] = []
        self.port = self.settings.port
        self._runner: web.AppRunner | None = None
        self._streams: set[web.StreamResponse] = set()
        #: Bearer token -> user (the real server's static token file); see ``token_for``.
        self.tokens: dict[str, UserInfo] = {ADMIN_TOKEN: ADMIN}

    # lifecycle --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            server = site._server
            assert isinstance(server, asyncio.base_events.Server)
            self.port = server.sockets[0].getsockname()[1]
        self._runner = runner

    async def stop(self) -> None:
        """Stop serving (idempotent). Open watches are cut mid-stream, without the closing
        chunk, as a restarting apiserver drops them; the store stays for ``start()``."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        self.store.close_watchers()
        for stream in list(self._streams):
            transport = stream._req.transport if stream._req is not None else None
            if transport is not None:
                transport.abort()
        await runner.cleanup()
        if self.store.journal is not None:
            self.store.journal.close()

    async def __aenter__(self) -> KubeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # test controls ----------------------------------------------------------------------
    def token_for(self, user: UserInfo) -> str:
        """A bearer token that authenticates as ``user`` (kept while the object lives)."""
        token = f"token-{len(self.tokens)}-{user.username}"
        self.tokens[token] = user
        return token

    def service_account_token(self, namespace: str, name: str, node: str = "") -> str:
        """A token of service account ``namespace/name`` (its user and groups), bound to a pod
        on ``node`` where given (``request.userInfo.extra``'s node name)."""
        return self.token_for(service_account(namespace, name, node))

    def kubeconfig(
        self, path: Path | str, namespace: str = "default", token: str = ADMIN_TOKEN
    ) -> Path:
        """Write a kubeconfig pointing at this server (kubectl and kubernetes_asyncio), whose
        user is the one ``token`` authenticates (default: a cluster admin)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "seedance-test", "cluster": {"server": self.url}}],
            "users": [{"name": "seedance-test", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "seedance-test",
                    "context": {
                        "cluster": "seedance-test",
                        "user": "seedance-test",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "seedance-test",
        }
        out = Path(path)
        out.write_text(yaml.safe_dump(doc))
        return out

    def compact(self, rv: int | None = None) -> int:
        """Forget history up to ``rv`` (default: now): older watches get 410 Expired."""
        return self.store.compact(rv)

    def fail_next(
        self,
        method: str,
        path_regex: str,
        code: int,
        count: int = 1,
        message: str = "injected fault",
        reason: str | None = None,
    ) -> Fault:
        """Make the next ``count`` requests matching (method, path regex) fail with ``code``."""
        fault = Fault(
            method=method.upper(), path=re.compile(path_regex), code=code, remaining=count,
            message=message, reason=reason or controls.reason_for(code),
        )  # fmt: skip
        self.faults.append(fault)
        return fault

    def hold_next(self, method: str, path_regex: str, count: int = 1) -> Hold:
        """Hold the next ``count`` requests matching (method, path regex) unanswered until the
        returned `Hold`'s ``release`` is set (``arrived``: one is held)."""
        hold = Hold(method=method.upper(), path=re.compile(path_regex), remaining=count)
        self.holds.append(hold)
        return hold

    def verbs_used(self, user_agent: str | None = None) -> set[tuple[str, str, str]]:
        """(api group, resource[/subresource], verb) of every audited resource request."""
        return {
            (r.api_group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource, r.verb)
            for r in self.audit
            if r.resource and (user_agent is None or user_agent in r.user_agent)
        }

    # HTTP -------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        info = parse_request(request.method, request.path, query)
        request[_INFO] = info
        code = 500
        try:
            hold = controls.take(self.holds, request.method, request.path_qs)
            if hold is not None:
                hold.arrived.set()
                await hold.release.wait()
            fault = controls.take(self.faults, request.method, request.path_qs)
            if fault is not None:
                raise ApiError(code=fault.code, reason=fault.reason, message=fault.message)
            request[_USER] = self._authenticate(request)
            response = await self._dispatch(request, info, query)
            code = response.status
            return response
        except ApiError as err:
            code = err.code
            return error_response(err)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # A bug of this server or a body it does not expect: answer as the apiserver does
            # for a panic (a 500 Status naming it) and log it, so the client's test fails
            # with the reason instead of a bare "Server got itself in trouble".
            _log.exception("kube_api_internal_error", path=request.path_qs)
            code = 500
            return error_response(
                ApiError(code=500, reason="InternalError", message=f"{type(exc).__name__}: {exc}")
            )
        finally:
            if not request.get(_AUDITED):
                self._record(request, code)

    def _authenticate(self, request: web.Request) -> UserInfo:
        """The user of the request's bearer token; anonymous without one; an unknown token is
        refused (401), as the real server's token authenticator does."""
        header = request.headers.get("Authorization", "")
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        user = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(code=401, reason="Unauthorized", message="Unauthorized")
        return user

    def _record(self, request: web.Request, code: int) -> None:
        """One audit record per request; a watch is recorded once its stream opens (so a test
        sees the watches that are still open)."""
        info = request[_INFO]
        request[_AUDITED] = True
        self.audit.append(
            AuditRecord(
                verb=info.verb,
                api_group=info.group,
                api_version=info.version,
                resource=info.resource,
                subresource=info.subresource,
                namespace=info.namespace,
                name=info.name,
                user_agent=request.headers.get("User-Agent", ""),
                method=request.method,
                path=request.path_qs,
                code=code,
            )
        )

    async def _dispatch(
        self, request: web.Request, info: RequestInfo, query: dict[str, str]
    ) -> web.StreamResponse:
        if not info.is_resource:
            return self._non_resource(request, info)
        rt = self.api.resolve(info.group, info.version, info.resource)
        if not rt.namespaced:
            if info.namespace and info.resource != "namespaces":
                raise errors.not_found(info.resource, info.group, info.name)
            info = dataclasses.replace(info, namespace="")  # namespaces/x names x, not a scope
        handler = _HANDLERS.get(info.verb)
        if handler is None:
            raise errors.method_not_allowed(f"the server does not allow this method: {info.verb}")
        return await handler(self, request, info, rt, query)

    def _non_resource(self, request: web.Request, info: RequestInfo) -> web.StreamResponse:
        path = info.path.rstrip("/")
        types = list(self.api.types.values())
        doc: dict[str, Any] | None
        if path == "/version":
            doc = discovery.version_info(self.settings.kubernetes_version)
        elif path == "/api":
            doc = discovery.api_versions(f"{self.settings.host}:{self.port}")
        elif path == "/apis":
            doc = discovery.api_groups(types)
        elif path == "/openapi/v3":
            doc = discovery.openapi_root(types)
        elif path.startswith("/openapi/v3/"):
            gv = path.removeprefix("/openapi/v3/").split("/")
            group, version = ("", gv[-1]) if gv[0] == "api" else (gv[1], gv[-1])
            doc = discovery.openapi_group_version(
                types, group, version, self.settings.kubernetes_version
            )
        elif path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        elif path == COMPACT_PATH and request.method == "POST":
            # A test control, not Kubernetes: compaction of a server running as a process.
            raw = request.query.get("rv", "")
            return json_response({"floor": self.compact(int(raw) if raw.isdigit() else None)})
        else:
            doc = self._group_doc(path, types)
        if doc is None:
            raise ApiError(
                code=404,
                reason="NotFound",
                message=f"the server could not find "
                f"the requested resource ({request.method} {path})",
            )
        return json_response(doc)

    @staticmethod
    def _group_doc(path: str, types: list[ResourceType]) -> dict[str, Any] | None:
        parts = [p for p in path.split("/") if p]
        if parts == ["api", "v1"]:
            return discovery.api_resources(types, "", "v1")
        if len(parts) == 2 and parts[0] == "apis":
            return discovery.api_groups(types, parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return discovery.api_resources(types, parts[1], parts[2])
        return None

    # verbs ------------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        if request.content_type in _UNDECODED:
            # A real server decodes these; this one answers as a server that does not, so
            # that the client falls back to JSON (client-go does, for 415).
            raise errors.unsupported_media_type(request.content_type)
        try:
            return _decode(raw)
        except msgspec.DecodeError:
            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise errors.bad_request(f"the request body does not decode: {exc}") from None

    def _out(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as version ``rt.version`` serves it (custom resources share storage
        across versions; no conversion webhook, only apiVersion changes)."""
        if obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    @staticmethod
    def _opts(request: web.Request, query: dict[str, str]) -> WriteOptions:
        return WriteOptions(
            strict=query.get("fieldValidation") == "Strict",
            dry_run=query.get("dryRun") == "All",
            user=request[_USER],
        )

    async def _get(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        self._check_sub(rt, info, ("status",))
        obj = self._out(rt, self.api.get(rt, info.namespace, info.name))
        if wants_table(request):
            return json_response(
                discovery.table(
                    rt,
                    [obj],
                    obj["metadata"]["resourceVersion"],
                    self.clock.now(),
                    query.get("includeObject", "Metadata"),
                )
            )
        return json_response(obj)

    def _selector_of(self, query: dict[str, str]) -> Any:
        try:
            return parse_labels(query.get("labelSelector")) & parse_fields(
                query.get("fieldSelector")
            )
        except SelectorError as exc:
            raise errors.bad_request(str(exc)) from None

    async def _list(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        selector = self._selector_of(query)
        ns = info.namespace if rt.namespaced and info.namespace else None
        cont = continued(query, self.store.floor)  # a later page: the first page's snapshot
        at = cont.rv if cont is not None else self.store.rv
        items = [self._out(rt, o) for o in self.api.select(rt, ns, selector, at)]
        meta: dict[str, Any] = {"resourceVersion": (rv := str(at))}
        items = page(items, query, meta, cont)
        if wants_table(request):
            return json_response(
                discovery.table(
                    rt, items, rv, self.clock.now(), query.get("includeObject", "Metadata")
                )
            )
        return json_response(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.api_version,
                "metadata": meta,
                "items": items,
            }
        )

    async def _create(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        body = await self._body(request)
        if info.subresource == "binding" or (rt.plural == "bindings"):
            return self._bind(info, body)
        if info.subresource == "eviction" and rt.key == ("", "v1", "pods"):
            self.api.evict(info.namespace, info.name, body)
            return json_response(success(201), 201)
        if info.name:
            raise errors.method_not_allowed("POST to a named object is not allowed")
        obj = self.api.create(rt, info.namespace, body, self._opts(request, query))
        return json_response(self._out(rt, obj), 201)

    def _bind(self, info: RequestInfo, body: Any) -> web.StreamResponse:
        name = info.name or ((body or {}).get("metadata") or {}).get("name", "")
        self.api.bind(info.namespace, name, body)
        # The real server answers a Binding with a Status, not the Binding (see the docs:
        # kubernetes_asyncio cannot deserialise it into V1Binding).
        return json_response(success(201), 201)

    @staticmethod
    def _check_sub(rt: ResourceType, info: RequestInfo, allowed: tuple[str, ...]) -> None:
        if info.subresource and (
            info.subresource not in allowed or info.subresource not in rt.subresources
        ):
            raise ApiError(
                code=404,
                reason="NotFound",
                message="the server could not find the requested resource",
            )

    async def _update(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        self._check_sub(rt, info, ("status",))
        body = await self._body(request)
        obj = self.api.update(
            rt,
            info.namespace,
            info.name,
            body,
            info.subresource or None,
            self._opts(request, query),
        )
        return json_response(self._out(rt, obj))

    async def _patch(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        self._check_sub(rt, info, ("status",))
        body = await self._body(request)
        content_type = request.content_type
        obj = self.api.patch(
            rt,
            info.namespace,
            info.name,
            content_type,
            body,
            info.subresource or None,
            self._opts(request, query),
        )
        return json_response(self._out(rt, obj))

    async def _delete(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        body = await self._body(request)
        obj = self.api.delete(
            rt, info.namespace, info.name, body if isinstance(body, dict) else None
        )
        return json_response(self._out(rt, obj))

    async def _delete_collection(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        selector = self._selector_of(query)
        ns = info.namespace if rt.namespaced and info.namespace else None
        items = []
        for obj in self.api.select(rt, ns, selector):
            meta = obj["metadata"]
            items.append(
                self._out(rt, self.api.delete(rt, meta.get("namespace", ""), meta["name"]))
            )
        return json_response(
            {
                "kind": rt.list_kind,
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": items,
            }
        )

    # watch ------------------------------------------------------------------------------
    async def _watch(
        self, request: web.Request, info: RequestInfo, rt: ResourceType, query: dict[str, str]
    ) -> web.StreamResponse:
        selector = self._selector_of(query)
        ns = info.namespace if rt.namespaced and info.namespace else None
        if info.name:  # a watch on one object is a field selector on its name
            selector = selector & parse_fields(f"metadata.name={info.name}")
        raw_rv = query.get("resourceVersion", "")
        initial = query.get("sendInitialEvents") in TRUE
        since = int(raw_rv) if raw_rv.isdigit() and raw_rv != "0" and not initial else None
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        response.enable_chunked_encoding()
        await response.prepare(request)
        self._record(request, 200)
        try:
            watcher = self.store.watch((rt.group, rt.plural), ns, selector, since)
        except ApiError as err:
            await response.write(encode({"type": "ERROR", "object": status_body(err)}) + b"\n")
            await response.write_eof()
            return response
        if initial:
            # The watch-list protocol (client-go's WatchListClient): the current objects, then
            # a bookmark that marks their end, then changes.
            watcher.push(("BOOKMARK", self._bookmark_object(rt, initial_end=True)))
        self._streams.add(response)
        try:
            await self._stream(response, watcher, rt, query)
        finally:
            self._streams.discard(response)
            self.store.unwatch(watcher)
        return response

    async def _stream(
        self, response: web.StreamResponse, watcher: Any, rt: ResourceType, query: dict[str, str]
    ) -> None:
        loop = asyncio.get_running_loop()
        timeout = query.get("timeoutSeconds", "")
        deadline = loop.time() + (
            float(timeout) if timeout.isdigit() else self.settings.watch_timeout_s
        )
        bookmarks = query.get("allowWatchBookmarks") in TRUE
        interval = self.settings.bookmark_interval_s if bookmarks else float("inf")
        next_bookmark = loop.time() + interval
        while (now := loop.time()) < deadline:
            try:
                item = await watcher.next(min(deadline, next_bookmark) - now)
            except TimeoutError:
                if loop.time() >= next_bookmark:
                    await response.write(self._bookmark(rt))
                    next_bookmark = loop.time() + interval
                continue
            if item is None:  # the server is stopping: cut the stream, no closing chunk
                return
            kind, obj = item
            await response.write(encode({"type": kind, "object": self._out(rt, obj)}) + b"\n")
        with contextlib.suppress(ConnectionError):
            await response.write_eof()

    def _bookmark(self, rt: ResourceType) -> bytes:
        # The watcher's queue is empty when this is written, so it has been sent every change
        # up to the store's revision: that is the bookmark's promise.
        return encode({"type": "BOOKMARK", "object": self._bookmark_object(rt)}) + b"\n"

    def _bookmark_object(self, rt: ResourceType, *, initial_end: bool = False) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}


_Handler = Callable[
    [KubeApiServer, web.Request, RequestInfo, ResourceType, dict[str, str]],
    Awaitable[web.StreamResponse],
]
_HANDLERS: dict[str, _Handler] = {
    "get": KubeApiServer._get,
    "list": KubeApiServer._list,
    "watch": KubeApiServer._watch,
    "create": KubeApiServer._create,
    "update": KubeApiServer._update,
    "patch": KubeApiServer._patch,
    "delete": KubeApiServer._delete,
    "deletecollection": KubeApiServer._delete_collection,
}
