"""The router reachable: replicas discovered from the KV bucket, KServe v2 REST, streaming.

Real parts only: a real nats-server (the shipped authorisation for the permission test), real
Triton servers (`tritons`, from nvidia-pytriton), real HTTP through aiohttp, real gRPC clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nats.errors
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferInput
from tritonclient.grpc import aio as triton_aio

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.core.kv import ensure_bucket
from seedance.events import replicas
from seedance.events.replicas import ReplicaRegistration
from seedance.events.subjects import routing
from seedance.router.gateway import ModelRoute, OipGateway, ReplicaPhase, RestGateway, WarmupPolicy
from seedance.router.gateway.metrics import OTHER
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings, gateway_settings
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.conftest import shipped_password

pytestmark = pytest.mark.slow

WARMUP = WarmupPolicy(window=3, tolerance=0.5, min_requests=6, max_requests=30)


@contextlib.asynccontextmanager
async def discovering_router(
    nats_url: str, static: str, fleet: str, bus: BusSettings | None = None
) -> AsyncIterator[RouterService]:
    """A router of ``fleet`` discovering its replicas, ``static`` its fallback; ``bus``: how it
    connects (a shipped user's settings), by default as nobody on ``nats_url``."""
    settings = RouterSettings(
        listen_address="127.0.0.1:0",
        rest_address="127.0.0.1:0",
        replicas=static,
        models="echo",
        fleet=fleet,
        forecast=False,
        plan=False,
    )
    gw = dataclasses.replace(
        gateway_settings(settings),
        models=(ModelRoute(name="echo"),),
        warmup=WARMUP,
        probe_interval_s=0.2,
    )
    runtime = ServiceRuntime("router", bus or BusSettings(url=nats_url, name="test-router-reach"))
    service = RouterService(runtime, settings, WallClock(), gateway=gw, drain_grace_s=2.0)
    async with serving(service, None):
        yield service


async def _echo_once(address: str, value: float) -> None:
    async with triton_aio.InferenceServerClient(address) as client:
        inputs = []
        for name, dtype, arr in (
            ("x_fp32", "FP32", np.full((1, 4), value, dtype=np.float32)),
            ("x_int64", "INT64", np.array([[1]], dtype=np.int64)),
            ("x_bytes", "BYTES", np.array([[b"t"]], dtype=np.object_)),
        ):
            inp = InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        result = await client.infer("echo", inputs)
        assert result.as_numpy("y_fp32").tolist() == [[value] * 4]


def _served(registry: CollectorRegistry, replica: str) -> float:
    labels = {"model": "echo", "replica": replica, "status_class": "ok", "region": OTHER}
    return registry.get_sample_value("seedance_router_requests_total", labels) or 0.0


async def _put(kv: Any, fleet: str, reg: ReplicaRegistration) -> None:
    await kv.put(routing.replica_key(fleet, reg.model, reg.replica), replicas.encode(reg))


def _ready_replicas(router: RouterService) -> dict[str, str]:
    models = router.gateway.replica_models()
    return {
        name: models[name][0]
        for name, phase in router.gateway.replica_phases().items()
        if phase is ReplicaPhase.READY
    }


async def test_replicas_join_and_leave_through_the_bucket_without_a_restart(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    fleet = f"fleet-{unique}"
    a, b = tritons["a"].address, tritons["b"].address
    kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)
    async with discovering_router(nats_url, f"static-a={a}", fleet) as router:
        # Nothing registered: the configured list is the fallback.
        await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)
        registry = router._rt.registry
        await _echo_once(router.gateway.address, 1.0)
        assert _served(registry, "static-a") == 1

        # An unreadable value and a registration under another replica's key are ignored (the
        # watch handles keys in order, so by the time pod-b has joined they were seen).
        await kv.put(routing.replica_key(fleet, "echo", "pod-x"), b"not json")
        await _put(kv, fleet, ReplicaRegistration(model="echo", replica="pod-y", address=a))
        await kv.delete(routing.replica_key(fleet, "echo", "pod-y"))
        misfiled = ReplicaRegistration(model="echo", replica="pod-y", address=a)
        await kv.put(routing.replica_key(fleet, "echo", "pod-z"), replicas.encode(misfiled))
        # A replica registers: it joins, warmed up, and the fallback is drained.
        await _put(kv, fleet, ReplicaRegistration(model="echo", replica="pod-b", address=b))
        await eventually(lambda: _ready_replicas(router) == {"pod-b": b}, timeout_s=60)
        assert set(router.registrations) == {routing.replica_key(fleet, "echo", "pod-b")}
        assert router.gateway.replica_models()["pod-b"] == (b, frozenset({"echo"}))
        await _echo_once(router.gateway.address, 2.0)
        assert _served(registry, "pod-b") == 1
        assert _served(registry, "static-a") == 1

        # Another fleet's registration is not ours.
        await _put(kv, f"other-{unique}", ReplicaRegistration(model="echo", replica="x", address=a))
        # Not ready: it stays registered but takes no traffic; with no ready one, the fallback.
        await _put(
            kv, fleet, ReplicaRegistration(model="echo", replica="pod-b", address=b, ready=False)
        )
        await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)

        # Ready again, then deleted: it leaves.
        await _put(kv, fleet, ReplicaRegistration(model="echo", replica="pod-b", address=b))
        await eventually(lambda: "pod-b" in _ready_replicas(router), timeout_s=60)
        await kv.delete(routing.replica_key(fleet, "echo", "pod-b"))
        await eventually(lambda: _ready_replicas(router) == {"static-a": a}, timeout_s=60)
        changes = registry.get_sample_value(
            "seedance_router_replica_changes_total", {"action": "remove"}
        )
        assert changes is not None
        assert changes >= 3


