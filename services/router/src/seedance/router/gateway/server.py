"""The Open Inference Protocol (KServe v2) gRPC gateway in front of Triton replicas.

Owns: the gRPC server's lifecycle (the RPCs themselves are `servicer.py`'s, the settings
`settings.py`'s, the replicas, their health probes and warm-up `pool.py`'s), forwarding to the
replica a `ReplicaSelector` picks, the client's deadline carried upstream, retry on another
replica for failures `outcomes.py` calls safe, and per-model layout conversion.

A request reaches only replicas of the owner of its model: the tenant its tenant header names
(``x-seedance-tenant``; its registrations' replicas), or without the header the operator's
shared pool (the shared registrations and the configured list). The header selects whose model
is meant, it authenticates nobody: a replica can never serve another owner's model in its name.

Must not: decide routing policy (the selector does), retry what is not safe to retry, or change
a tensor that no layout declaration names. Requests are forwarded as the message received, with
`tritonclient.grpc`'s generated stub rather than `InferenceServerClient.infer`, because the
latter rebuilds a request from `InferInput` objects (typed contents and request parameters
would not survive) and turns gRPC status codes into strings, which retry decisions need intact.
The `inference.*` message classes are tritonclient's: protobuf allows one definition of a
symbol per process, and any process that uses tritonclient already has them (see
`proto/oip/README.md`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Self

import grpc
import structlog
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from seedance.core.clock import Clock, WallClock
from seedance.events.tokens import InvalidToken, check_tenant
from seedance.router.gateway.metrics import DecisionReason, GatewayMetrics
from seedance.router.gateway.outcomes import StatusClass, is_retryable, status_class
from seedance.router.gateway.pool import ReplicaPool
from seedance.router.gateway.ports import (
    ExplainingSelector,
    FinishedRequest,
    GatewayObserver,
    LeastOutstandingSelector,
    ReplicaSelector,
    RoutedRequest,
)
from seedance.router.gateway.replicas import CHANNEL_OPTIONS, Replica, ReplicaPhase
from seedance.router.gateway.servicer import OipServicer
from seedance.router.gateway.settings import GatewaySettings
from seedance.router.gateway.streams import StreamFailure, StreamRequest, proxy_stream
from seedance.router.gateway.tensors import (
    LayoutError,
    convert_request_layouts,
    convert_response_layouts,
    permute_shape,
)

__all__ = ["InferenceError", "OipGateway"]

_log = structlog.get_logger(__name__)

# Request parameters that make a request part of a stateful sequence: replaying it on another
# replica would start or advance a sequence that replica never saw, so it is never retried.
_SEQUENCE_PARAMETERS = frozenset({"sequence_id", "sequence_start", "sequence_end"})


class InferenceError(Exception):
    """A forwarded call's final failure, to be returned to the client as this gRPC status
    (the REST front maps it to an HTTP status)."""

    def __init__(self, code: grpc.StatusCode, details: str, replica: str | None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.replica = replica


class OipGateway:
    """An OIP gRPC server that forwards to Triton replicas.

    Usage: `async with OipGateway(settings, registry=registry) as gateway:` then clients
    connect to `gateway.address`. `start()` binds the port and begins warming the configured
    replicas; `wait_ready()` waits until they take traffic; `stop()` is idempotent.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        registry: CollectorRegistry,
        selector: ReplicaSelector | None = None,
        clock: Clock | None = None,
        observer: GatewayObserver | None = None,
    ) -> None:
        self._settings = settings
        self._selector: ReplicaSelector = selector or LeastOutstandingSelector()
        # Decided once: the isinstance check of a runtime protocol is too slow for every request.
        self._explainer = self._selector if isinstance(self._selector, ExplainingSelector) else None
        self._observer = observer
        # Only durations are read (the monotonic clock); tests pass a virtual one.
        self._monotonic_s = (clock or WallClock()).monotonic
        self._routes = {m.name: m for m in settings.models}
        self._metrics = GatewayMetrics(
            registry, models=self._routes.keys(), regions=settings.regions
        )
        self._pool = ReplicaPool(settings, metrics=self._metrics, monotonic_s=self._monotonic_s)
        self._server: grpc.aio.Server | None = None
        self._stopping = asyncio.Event()
        self._port: int | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """`host:port` the gateway listens on (after `start()`)."""
        if self._port is None:
            raise RuntimeError("gateway not started")
        host = self._settings.listen_address.rsplit(":", 1)[0]
        return f"{host}:{self._port}"

    async def start(self) -> None:
        if self._server is not None:
            return
        server = grpc.aio.server(options=list(CHANNEL_OPTIONS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(OipServicer(self), server)
        self._port = server.add_insecure_port(self._settings.listen_address)
        await server.start()
        self._server = server
        for name, address in self._settings.replicas.items():
            await self.add_replica(name, address)
        self._pool.start_probes()
        _log.info("gateway_started", address=self.address, replicas=len(self._pool))

    async def run(self) -> None:
        """Serve until `stop()`."""
        if self._server is None:
            await self.start()
        await self._stopping.wait()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (in-flight calls get `grace_s`), cancel warm-ups, close channels."""
        self._stopping.set()
        await self._pool.stop()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        await self._pool.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- replicas (the pool's; these are the gateway's public face of it) -------------------

    async def add_replica(
        self, name: str, address: str, *, models: frozenset[str] | None = None, owner: str = ""
    ) -> None:
        """Register a replica; it takes traffic once it answers ready and is warmed up.

        `models`: the models it may be sent (None: every model); only those are warmed up.
        `owner`: the tenant whose models those are ("": the shared pool's); it is sent only
        requests naming that tenant.
        """
        await self._pool.add(name, address, models=models, owner=owner)

    async def remove_replica(self, name: str) -> None:
        """Stop sending new requests to a replica and close its channel."""
        await self._pool.remove(name)

    async def drain_replica(self, name: str, *, timeout_s: float) -> bool:
        """Stop sending new requests to a replica, let its in-flight ones finish (at most
        `timeout_s`), then remove it. True if it emptied in time; after the timeout the rest
        are cut off by the channel's close, as `remove_replica` does."""
        return await self._pool.drain(name, timeout_s=timeout_s)

    def replica_models(self) -> dict[str, tuple[str, frozenset[str] | None]]:
        """Each registered replica's address and the models it may be sent (None: all)."""
        return self._pool.models()

    def replica_owners(self) -> dict[str, str]:
        """Each registered replica's owner (a tenant; "": the shared pool)."""
        return self._pool.owners()

    def replica_phases(self) -> dict[str, ReplicaPhase]:
        return self._pool.phases()

    def outstanding(self) -> dict[str, int]:
        return self._pool.outstanding()

    async def wait_ready(self, names: Sequence[str] | None = None, *, timeout_s: float) -> None:
        """Wait until the named replicas (default: all registered) take traffic.

        Raises TimeoutError naming the replicas still not ready.
        """
        await self._pool.wait_ready(names, timeout_s=timeout_s)

    # -- forwarding ------------------------------------------------------------------------

    def _pick(
        self, model: str, tried: set[str], request_id: str | None = None, owner: str = ""
    ) -> Replica | None:
        candidates = self._pool.candidates(tried, model, owner)
        reason: DecisionReason | str
        if not candidates:
            # After failed attempts this is "retries exhausted", already counted as failovers.
            if not tried:
                self._metrics.decision("no_ready_replica")
            return None
        if len(candidates) == 1:
            chosen = candidates[0]
            reason = "failover" if tried else "only_candidate"
        else:
            states = [r.state(model) for r in candidates]
            if self._explainer is not None:
                state, why = self._explainer.choose_explained(model, states)
            else:
                state, why = self._selector.choose(model, states), "selected"
            chosen = next(r for r in candidates if r.name == state.name)
            reason = "failover" if tried else why
        self._metrics.decision(reason)
        if self._observer is not None and request_id is not None:
            self._observer.routed(
                RoutedRequest(
                    model=model,
                    replica=chosen.name,
                    reason=reason,
                    request_id=request_id,
                    attempt=len(tried) + 1,
                    alternatives=tuple(r.name for r in candidates if r is not chosen),
                    at_s=self._monotonic_s(),
                    owner=owner,
                )
            )
        return chosen

    def _timeout_s(self, remaining: float | None) -> float:
        if remaining is None:
            return self._settings.default_timeout_s
        return min(remaining, self._settings.default_timeout_s)

    async def _forward(
        self,
        *,
        model: str,
        request: Message,
        call: Callable[[Replica, Message, float], Awaitable[Message]],
        remaining: Callable[[], float | None],
        retry_safe: bool,
        on_first_send: Callable[[], None] | None = None,
        request_id: str | None = None,
        owner: str = "",
        chosen: list[str],
    ) -> tuple[Message, Replica]:
        """Send `request` to a chosen replica of `owner` ("": the shared pool), failing over
        while the failure is retryable.

        `request_id` is given for inference requests only: those are what the observer sees.
        `chosen` gets each replica's name as it is chosen. It is the caller's so that a call
        cancelled in here (no value returns) still names the replica that was working on it.
        """
        tried: set[str] = set()
        last: InferenceError | None = None
        while len(tried) < self._settings.max_attempts:
            replica = self._pick(model, tried, request_id, owner)
            if replica is None:
                break
            chosen.append(replica.name)
            if on_first_send is not None and not tried:
                on_first_send()
            timeout_s = self._timeout_s(remaining())
            if timeout_s <= 0:
                raise InferenceError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", None)
            tried.add(replica.name)
            replica.begin(model)
            self._metrics.outstanding(replica=replica.name, count=replica.outstanding)
            start_s = self._monotonic_s()
            latency_s: float | None = None
            try:
                response = await call(replica, request, timeout_s)
                latency_s = self._monotonic_s() - start_s
            except asyncio.CancelledError:
                # The client cancelled or its deadline passed: grpc cancels this handler, and
                # with it the upstream call, so the replica stops working for nobody.
                self._metrics.attempt(replica=replica.name, status="cancelled")
                raise
            except grpc.aio.AioRpcError as error:
                code = error.code()
                self._metrics.attempt(replica=replica.name, status=status_class(code))
                last = InferenceError(code, error.details() or code.name, replica.name)
                if not is_retryable(code):
                    raise last from None
                # The replica could not take the request: keep new requests off it until a
                # probe finds it ready again (then it is warmed up before it returns).
                await self._pool.set_phase(replica, ReplicaPhase.EJECTED)
                _log.warning("upstream_unavailable", replica=replica.name, model=model)
                if not retry_safe:
                    raise last from None
                continue
            finally:
                replica.end(model, latency_s=latency_s)
                self._metrics.outstanding(replica=replica.name, count=replica.outstanding)
            self._metrics.attempt(replica=replica.name, status="ok")
            return response, replica
        if last is not None:
            raise last
        raise InferenceError(grpc.StatusCode.UNAVAILABLE, _no_replica(model, owner), None)

    def region_of(self, context: grpc.aio.ServicerContext) -> str | None:
        return _header(context, self._settings.region_header)

    def tenant_of(self, context: grpc.aio.ServicerContext) -> str | None:
        return _header(context, self._settings.tenant_header)

    def owner_of(self, tenant: str | None) -> str:
        """Whose replicas a request naming ``tenant`` (its tenant header) may reach: that
        tenant's, or without one the shared pool's (""). Raises `InferenceError`
        (INVALID_ARGUMENT) naming a value that is no tenant id."""
        if not tenant:
            return ""
        try:
            return check_tenant(tenant)
        except InvalidToken as exc:
            header = self._settings.tenant_header
            raise InferenceError(
                grpc.StatusCode.INVALID_ARGUMENT, f"header {header}: {exc}", None
            ) from None

    def _done(
        self,
        *,
        model: str,
        replica: str | None,
        status: StatusClass,
        region: str | None,
        duration_s: float,
        owner: str,
        routed: bool,
    ) -> None:
        self._metrics.request_done(
            model=model, replica=replica, status=status, region=region, duration_s=duration_s
        )
        if self._observer is not None:
            self._observer.finished(
                FinishedRequest(
                    model=model,
                    replica=replica,
                    status=status,
                    duration_s=duration_s,
                    owner=owner,
                    routed=routed,
                )
            )

    @property
    def region_header(self) -> str:
        return self._settings.region_header

    @property
    def tenant_header(self) -> str:
        return self._settings.tenant_header

    async def model_infer(
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        """The gRPC ModelInfer: `infer`, its failure returned as the gRPC status."""
        try:
            return await self.infer(
                request,
                region=self.region_of(context),
                remaining=context.time_remaining,
                tenant=self.tenant_of(context),
            )
        except InferenceError as failure:
            await context.abort(failure.code, failure.details)
            raise AssertionError("unreachable: abort raises") from None

    async def infer(
        self,
        request: service_pb2.ModelInferRequest,
        *,
        region: str | None,
        remaining: Callable[[], float | None],
        tenant: str | None = None,
    ) -> service_pb2.ModelInferResponse:
        """Route one inference request (gRPC or REST alike) to a replica of the model's owner
        (``tenant``, the tenant header: `owner_of`): layouts, choice, failover, metrics.
        Raises `InferenceError` with the status the client gets."""
        arrival_s = self._monotonic_s()
        model = request.model_name
        route = self._routes.get(model)
        # Every replica chosen for it, in order: whatever ends the call, its outcome is reported
        # with the last (a client's cancel while a replica works is that model's miss too).
        chosen: list[str] = []
        owner = ""  # until the header is read (a bad one is a client error: no SLO outcome)

        def done(status: StatusClass, replica: str | None) -> None:
            self._done(
                model=model, replica=replica, status=status, region=region, owner=owner,
                duration_s=self._monotonic_s() - arrival_s, routed=bool(chosen),
            )  # fmt: skip

        try:
            owner = self.owner_of(tenant)
            if route is not None and route.input_layouts:
                try:
                    convert_request_layouts(request, route.input_layouts)
                except LayoutError as error:
                    raise InferenceError(
                        grpc.StatusCode.INVALID_ARGUMENT, str(error), None
                    ) from None
            retry_safe = not (_SEQUENCE_PARAMETERS & set(request.parameters.keys()))

            def queued() -> None:
                self._metrics.queued(model=model, duration_s=self._monotonic_s() - arrival_s)

            response, replica = await self._forward(
                model=model,
                request=request,
                call=lambda r, req, t: r.stub.ModelInfer(req, timeout=t),
                remaining=remaining,
                retry_safe=retry_safe,
                on_first_send=queued,
                request_id=request.id,
                owner=owner,
                chosen=chosen,
            )
            if route is not None and route.output_layouts:
                convert_response_layouts(response, route.output_layouts)
        except asyncio.CancelledError:
            done("cancelled", chosen[-1] if chosen else None)
            raise
        except InferenceError as failure:
            done(status_class(failure.code), failure.replica)
            raise
        done("ok", replica.name)
        return response

    async def forward_simple(
        self, method: str, request: Message, context: grpc.aio.ServicerContext, *, model: str
    ) -> Any:
        """ModelReady / ModelMetadata: answered by any ready replica, failing over."""
        try:
            return await self.call_simple(
                method, request, model=model, remaining=context.time_remaining,
                tenant=self.tenant_of(context),
            )  # fmt: skip
        except InferenceError as failure:
            await context.abort(failure.code, failure.details)
            raise AssertionError("unreachable: abort raises") from None

    async def call_simple(
        self,
        method: str,
        request: Message,
        *,
        model: str,
        remaining: Callable[[], float | None],
        tenant: str | None = None,
    ) -> Any:
        """`forward_simple` without a gRPC context; raises `InferenceError`."""
        response, _ = await self._forward(
            model=model,
            request=request,
            call=lambda r, req, t: getattr(r.stub, method)(req, timeout=t),
            remaining=remaining,
            retry_safe=True,
            owner=self.owner_of(tenant),
            chosen=[],
        )
        return response

    async def stream_infer(
        self,
        requests: AsyncIterator[service_pb2.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncGenerator[service_pb2.ModelStreamInferResponse]:
        """ModelStreamInfer, proxied to one replica chosen for the stream's first request.

        A stream is stateful (a decoupled model answers many responses per request), so it is
        never failed over: an upstream failure ends the stream with the upstream's status. A
        backend that does not serve streaming answers UNIMPLEMENTED, passed on with words.
        Every request on it is an arrival and, at its first response, an outcome (`streams`).
        The owner is the call's tenant header, one per stream; a later request whose model the
        stream's replica may not be sent, or whose id is still in use, ends it INVALID_ARGUMENT.
        """
        first = await anext(aiter(requests), None)
        if first is None:
            return
        head = StreamRequest(
            model=first.model_name, request_id=first.id, arrival_s=self._monotonic_s()
        )
        region = self.region_of(context)
        owner, routed = "", False

        def done(request: StreamRequest, status: StatusClass, duration_s: float) -> None:
            self._done(
                model=request.model, replica=replica.name if routed else None, status=status,
                region=region, duration_s=duration_s, owner=owner, routed=routed,
            )  # fmt: skip

        def follows(request: StreamRequest) -> None:
            # Not a decision (the stream's replica takes it), so no decision metric.
            if self._observer is not None:
                self._observer.routed(
                    RoutedRequest(
                        model=request.model, replica=replica.name, reason="stream",
                        request_id=request.request_id, attempt=1, alternatives=(),
                        at_s=request.arrival_s, owner=owner,
                    )
                )  # fmt: skip

        try:
            owner = self.owner_of(self.tenant_of(context))
            picked = self._open_stream(first, owner)
        except InferenceError as failure:
            done(head, status_class(failure.code), self._monotonic_s() - head.arrival_s)
            await context.abort(failure.code, failure.details)
            raise AssertionError("unreachable: abort raises") from None
        replica, routed = picked, True
        try:
            responses = proxy_stream(
                head, first, requests, replica=replica, owner=owner, routes=self._routes,
                timeout_s=context.time_remaining(), monotonic_s=self._monotonic_s,
                routed=follows, done=done,
            )  # fmt: skip
            async with contextlib.aclosing(responses):
                async for response in responses:
                    yield response
        except StreamFailure as failure:
            await context.abort(failure.code, failure.details)

    def _open_stream(self, first: service_pb2.ModelInferRequest, owner: str) -> Replica:
        """The replica for a stream, chosen for its first request (converted first, as a
        ModelInfer request is before its choice). Raises `InferenceError`."""
        route = self._routes.get(first.model_name)
        if route is not None and route.input_layouts:
            try:
                convert_request_layouts(first, route.input_layouts)
            except LayoutError as error:
                raise InferenceError(grpc.StatusCode.INVALID_ARGUMENT, str(error), None) from None
        replica = self._pick(first.model_name, set(), first.id, owner)
        if replica is None:
            raise InferenceError(
                grpc.StatusCode.UNAVAILABLE, _no_replica(first.model_name, owner), None
            )
        return replica

    def client_view(
        self, metadata: service_pb2.ModelMetadataResponse
    ) -> service_pb2.ModelMetadataResponse:
        """Model metadata with converted tensors' shapes in the client's layout."""
        route = self._routes.get(metadata.name)
        if route is None:
            return metadata
        for tensors, conversions in (
            (metadata.inputs, route.input_layouts),
            (metadata.outputs, route.output_layouts),
        ):
            by_name = {c.tensor: c for c in conversions}
            for tensor in tensors:
                conversion = by_name.get(tensor.name)
                if conversion is not None and len(tensor.shape) == len(conversion.client_layout):
                    shape = permute_shape(tensor.shape, conversion.to_client())
                    del tensor.shape[:]
                    tensor.shape.extend(shape)
        return metadata

    def any_ready(self) -> bool:
        return bool(self._pool.candidates(set(), None))


def _header(context: grpc.aio.ServicerContext, header: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == header:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def _no_replica(model: str, owner: str) -> str:
    whose = f"tenant {owner}'s" if owner else "the shared pool's"
    return f"no ready replica of {whose} model {model!r}"
