"""The KServe v2 (Open Inference Protocol) REST front of the gateway, beside its gRPC one.

Owns: an aiohttp server with the protocol's health, metadata and inference endpoints
(``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{m}``,
``/v2/models/{m}/ready``, ``POST /v2/models/{m}/infer``) and the HTTP status of each outcome.

Every malformed body is answered 400 with the reason as the protocol's ``{"error": ...}``
(a body over aiohttp's size limit 413), never 500: the translation names what is wrong, and a
JSON document nested too deep for the decoder is refused here.

Must not: route, retry or talk to a replica itself. Every request is translated
(`rest_tensors.py`) into the same gRPC message a gRPC client would send and handed to the same
`OipGateway` methods, so the routing policy, failover, layouts, metrics and the observer (the
forecaster's arrivals, the bus's decisions) see REST and gRPC traffic alike; replicas are
reached over gRPC only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import msgspec
import structlog
from aiohttp import web
from tritonclient.grpc import service_pb2

from seedance.router.gateway.rest_tensors import (
    RestRequestError,
    infer_request_from_json,
    infer_response_to_json,
    metadata_to_json,
)
from seedance.router.gateway.server import InferenceError, OipGateway
from seedance.router.gateway.servicer import server_version

__all__ = ["RestGateway", "http_status"]

_log = structlog.get_logger(__name__)

_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

_JSON = "application/json"


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status a REST client gets for a gRPC outcome (others: 500)."""
    return _HTTP_STATUS.get(code, 500)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type=_JSON)


def _error(message: str, status: int) -> web.Response:
    # The protocol's error body: {"error": "<message>"}.
    return _json({"error": message}, status)


def _no_deadline() -> float | None:
    return None  # HTTP carries no deadline: the gateway's default timeout bounds the call


class RestGateway:
    """`OipGateway`'s REST front. `start()` binds `listen_address` (``host:port``, port 0 for
    any); `address` is where it listens; `stop()` is idempotent."""

    def __init__(self, gateway: OipGateway, *, listen_address: str) -> None:
        self._gateway = gateway
        self._listen_address = listen_address
        self._runner: web.AppRunner | None = None
        self._address: str | None = None

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("REST gateway not started")
        return self._address

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/v2", self._server_metadata),
                web.get("/v2/health/live", self._live),
                web.get("/v2/health/ready", self._ready),
                web.get("/v2/models/{model}", self._model_metadata),
                web.get("/v2/models/{model}/ready", self._model_ready),
                web.post("/v2/models/{model}/infer", self._infer),
                # The versioned forms of the same endpoints; the version is passed on.
                web.get("/v2/models/{model}/versions/{version}", self._model_metadata),
                web.get("/v2/models/{model}/versions/{version}/ready", self._model_ready),
                web.post("/v2/models/{model}/versions/{version}/infer", self._infer),
            ]
        )
        return app

    async def start(self) -> None:
        if self._runner is not None:
            return
        host, _, port = self._listen_address.rpartition(":")
        # auto_decompress off: aiohttp would inflate a compressed body as it arrives, on this
        # event loop (the router's gRPC front and its bus loops share it), before any size
        # limit applies: 1 MB of deflate made 1 GiB and stalled every other request for
        # seconds. Compressed bodies are refused instead (`_infer`).
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, auto_decompress=False
        )
        await runner.setup()
        site = web.TCPSite(runner, host or "0.0.0.0", int(port))
        await site.start()
        self._runner = runner
        bound = runner.addresses[0]
        self._address = f"{host or '0.0.0.0'}:{bound[1]}"
        _log.info("rest_gateway_started", address=self._address)

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # -- handlers --------------------------------------------------------------------------

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return _json({"name": "seedance-router", "version": server_version(), "extensions": []})

    async def _live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def _ready(self, request: web.Request) -> web.Response:
        ready = self._gateway.any_ready()
        return _json({"ready": ready}, 200 if ready else 503)

    async def _forwarded(self, call: Callable[[], Awaitable[web.Response]]) -> web.Response:
        try:
            return await call()
        except InferenceError as failure:
            return _error(failure.details, http_status(failure.code))

    async def _model_metadata(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        message = service_pb2.ModelMetadataRequest(
            name=model, version=request.match_info.get("version", "")
        )

        async def call() -> web.Response:
            response = await self._gateway.call_simple(
                "ModelMetadata", message, model=model, remaining=_no_deadline,
                tenant=request.headers.get(self._gateway.tenant_header),
            )  # fmt: skip
            return _json(metadata_to_json(self._gateway.client_view(response)))

        return await self._forwarded(call)

    async def _model_ready(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        message = service_pb2.ModelReadyRequest(
            name=model, version=request.match_info.get("version", "")
        )

        async def call() -> web.Response:
            response = await self._gateway.call_simple(
                "ModelReady", message, model=model, remaining=_no_deadline,
                tenant=request.headers.get(self._gateway.tenant_header),
            )  # fmt: skip
            ready = bool(response.ready)
            return _json({"name": model, "ready": ready}, 200 if ready else 503)

        return await self._forwarded(call)

    async def _infer(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return _error(
                f"Content-Encoding {encoding[:40]!r} is not accepted: send the JSON body "
                "uncompressed (a compressed body is never inflated here)",
                415,
            )
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:  # aiohttp's client_max_size
            return _error(f"the request body is too large: {exc.text}", exc.status)
        try:
            body = msgspec.json.decode(raw)
            message = infer_request_from_json(model, body)
        except msgspec.DecodeError as exc:
            return _error(f"the request body is not JSON: {exc}", 400)
        except RecursionError:
            # msgspec's decoder recurses per nesting level and gives up near Python's limit
            return _error("the request body nests too deep to be a v2 inference request", 400)
        except RestRequestError as exc:
            return _error(str(exc), 400)
        message.model_version = request.match_info.get("version", "")
        region = request.headers.get(self._gateway.region_header)
        tenant = request.headers.get(self._gateway.tenant_header)

        async def call() -> web.Response:
            response = await self._gateway.infer(
                message, region=region, remaining=_no_deadline, tenant=tenant
            )
            return _json(infer_response_to_json(response))

        return await self._forwarded(call)
