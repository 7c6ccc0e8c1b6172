"""The gateway's forwarding shell against in-process fake OIP servers (fast, fault injection).

The fakes are `tritonclient`'s generated servicer with a few lines of behaviour: they record
each call's remaining deadline, and fail on demand. Real Triton is in tests/integration/router.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from seedance.router.gateway import (
    FinishedRequest,
    GatewaySettings,
    LayoutConversion,
    ModelRoute,
    OipGateway,
    ReplicaPhase,
    RoutedRequest,
    WarmupPolicy,
)
from seedance.testing.waits import eventually


class FakeReplica(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, fail_with: grpc.StatusCode | None = None) -> None:
        self.fail_with = fail_with
        self.calls: list[float | None] = []  # remaining deadline seen by each ModelInfer
        self.warmup_calls = 0
        # When set, traffic (not warm-up) waits for it: a request held in flight.
        self.gate: asyncio.Event | None = None
        self.server: grpc.aio.Server | None = None
        self.address = ""

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelMetadata(self, request, context):
        response = service_pb2.ModelMetadataResponse(name=request.name, platform="fake")
        response.inputs.add(name="x", datatype="FP32", shape=[-1, 2])
        response.outputs.add(name="y", datatype="FP32", shape=[-1, 2])
        return response

    async def ModelInfer(self, request, context):
        if request.id == "":
            self.warmup_calls += 1
        else:
            self.calls.append(context.time_remaining())
            if self.gate is not None:
                await self.gate.wait()
            if self.fail_with is not None:
                await context.abort(self.fail_with, "injected")
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        response.outputs.add(name="y", datatype="FP32", shape=list(request.inputs[0].shape))
        response.raw_output_contents.append(request.raw_input_contents[0])
        return response

    async def start(self) -> None:
        self.server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)


@pytest.fixture
async def fakes() -> AsyncIterator[dict[str, FakeReplica]]:
    replicas = {"a": FakeReplica(), "b": FakeReplica()}
    for replica in replicas.values():
        await replica.start()
    yield replicas
    for replica in replicas.values():
        await replica.stop()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def gateway(
    fakes: dict[str, FakeReplica], registry: CollectorRegistry
) -> AsyncIterator[OipGateway]:
    settings = GatewaySettings(
        replicas={name: f.address for name, f in fakes.items()},
        models=(ModelRoute(name="m"),),
        default_timeout_s=7.0,
        probe_interval_s=30.0,  # no probe re-admits an ejected fake during a test
        warmup=WarmupPolicy(window=2, tolerance=10.0, min_requests=4, max_requests=8),
    )
    async with OipGateway(settings, registry=registry) as gw:
        await gw.wait_ready(timeout_s=10)
        yield gw


def _request(request_id: str, **parameters: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m", id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.array([[1.0, 2.0]], dtype="<f4").tobytes())
    for key, value in parameters.items():
        request.parameters[key].int64_param = value
    return request


async def _infer(
    gateway: OipGateway, request: service_pb2.ModelInferRequest, timeout_s: float | None = 5.0
) -> service_pb2.ModelInferResponse:
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return await stub.ModelInfer(request, timeout=timeout_s)


async def test_warm_up_runs_before_traffic(
    fakes: dict[str, FakeReplica], gateway: OipGateway
) -> None:
    assert all(f.warmup_calls >= 4 for f in fakes.values())
    assert all(f.calls == [] for f in fakes.values())


async def test_unavailable_fails_over_and_ejects(
    fakes: dict[str, FakeReplica], gateway: OipGateway, registry: CollectorRegistry
) -> None:
    fakes["a"].fail_with = grpc.StatusCode.UNAVAILABLE  # least-outstanding tie -> "a" first
    response = await _infer(gateway, _request("r1"))
    assert response.id == "r1"
    assert len(fakes["a"].calls) == 1
    assert len(fakes["b"].calls) == 1
    assert gateway.replica_phases()["a"] is ReplicaPhase.EJECTED
    assert registry.get_sample_value("seedance_router_decisions_total", {"reason": "failover"}) == 1
    # The ejected replica gets nothing more.
    await _infer(gateway, _request("r2"))
    assert len(fakes["a"].calls) == 1


async def test_invalid_argument_is_not_retried(
    fakes: dict[str, FakeReplica], gateway: OipGateway
) -> None:
    for fake in fakes.values():
        fake.fail_with = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _infer(gateway, _request("bad"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sum(len(f.calls) for f in fakes.values()) == 1
    assert gateway.replica_phases() == {"a": ReplicaPhase.READY, "b": ReplicaPhase.READY}


async def test_sequence_requests_are_not_replayed_elsewhere(
    fakes: dict[str, FakeReplica], gateway: OipGateway
) -> None:
    fakes["a"].fail_with = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _infer(gateway, _request("seq", sequence_id=42))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert len(fakes["b"].calls) == 0


async def test_client_deadline_reaches_the_replica(
    fakes: dict[str, FakeReplica], gateway: OipGateway
) -> None:
    await _infer(gateway, _request("d1"), timeout_s=0.8)
    await _infer(gateway, _request("d2"), timeout_s=None)
    seen = [t for f in fakes.values() for t in f.calls]
    assert len(seen) == 2
    with_deadline, without = seen if seen[0] is not None and seen[0] < 1 else seen[::-1]
    # grpc-timeout travels in coarse units, rounded up: allow 2 % above the set value.
    assert with_deadline is not None
    assert 0 < with_deadline <= 0.8 * 1.02
    # No client deadline: the gateway's default (7 s) bounds the upstream call.
    assert without is not None
    assert 1.0 < without <= 7.0 * 1.02


async def test_no_ready_replica_is_unavailable(
    fakes: dict[str, FakeReplica], gateway: OipGateway, registry: CollectorRegistry
) -> None:
    for fake in fakes.values():
        fake.fail_with = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _infer(gateway, _request("x"))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await _infer(gateway, _request("y"))
    assert again.value.details() == "no ready replica of the shared pool's model 'm'"
    assert (
        registry.get_sample_value("seedance_router_decisions_total", {"reason": "no_ready_replica"})
        == 1
    )


async def test_a_drained_replica_finishes_in_flight_requests_and_takes_no_new_ones(
    fakes: dict[str, FakeReplica], gateway: OipGateway
) -> None:
    fakes["a"].gate = asyncio.Event()
    held = asyncio.create_task(_infer(gateway, _request("r1")))  # the tie goes to "a"
    await eventually(lambda: bool(fakes["a"].calls), 5, what="r1 reached replica a")
    drain = asyncio.create_task(gateway.drain_replica("a", timeout_s=5.0))
    await eventually(
        lambda: gateway.replica_phases().get("a") is ReplicaPhase.DRAINING,
        5,
        what="replica a draining",
    )
    await _infer(gateway, _request("r2"))
    assert len(fakes["b"].calls) == 1  # the new request went to "b"
    assert not drain.done()  # "a" still holds r1
    fakes["a"].gate.set()
    assert (await held).id == "r1"
    assert await drain is True
    assert list(gateway.replica_phases()) == ["b"]


# -- ModelStreamInfer against a replica that does not stream: a clear status, not a bare one


async def test_a_backend_without_streaming_is_named_in_the_status(gateway: OipGateway) -> None:
    async def requests():  # type: ignore[no-untyped-def]
        yield _request("s1")

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(requests(), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "does not serve ModelStreamInfer" in (caught.value.details() or "")
    assert sum(gateway.outstanding().values()) == 0


async def test_a_stream_with_no_ready_replica_for_its_model_says_so(gateway: OipGateway) -> None:
    request = service_pb2.ModelInferRequest(model_name="m", id="s1")
    for name in list(gateway.replica_phases()):
        await gateway.remove_replica(name)

    async def requests():  # type: ignore[no-untyped-def]
        yield request

    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.ModelStreamInfer(requests(), timeout=5):
                pass
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no ready replica of the shared pool's model 'm'" in (caught.value.details() or "")


# --- owners: a model is routed only to its owner's replicas --------------------------------


async def _infer_as(
    gateway: OipGateway, request: service_pb2.ModelInferRequest, tenant: str | None
) -> service_pb2.ModelInferResponse:
    metadata = (("x-seedance-tenant", tenant),) if tenant is not None else None
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return await stub.ModelInfer(request, timeout=5.0, metadata=metadata)


async def test_a_request_reaches_only_the_replicas_of_the_tenant_it_names_else_the_shared(
    fakes: dict[str, FakeReplica], gateway: OipGateway, registry: CollectorRegistry
) -> None:
    # a and b (configured) are the shared pool; globex registers a replica of its own "m".
    rogue = FakeReplica()
    await rogue.start()
    try:
        await gateway.add_replica(
            "globex/r", rogue.address, models=frozenset({"m"}), owner="globex"
        )
        await gateway.wait_ready(["globex/r"], timeout_s=10)
        assert gateway.replica_owners() == {"a": "", "b": "", "globex/r": "globex"}
        for i in range(4):  # without the header: the shared pool's "m", never globex's
            await _infer_as(gateway, _request(f"s{i}"), None)
        assert rogue.calls == []
        assert len(fakes["a"].calls) + len(fakes["b"].calls) == 4
        await _infer_as(gateway, _request("g"), "globex")  # globex's own "m": its replica
        assert len(rogue.calls) == 1
        # acme runs no "m": nothing of anyone else's stands in for it
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _infer_as(gateway, _request("acme"), "acme")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == "no ready replica of tenant acme's model 'm'"
        # a value that is no tenant id: refused, naming the header
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await _infer_as(gateway, _request("bad"), "a.>")
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "x-seedance-tenant" in (bad.value.details() or "")
        assert len(rogue.calls) == 1
        assert len(fakes["a"].calls) + len(fakes["b"].calls) == 4
    finally:
        await gateway.remove_replica("globex/r")
        await rogue.stop()


class GatedProbes(FakeReplica):
    """A replica whose ServerReady answers only while `probe_gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.probes = 0
        self.probe_gate = asyncio.Event()
        self.probe_gate.set()

    async def ServerReady(self, request, context):
        self.probes += 1
        await self.probe_gate.wait()
        return service_pb2.ServerReadyResponse(ready=True)


async def test_a_replica_removed_during_a_probe_round_does_not_stop_the_probes(
    registry: CollectorRegistry,
) -> None:
    # FOLLOW_PLAN or the replica watch drains a replica (its channel closed) while the probe
    # loop waits on another's answer: probing the removed one next raised UsageError ("Channel
    # is closed"), which ended the probe loop (no ejection, no re-admission any more) and
    # failed the gateway's stop.
    slow, other = GatedProbes(), FakeReplica()
    for fake in (slow, other):
        await fake.start()
    settings = GatewaySettings(
        replicas={"a": slow.address, "b": other.address},
        models=(ModelRoute(name="m"),),
        default_timeout_s=7.0,
        probe_interval_s=0.05,
        warmup=WarmupPolicy(window=2, tolerance=10.0, min_requests=4, max_requests=8),
    )
    try:
        async with OipGateway(settings, registry=registry) as gw:
            await gw.wait_ready(timeout_s=10)
            slow.probe_gate.clear()
            before = slow.probes
            await eventually(lambda: slow.probes > before, 5, what="a probe of a held")
            await gw.remove_replica("b")  # closed while the round waits on a
            held = slow.probes
            slow.probe_gate.set()
            await eventually(lambda: slow.probes > held, 5, what="the next probe round")
    finally:
        for fake in (slow, other):
            await fake.stop()


# --- ModelStreamInfer: each request an arrival, its first response its outcome --------------


class FakeStreamer(FakeReplica):
    """Streams: answers each request twice (two "tokens"), holds `held`, and fails the whole
    stream UNAVAILABLE on `boom`."""

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            if request.id == "boom":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine died")
            if request.id != "held":
                for _ in range(2):
                    yield service_pb2.ModelStreamInferResponse(
                        infer_response=service_pb2.ModelInferResponse(
                            model_name=request.model_name, id=request.id
                        )
                    )


async def test_a_streams_requests_are_routed_and_each_finishes_once() -> None:
    streamer = FakeStreamer()
    await streamer.start()
    seen: list[tuple[str, str]] = []
    routed: list[RoutedRequest] = []

    class Observer:
        def routed(self, request: RoutedRequest) -> None:
            routed.append(request)

        def finished(self, request: FinishedRequest) -> None:
            seen.append((request.status, request.replica or ""))

    settings = GatewaySettings(
        replicas={"s": streamer.address},
        models=(ModelRoute(name="m", warm_up=False),),
        probe_interval_s=30.0,
    )
    try:
        async with OipGateway(settings, registry=CollectorRegistry(), observer=Observer()) as gw:
            await gw.wait_ready(timeout_s=10)
            queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()

            async def requests():  # type: ignore[no-untyped-def]
                while (request := await queue.get()) is not None:
                    yield request

            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelStreamInfer(requests(), timeout=5)
                queue.put_nowait(_request("first"))
                ids = [(await call.read()).infer_response.id for _ in range(2)]
                assert ids == ["first", "first"]
                queue.put_nowait(_request("held"))
                queue.put_nowait(_request("boom"))
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call.read()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "replica 's': engine died" in (caught.value.details() or "")
            assert sum(gw.outstanding().values()) == 0
    finally:
        await streamer.stop()
    assert [(r.request_id, r.reason) for r in routed] == [
        ("first", "only_candidate"),
        ("held", "stream"),
        ("boom", "stream"),
    ]
    # "first" once (its second token is no new outcome); the two the stream's failure left
    # unanswered, with the upstream's status.
    assert seen == [("ok", "s"), ("unavailable", "s"), ("unavailable", "s")]


async def _read_to_the_end(call: grpc.aio.StreamStreamCall) -> None:
    while await call.read() is not grpc.aio.EOF:
        pass


async def test_a_later_request_the_gateway_cannot_convert_ends_the_stream_as_the_client_s() -> None:
    """A layout the client got wrong on the stream's third request: INVALID_ARGUMENT at once
    (not the client's deadline: gRPC swallows a request iterator's error and leaves the call
    open), and it and the request still unanswered are the client's error, not misses."""
    streamer = FakeStreamer()
    await streamer.start()
    seen: list[tuple[str, str]] = []

    class Observer:
        def routed(self, request: RoutedRequest) -> None:
            pass

        def finished(self, request: FinishedRequest) -> None:
            seen.append((request.status, request.model))

    layout = LayoutConversion(tensor="x", client_layout="NC", backend_layout="CN")
    settings = GatewaySettings(
        replicas={"s": streamer.address},
        models=(ModelRoute(name="m", warm_up=False, input_layouts=(layout,)),),
        probe_interval_s=30.0,
    )
    bad = _request("bad")
    del bad.inputs[0].shape[:]
    bad.inputs[0].shape.extend([2])  # rank 1 where the layout names two dimensions
    try:
        async with OipGateway(settings, registry=CollectorRegistry(), observer=Observer()) as gw:
            await gw.wait_ready(timeout_s=10)
            queue: asyncio.Queue[service_pb2.ModelInferRequest | None] = asyncio.Queue()

            async def requests():  # type: ignore[no-untyped-def]
                while (request := await queue.get()) is not None:
                    yield request

            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                call = stub.ModelStreamInfer(requests(), timeout=30)
                queue.put_nowait(_request("first"))
                assert (await call.read()).infer_response.id == "first"
                queue.put_nowait(_request("held"))
                queue.put_nowait(bad)
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _read_to_the_end(call)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "x" in (caught.value.details() or "")
            assert sum(gw.outstanding().values()) == 0
    finally:
        await streamer.stop()
    assert seen == [("ok", "m"), ("client_error", "m"), ("client_error", "m")]
