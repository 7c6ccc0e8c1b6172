"""ModelStreamInfer: the later requests a stream refuses (review-1 findings 3 and 4), against
in-process fake replicas: a model its replica may not be sent, whoever's tenant header opened
it, and an id an earlier request on it still holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from seedance.router.gateway import (
    FinishedRequest,
    GatewaySettings,
    ModelRoute,
    OipGateway,
    RoutedRequest,
)
from tests.unit.router.test_gateway_fake_upstream import (
    FakeReplica,
    _read_to_the_end,
    _request,
)


class Seen:
    """What the gateway's observer was told."""

    def __init__(self) -> None:
        self.routed: list[RoutedRequest] = []
        self.finished: list[FinishedRequest] = []

    def routed_(self, request: RoutedRequest) -> None:
        self.routed.append(request)

    def finished_(self, request: FinishedRequest) -> None:
        self.finished.append(request)


def _observer(seen: Seen) -> object:
    class Observer:
        def routed(self, request: RoutedRequest) -> None:
            seen.routed_(request)

        def finished(self, request: FinishedRequest) -> None:
            seen.finished_(request)

    return Observer()


class Tokens(FakeReplica):
    """A decoupled model: each request answered with two tokens, the second flagged
    `triton_final_response` when `flag_final`; records every request it is sent."""

    def __init__(self, *, flag_final: bool = False) -> None:
        super().__init__()
        self.flag_final = flag_final
        self.streamed: list[tuple[str, str]] = []

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for request in request_iterator:
            self.streamed.append((request.model_name, request.id))
            for token in range(2):
                response = service_pb2.ModelInferResponse(
                    model_name=request.model_name, id=request.id
                )
                if self.flag_final:
                    response.parameters["triton_final_response"].bool_param = token == 1
                yield service_pb2.ModelStreamInferResponse(infer_response=response)


def _settings(replicas: dict[str, str]) -> GatewaySettings:
    return GatewaySettings(
        replicas=replicas,
        models=(ModelRoute(name="m", warm_up=False), ModelRoute(name="n", warm_up=False)),
        probe_interval_s=30.0,
    )


def _named(request_id: str, model: str) -> service_pb2.ModelInferRequest:
    request = _request(request_id)
    request.model_name = model
    return request


async def _stream(
    gateway: OipGateway,
    first: service_pb2.ModelInferRequest,
    later: list[service_pb2.ModelInferRequest],
    tenant: str | None = None,
) -> tuple[list[str], grpc.aio.AioRpcError | None]:
    """Send `first` on a stream, read its two tokens, then send `later`: the ids of every
    response read and the status the stream ended with (None: it ended OK)."""
    metadata = (("x-seedance-tenant", tenant),) if tenant is not None else None
    queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()

    async def requests():  # type: ignore[no-untyped-def]
        while (request := await queue.get()) is not None:
            yield request

    got: list[str] = []
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), timeout=10, metadata=metadata)
        queue.put_nowait(first)
        got.extend([(await call.read()).infer_response.id for _ in range(2)])
        for request in [*later, None]:
            queue.put_nowait(request)
        try:
            while (response := await call.read()) is not grpc.aio.EOF:
                got.append(response.infer_response.id)
        except grpc.aio.AioRpcError as error:
            return got, error
    return got, None


@pytest.fixture
async def replicas() -> AsyncIterator[dict[str, Tokens]]:
    fakes = {"s": Tokens(), "t": Tokens()}
    for fake in fakes.values():
        await fake.start()
    yield fakes
    for fake in fakes.values():
        await fake.stop()


async def test_a_later_request_for_a_model_its_replica_may_not_be_sent_is_refused(
    replicas: dict[str, Tokens],
) -> None:
    # 's' may be sent only "m", 't' only "n": a stream opened with "m" then names "n".
    seen = Seen()
    s, t = replicas["s"], replicas["t"]
    async with OipGateway(
        _settings({}), registry=CollectorRegistry(), observer=_observer(seen)
    ) as gw:
        await gw.add_replica("s", s.address, models=frozenset({"m"}))
        await gw.add_replica("t", t.address, models=frozenset({"n"}))
        await gw.wait_ready(["s", "t"], timeout_s=10)
        got, error = await _stream(gw, _request("first"), [_named("second", "n")])
        assert sum(gw.outstanding().values()) == 0
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "model 'n' is not served by this stream's replica 's'" in (error.details() or "")
    assert s.streamed == [("m", "first")]
    assert t.streamed == []
    assert got == ["first", "first"]
    assert [(r.model, r.replica) for r in seen.routed] == [("m", "s")]
    # "n" is the client's error, unrouted on 's': no outcome of "n" counted on a replica of "m"
    assert [(f.model, f.status, f.replica) for f in seen.finished] == [
        ("m", "ok", "s"),
        ("n", "client_error", "s"),
    ]


