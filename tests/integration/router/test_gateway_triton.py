"""The OIP gateway against real Triton 2.51 servers (PyTriton) on 127.0.0.1.

Every request goes client -> gateway -> Triton over real gRPC. The failover test kills a
replica's whole process group while requests are in flight and counts every answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferInput, InferRequestedOutput, service_pb2, service_pb2_grpc
from tritonclient.grpc import aio as triton_aio
from tritonclient.utils import InferenceServerException

from seedance.router.gateway import OipGateway, ReplicaPhase
from seedance.testing.waits import eventually

pytestmark = pytest.mark.slow


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _attempts(registry: CollectorRegistry, replica: str) -> float:
    return sum(
        _sample(
            registry, "seedance_router_upstream_attempts_total", replica=replica, status_class=s
        )
        for s in ("ok", "client_error", "unavailable", "deadline", "cancelled", "server_error")
    )


def _echo_inputs(n: int, seed: int) -> tuple[list[InferInput], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    data = {
        "x_fp32": rng.standard_normal((1, n)).astype(np.float32),
        "x_int64": rng.integers(-(2**62), 2**62, size=(1, n), dtype=np.int64),
        "x_bytes": np.array([[f"tok-{seed}-{i}".encode() for i in range(n)]], dtype=np.object_),
    }
    inputs = []
    for name, datatype in (("x_fp32", "FP32"), ("x_int64", "INT64"), ("x_bytes", "BYTES")):
        tensor = InferInput(name, list(data[name].shape), datatype)
        tensor.set_data_from_numpy(data[name])
        inputs.append(tensor)
    return inputs, data


async def test_server_apis_answer_through_gateway(gateway: OipGateway) -> None:
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        assert await client.is_server_live()
        assert await client.is_server_ready()
        assert await client.is_model_ready("echo")
        assert not await client.is_model_ready("no_such_model")
        server = await client.get_server_metadata(as_json=True)
        assert server["name"] == "seedance-router"
        meta = await client.get_model_metadata("echo", as_json=True)
        assert [t["name"] for t in meta["inputs"]] == ["x_fp32", "x_int64", "x_bytes"]


async def test_raw_tensors_pass_through_intact(gateway: OipGateway) -> None:
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        for seed in range(5):
            inputs, data = _echo_inputs(n=17 + seed, seed=seed)
            result = await client.infer("echo", inputs)
            np.testing.assert_array_equal(result.as_numpy("y_fp32"), data["x_fp32"])
            np.testing.assert_array_equal(result.as_numpy("y_int64"), data["x_int64"])
            assert result.as_numpy("y_bytes").tolist() == data["x_bytes"].tolist()


async def test_typed_contents_pass_through_intact(gateway: OipGateway) -> None:
    values = [1.5, -2.25, 65536.125, -0.0]  # exact in float32
    ints = [2**40, -7, 0, 5]
    request = service_pb2.ModelInferRequest(model_name="echo", id="typed-1")
    for name, datatype, field, vals in (
        ("x_fp32", "FP32", "fp32_contents", values),
        ("x_int64", "INT64", "int64_contents", ints),
        ("x_bytes", "BYTES", "bytes_contents", [b"a", b"", b"\x00\xff", b"zz"]),
    ):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 4])
        getattr(tensor.contents, field).extend(vals)
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        response = await stub.ModelInfer(request, timeout=10)
    assert response.id == "typed-1"
    outputs = {t.name: (i, t) for i, t in enumerate(response.outputs)}
    fp32 = np.frombuffer(response.raw_output_contents[outputs["y_fp32"][0]], dtype="<f4")
    int64 = np.frombuffer(response.raw_output_contents[outputs["y_int64"][0]], dtype="<i8")
    assert fp32.tolist() == values
    assert int64.tolist() == ints
    assert list(outputs["y_fp32"][1].shape) == [1, 4]


async def test_layout_nhwc_converted_to_model_nchw_and_back(gateway: OipGateway) -> None:
    rng = np.random.default_rng(7)
    image_nhwc = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        meta = await client.get_model_metadata("nchw_stats", as_json=True)
        image_meta = next(t for t in meta["inputs"] if t["name"] == "image")
        # Triton says [-1, 3, -1, -1] (NCHW); the gateway shows the client its NHWC view.
        assert [int(d) for d in image_meta["shape"]] == [-1, -1, -1, 3]
        tensor = InferInput("image", list(image_nhwc.shape), "FP32")
        tensor.set_data_from_numpy(image_nhwc)
        result = await client.infer(
            "nchw_stats",
            [tensor],
            outputs=[InferRequestedOutput("channel_mean"), InferRequestedOutput("image_out")],
        )
    np.testing.assert_allclose(
        result.as_numpy("channel_mean"), image_nhwc.mean(axis=(1, 2)), rtol=1e-5
    )
    np.testing.assert_array_equal(result.as_numpy("image_out"), image_nhwc)


async def test_client_deadline_carried_upstream(
    gateway: OipGateway, registry: CollectorRegistry
) -> None:
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="delay_ms", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.append(np.array([[3000]], dtype="<i4").tobytes())
    async with grpc.aio.insecure_channel(gateway.address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        start_s = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ModelInfer(request, timeout=0.5)
        elapsed_s = time.monotonic() - start_s
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert elapsed_s < 2.0
    # The gateway's upstream call ended with the client's deadline (DEADLINE_EXCEEDED, or
    # cancelled when grpc cancels the handler first), not after the model's 3 s; no retry.
    ended = ("deadline", "cancelled")
    await eventually(
        lambda: (
            sum(
                _sample(
                    registry, "seedance_router_upstream_attempts_total", replica=r, status_class=c
                )
                for r in ("a", "b")
                for c in ended
            )
            == 1
            and sum(gateway.outstanding().values()) == 0
        ),
        timeout_s=1.0,
        what="one upstream attempt ended at the client's deadline",
    )
    assert time.monotonic() - start_s < 2.0
    assert _sample(registry, "seedance_router_decisions_total", reason="failover") == 0


async def test_invalid_argument_not_retried(
    gateway: OipGateway, registry: CollectorRegistry
) -> None:
    before = _attempts(registry, "a") + _attempts(registry, "b")
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        wrong = InferInput("x_fp32", [1, 2], "INT32")  # the model declares FP32
        wrong.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
        with pytest.raises(InferenceServerException) as caught:
            await client.infer("echo", [wrong])
    assert "INVALID_ARGUMENT" in str(caught.value.status())
    assert _attempts(registry, "a") + _attempts(registry, "b") - before == 1
    assert _sample(registry, "seedance_router_decisions_total", reason="failover") == 0
    assert (
        _sample(
            registry,
            "seedance_router_requests_total",
            model="echo",
            replica="a",
            status_class="client_error",
            region="other",
        )
        + _sample(
            registry,
            "seedance_router_requests_total",
            model="echo",
            replica="b",
            status_class="client_error",
            region="other",
        )
        == 1
    )


async def test_region_header_maps_to_closed_set(
    gateway: OipGateway, registry: CollectorRegistry
) -> None:
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        for region in ("EU-West", "mars-1", "us-east"):
            inputs, _ = _echo_inputs(n=3, seed=1)
            await client.infer("echo", inputs, headers={"x-seedance-region": region})

    def by_region(region: str) -> float:
        return sum(
            _sample(
                registry,
                "seedance_router_requests_total",
                model="echo",
                replica=r,
                status_class="ok",
                region=region,
            )
            for r in ("a", "b")
        )

    assert by_region("eu-west") == 1
    assert by_region("us-east") == 1
    assert by_region("other") == 1
    assert by_region("mars-1") == 0


async def test_requests_fail_over_when_a_replica_is_killed_mid_run(
    tritons: dict[str, Any], registry: CollectorRegistry, gateway_factory: Any
) -> None:
    total, concurrency, kill_after = 240, 8, 60
    victim = tritons["victim"]
    gateway = gateway_factory({"a": tritons["a"].address, "victim": victim.address}, registry)
    answered: dict[int, bool] = {}
    failures: list[BaseException] = []
    async with gateway:
        await gateway.wait_ready(timeout_s=60)
        async with triton_aio.InferenceServerClient(gateway.address) as client:
            next_index = iter(range(total))
            killed = asyncio.Event()

            async def worker() -> None:
                for i in next_index:
                    inputs, data = _echo_inputs(n=8, seed=1000 + i)
                    try:
                        result = await client.infer("echo", inputs, client_timeout=20)
                    except InferenceServerException as error:
                        failures.append(error)
                        continue
                    answered[i] = bool(
                        np.array_equal(result.as_numpy("y_fp32"), data["x_fp32"])
                        and np.array_equal(result.as_numpy("y_int64"), data["x_int64"])
                    )
                    if len(answered) == kill_after and not killed.is_set():
                        killed.set()
                        # Abrupt death, with other workers' requests in flight on it.
                        victim.kill()

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        victim_attempts = _attempts(registry, "victim")
        phases = gateway.replica_phases()
    assert killed.is_set()
    assert failures == []
    assert len(answered) == total
    assert all(answered.values())
    # The victim took traffic before it died, and is out of rotation after.
    assert victim_attempts > 0
    assert phases["victim"] is ReplicaPhase.EJECTED
    # Some requests did reach the dead replica and were sent again elsewhere.
    assert _sample(registry, "seedance_router_decisions_total", reason="failover") >= 1
    ok_total = sum(
        _sample(
            registry,
            "seedance_router_requests_total",
            model="echo",
            replica=r,
            status_class="ok",
            region="other",
        )
        for r in ("a", "victim")
    )
    assert ok_total == total


async def test_new_replica_warmed_up_before_it_takes_traffic(
    tritons: dict[str, Any], registry: CollectorRegistry, gateway_factory: Any
) -> None:
    gateway = gateway_factory({"a": tritons["a"].address}, registry)
    async with gateway:
        await gateway.wait_ready(timeout_s=60)
        await gateway.add_replica("b", tritons["b"].address)
        assert gateway.replica_phases()["b"] is ReplicaPhase.WARMING
        async with triton_aio.InferenceServerClient(gateway.address) as client:
            # Requests during b's warm-up all go to a.
            while gateway.replica_phases()["b"] is ReplicaPhase.WARMING:
                inputs, _ = _echo_inputs(n=4, seed=3)
                await client.infer("echo", inputs)
            assert gateway.replica_phases()["b"] is ReplicaPhase.READY
    warmups = _sample(registry, "seedance_router_warmup_requests_total", replica="b")
    # Two warmed models, each at least min_requests (6) of TEST_WARMUP.
    assert warmups >= 12
    assert (
        _sample(registry, "seedance_router_upstream_attempts_total", replica="b", status_class="ok")
        == 0
    )