async def test_a_registration_present_at_start_replaces_the_fallback(
    nats_url: str, tritons: dict[str, Any], bus: Bus, unique: str
) -> None:
    fleet = f"fleet-{unique}"
    kv = await ensure_bucket(bus, routing.REPLICAS_BUCKET)
    b = tritons["b"].address
    await _put(kv, fleet, ReplicaRegistration(model="echo", replica="pod-b", address=b))
    async with discovering_router(nats_url, f"static-a={tritons['a'].address}", fleet) as router:
        await eventually(lambda: _ready_replicas(router) == {"pod-b": b}, timeout_s=60)


@pytest.mark.parametrize("registrar_user", ["replayer", "k8s-bridge"])
async def test_only_the_trusted_registrar_may_write_the_replicas_bucket(
    auth_url: str, unique: str, registrar_user: str
) -> None:
    """On the shipped authorisation: the router creates, reads and watches the bucket but its
    put is refused; the registrars (the replayer, the Kubernetes bridge) write it."""

    def creds(user: str) -> BusSettings:
        return BusSettings(url=auth_url, user=user, password=shipped_password(user), name=user)

    router = await Bus.connect(creds("router"))
    registrar = await Bus.connect(creds(registrar_user))
    try:
        router_kv = await ensure_bucket(router, routing.REPLICAS_BUCKET)
        key = routing.replica_key(f"fleet-{unique}", "echo", "pod-1")
        reg = ReplicaRegistration(model="echo", replica="pod-1", address="10.0.0.1:8001")
        with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):
            await asyncio.wait_for(router_kv.put(key, replicas.encode(reg)), timeout=3)
        registrar_kv = await ensure_bucket(registrar, routing.REPLICAS_BUCKET)
        await registrar_kv.put(key, replicas.encode(reg))
        entry = await router_kv.get(key)
        assert replicas.decode(f"fleet-{unique}", key, entry.value) == reg
        watcher = await router_kv.watch(f"fleet-{unique}.>")
        first = await watcher.updates(timeout=5)
        if first is None:  # nats-py may put its end-of-history marker before the value
            first = await watcher.updates(timeout=5)
        assert first is not None
        assert first.key == key
        await watcher.stop()
        await registrar_kv.delete(key)  # a registrar also deletes (a replica that left)
    finally:
        await router.close()
        await registrar.close()


# -- KServe v2 REST -----------------------------------------------------------------------


@pytest.fixture
async def rest(gateway: OipGateway) -> AsyncIterator[str]:
    front = RestGateway(gateway, listen_address="127.0.0.1:0")
    await front.start()
    try:
        yield f"http://{front.address}"
    finally:
        await front.stop()


async def test_rest_health_and_model_endpoints(rest: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{rest}/v2/health/live") as r:
            assert (r.status, await r.json()) == (200, {"live": True})
        async with http.get(f"{rest}/v2/health/ready") as r:
            assert (r.status, await r.json()) == (200, {"ready": True})
        async with http.get(f"{rest}/v2") as r:
            assert (await r.json())["name"] == "seedance-router"
        async with http.get(f"{rest}/v2/models/echo") as r:
            meta = await r.json()
        assert r.status == 200
        assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [
            ("x_fp32", "FP32"),
            ("x_int64", "INT64"),
            ("x_bytes", "BYTES"),
        ]
        async with http.get(f"{rest}/v2/models/echo/ready") as r:
            assert (r.status, await r.json()) == (200, {"name": "echo", "ready": True})
        async with http.get(f"{rest}/v2/models/no_such_model/ready") as r:
            assert (r.status, await r.json()) == (503, {"name": "no_such_model", "ready": False})


async def test_rest_infer_round_trips_json_tensors_through_the_replicas(
    rest: str, registry: CollectorRegistry
) -> None:
    body = {
        "id": "rest-1",
        "inputs": [
            {"name": "x_fp32", "shape": [1, 4], "datatype": "FP32", "data": [[0.5, 1, 2, 3]]},
            {"name": "x_int64", "shape": [1, 1], "datatype": "INT64", "data": [2**40]},
            {"name": "x_bytes", "shape": [1, 2], "datatype": "BYTES", "data": ["hé", ""]},
        ],
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{rest}/v2/models/echo/infer", json=body, headers={"x-seedance-region": "eu-west"}
        ) as r,
    ):
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["model_name"] == "echo"
    assert answer["id"] == "rest-1"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["y_fp32"] == {
        "name": "y_fp32",
        "datatype": "FP32",
        "shape": [1, 4],
        "data": [0.5, 1.0, 2.0, 3.0],
    }
    assert outputs["y_int64"]["data"] == [2**40]
    assert outputs["y_bytes"]["data"] == ["hé", ""]
    # Counted by the gateway like a gRPC request, with the REST request's region header.
    counted = sum(
        registry.get_sample_value(
            "seedance_router_requests_total",
            {"model": "echo", "replica": r, "status_class": "ok", "region": "eu-west"},
        )
        or 0.0
        for r in ("a", "b")
    )
    assert counted == 1