async def test_a_later_request_for_a_model_its_replica_serves_stays_on_the_stream(
    replicas: dict[str, Tokens],
) -> None:
    # Triton lets a stream carry several models: where the replica may be sent both, it does.
    seen = Seen()
    s = replicas["s"]
    async with OipGateway(
        _settings({}), registry=CollectorRegistry(), observer=_observer(seen)
    ) as gw:
        await gw.add_replica("s", s.address, models=frozenset({"m", "n"}))
        await gw.wait_ready(["s"], timeout_s=10)
        got, error = await _stream(gw, _request("first"), [_named("second", "n")])
    assert error is None
    assert s.streamed == [("m", "first"), ("n", "second")]
    assert got == ["first", "first", "second", "second"]
    assert [(f.model, f.status) for f in seen.finished] == [("m", "ok"), ("n", "ok")]


async def test_a_tenants_stream_cannot_reach_the_shared_pool_with_a_later_request(
    replicas: dict[str, Tokens],
) -> None:
    # globex's replica serves its "m"; the shared pool's 't' serves "n". A stream opened as
    # globex stays globex's: its "n" is refused (the header is the call's, read once), never
    # sent to the shared pool, never counted as the shared pool's.
    seen = Seen()
    s, t = replicas["s"], replicas["t"]
    async with OipGateway(
        _settings({}), registry=CollectorRegistry(), observer=_observer(seen)
    ) as gw:
        await gw.add_replica("globex/s", s.address, models=frozenset({"m"}), owner="globex")
        await gw.add_replica("t", t.address)
        await gw.wait_ready(["globex/s", "t"], timeout_s=10)
        _, error = await _stream(
            gw, _request("first"), [_named("second", "n"), _request("third")], tenant="globex"
        )
    assert error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert "model 'n' is not served by this stream's replica 'globex/s' (tenant globex's)" in (
        details
    )
    assert s.streamed == [("m", "first")]
    assert t.streamed == []
    assert {r.owner for r in seen.routed} == {"globex"}
    assert [(f.model, f.status, f.owner) for f in seen.finished] == [
        ("m", "ok", "globex"),
        ("n", "client_error", "globex"),
    ]


class ReusedIds(FakeReplica):
    """A decoupled model: answers its first request's first token, then, once the second request
    has come, that first request's second token; the second request is never answered."""

    async def ModelStreamInfer(self, request_iterator, context):  # type: ignore[no-untyped-def]
        requests = aiter(request_iterator)
        first = await anext(requests)
        yield service_pb2.ModelStreamInferResponse(
            infer_response=service_pb2.ModelInferResponse(model_name="m", id=first.id)
        )
        await anext(requests)  # the second request is here
        yield service_pb2.ModelStreamInferResponse(
            infer_response=service_pb2.ModelInferResponse(model_name="m", id=first.id)
        )
        await asyncio.Event().wait()  # until the stream ends


async def test_a_request_reusing_an_id_still_held_is_refused_not_finished_by_a_later_token() -> (
    None
):
    # Triton allows duplicate ids; the first "x"'s second token would have "finished" the
    # second "x" (a false ok). The second "x" is refused instead, naming the id.
    replica = ReusedIds()
    await replica.start()
    seen = Seen()
    try:
        async with OipGateway(
            _settings({"s": replica.address}), registry=CollectorRegistry(),
            observer=_observer(seen),
        ) as gw:  # fmt: skip
            await gw.wait_ready(timeout_s=10)
            queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()

            async def requests():  # type: ignore[no-untyped-def]
                while (request := await queue.get()) is not None:
                    yield request

            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelStreamInfer(requests(), timeout=10)
                queue.put_nowait(_request("x"))
                assert (await call.read()).infer_response.id == "x"
                queue.put_nowait(_request("x"))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _read_to_the_end(call)
            assert sum(gw.outstanding().values()) == 0
    finally:
        await replica.stop()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request id 'x' is still in use on this stream" in (caught.value.details() or "")
    assert [(f.status, f.duration_s >= 0) for f in seen.finished] == [
        ("ok", True),
        ("client_error", True),
    ]


async def test_an_id_is_free_again_once_its_final_response_came() -> None:
    replica = Tokens(flag_final=True)
    await replica.start()
    seen = Seen()
    try:
        async with OipGateway(
            _settings({"s": replica.address}), registry=CollectorRegistry(),
            observer=_observer(seen),
        ) as gw:  # fmt: skip
            await gw.wait_ready(timeout_s=10)
            queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()

            async def requests():  # type: ignore[no-untyped-def]
                while (request := await queue.get()) is not None:
                    yield request

            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelStreamInfer(requests(), timeout=10)
                for _ in range(2):  # the same id, after its final response
                    queue.put_nowait(_request("x"))
                    for _ in range(2):
                        assert (await call.read()).infer_response.id == "x"
                queue.put_nowait(None)
                assert await call.read() is grpc.aio.EOF
    finally:
        await replica.stop()
    assert replica.streamed == [("m", "x"), ("m", "x")]
    assert [f.status for f in seen.finished] == ["ok", "ok"]
