"""The OIP gRPC servicer: the six portable RPCs of `inference.GRPCInferenceService`, and
Triton's ModelStreamInfer.

Owns: the binding of each RPC to the gateway (ServerLive and ServerMetadata are answered here,
ServerReady from the gateway's replicas, ModelReady / ModelMetadata / ModelInfer forwarded,
ModelStreamInfer proxied to one replica).
Must not: route, retry or convert tensors itself; `OipGateway` does. Triton's extensions (model
repository, statistics, shared memory, ...) stay UNIMPLEMENTED, the base class's answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import metadata as importlib_metadata
from typing import TYPE_CHECKING

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

if TYPE_CHECKING:  # the gateway builds its servicer: a runtime import would be circular
    from seedance.router.gateway.server import OipGateway

__all__ = ["OipServicer", "server_version"]


class OipServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The six portable OIP RPCs and streaming; Triton's other extensions stay UNIMPLEMENTED."""

    def __init__(self, gateway: OipGateway) -> None:
        self._gateway = gateway

    async def ServerLive(
        self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=self._gateway.any_ready())

    async def ServerMetadata(
        self, request: service_pb2.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ServerMetadataResponse:
        return service_pb2.ServerMetadataResponse(
            name="seedance-router", version=server_version(), extensions=[]
        )

    async def ModelReady(
        self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelReadyResponse:
        return await self._gateway.forward_simple(
            "ModelReady", request, context, model=request.name
        )

    async def ModelMetadata(
        self, request: service_pb2.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelMetadataResponse:
        response = await self._gateway.forward_simple(
            "ModelMetadata", request, context, model=request.name
        )
        return self._gateway.client_view(response)

    async def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        return await self._gateway.model_infer(request, context)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        # Closed at once when the client goes away (not whenever the loop finalises it), so the
        # stream's unanswered requests are reported when the stream ends.
        async with contextlib.aclosing(
            self._gateway.stream_infer(request_iterator, context)
        ) as responses:
            async for response in responses:
                yield response


def server_version() -> str:
    """The router's distribution version (ServerMetadata, ``GET /v2``)."""
    try:
        return importlib_metadata.version("seedance-gpu-router")
    except importlib_metadata.PackageNotFoundError:
        return "0"