async def test_rest_infer_goes_through_the_models_layout_conversion(rest: str) -> None:
    """nchw_stats is declared NHWC for clients: a REST client sends NHWC and gets the right
    channel means, which only happens if REST took the gateway's conversion path."""
    image = np.arange(2 * 3 * 3, dtype=np.float32).reshape(1, 2, 3, 3)  # N H W C, C = 3
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1, 2, 3, 3],
                "datatype": "FP32",
                "data": image.reshape(-1).tolist(),
            }
        ]
    }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{rest}/v2/models/nchw_stats/infer", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        outputs = {o["name"]: o for o in (await r.json())["outputs"]}
    expected = image.mean(axis=(1, 2)).reshape(-1).tolist()
    assert outputs["channel_mean"]["data"] == pytest.approx(expected)
    assert outputs["image_out"]["shape"] == [1, 2, 3, 3]
    assert outputs["image_out"]["data"] == image.reshape(-1).tolist()


async def test_rest_refuses_a_bad_body_naming_the_tensor_and_passes_backend_errors(
    rest: str,
) -> None:
    short = {"inputs": [{"name": "x_fp32", "shape": [1, 4], "datatype": "FP32", "data": [1]}]}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{rest}/v2/models/echo/infer", json=short) as r:
            assert r.status == 400
            assert "x_fp32" in (await r.json())["error"]
        async with http.post(f"{rest}/v2/models/echo/infer", data=b"{not json") as r:
            assert r.status == 400
            assert "not JSON" in (await r.json())["error"]
        # The backend's own refusal (a missing input) comes back as a client error, with words.
        one = {"inputs": [{"name": "x_fp32", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
        async with http.post(f"{rest}/v2/models/echo/infer", json=one) as r:
            assert 400 <= r.status < 500
            assert (await r.json())["error"]


# -- streaming -------------------------------------------------------------------------------


def _echo_inputs(i: int) -> list[InferInput]:
    inputs = []
    for name, dtype, arr in (
        ("x_fp32", "FP32", np.full((1, 2), i, dtype=np.float32)),
        ("x_int64", "INT64", np.array([[i]], dtype=np.int64)),
        ("x_bytes", "BYTES", np.array([[b"s"]], dtype=np.object_)),
    ):
        inp = InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


async def test_stream_infer_is_proxied_to_a_replica_that_streams(gateway: OipGateway) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(3):
            yield {"model_name": "echo", "inputs": _echo_inputs(i), "request_id": f"s{i}"}

    async with triton_aio.InferenceServerClient(gateway.address) as client:
        seen = {}
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            response = result.get_response()
            seen[response.id] = result.as_numpy("y_fp32").tolist()
    assert seen == {f"s{i}": [[float(i)] * 2] for i in range(3)}
    assert sum(gateway.outstanding().values()) == 0


async def test_a_stream_reuses_an_id_once_triton_flagged_its_final_response(
    gateway: OipGateway,
) -> None:
    # The gateway holds an id until a response to it carries triton_final_response: Triton
    # flags a non-decoupled model's one response final, so an id reused in turn is not refused.
    answered: asyncio.Queue[None] = asyncio.Queue()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(2):
            yield {"model_name": "echo", "inputs": _echo_inputs(i), "request_id": "again"}
            await answered.get()

    seen = []
    async with triton_aio.InferenceServerClient(gateway.address) as client:
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            response = result.get_response()
            assert response.parameters["triton_final_response"].bool_param
            seen.append((response.id, result.as_numpy("y_fp32").tolist()))
            answered.put_nowait(None)
    assert seen == [("again", [[0.0, 0.0]]), ("again", [[1.0, 1.0]])]
    assert sum(gateway.outstanding().values()) == 0
