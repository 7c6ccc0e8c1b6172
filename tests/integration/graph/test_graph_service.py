"""The graph-compiler service over a real nats-server: requests in, artifacts and reports out.

Small models only (an MLP, a decomposed LayerNorm): each test pays one child-process start
(the compile runs in a spawned child) and a compile of well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import secrets
import socket
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.js.errors
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from seedance.core import BusSettings, ServiceRuntime
from seedance.core.holder import default_holder
from seedance.core.kv import ensure_bucket, ensure_object_store
from seedance.events import new_event_id
from seedance.events.graph import CompilerCapability, CompileRequest, PrecisionPolicy
from seedance.events.graph import input_object_name as input_name
from seedance.events.subjects import graph
from seedance.graph_compiler.service import WORKERS_BUCKET, GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk import cli
from seedance.sdk.client import GRAPH_MODELS_STORE, SeedanceClient
from seedance.testing.waits import eventually, stop_task
from tests.conftest import serving
from tests.unit.graph.gc_onnx_kit import overflow_ln_model


def _model(nodes: list[Any], x: Any, y: Any, inits: list[Any]) -> bytes:
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _init(name: str, a: np.ndarray) -> Any:
    return numpy_helper.from_array(a, name)


def mlp() -> bytes:
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
        helper.make_node("Identity", ["hb"], ["hi"], name="noop"),
        helper.make_node("Relu", ["hi"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2"),
        helper.make_node("Neg", ["h"], ["dead"], name="dead_branch"),
    ]
    inits = [
        _init("W1", (rng.standard_normal((32, 64)) / 6).astype(np.float32)),
        _init("b1", rng.standard_normal(64).astype(np.float32)),
        _init("W2", (rng.standard_normal((64, 8)) / 8).astype(np.float32)),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    return _model(nodes, x, y, inits)


def overflow_ln() -> bytes:
    """A decomposed LayerNorm of inputs scaled ×1000: its variance (~1e6) overflows FP16."""
    model = overflow_ln_model()
    model.ir_version = 8
    return model.SerializeToString()


def _run(model: bytes, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


async def test_compile_over_the_bus_with_report(start_compiler, client, tenant):
    await start_compiler()
    model = mlp()
    result = await client.compile_model(
        tenant, "mlp", model, PrecisionPolicy(priority_order=["fp32"]), timeout_s=120
    )
    assert result.ok, result.error
    assert result.tenant == tenant
    assert result.model_name == "mlp"
    rep = result.report
    assert rep is not None
    assert rep.precision == "fp32"
    assert rep.nodes_before == 6
    assert rep.nodes_after < rep.nodes_before
    assert "prune_dead" in rep.passes_fired
    assert rep.cosine is not None
    assert rep.cosine >= 0.999
    artifact = await client.fetch_artifact(result)
    assert hashlib.sha256(artifact).hexdigest() == result.artifact_sha256
    x = np.random.default_rng(7).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(artifact, x), _run(model, x), rtol=1e-4, atol=1e-5)


async def test_invalid_model_gets_named_error_and_no_artifact(start_compiler, client, tenant):
    await start_compiler()
    result = await client.compile_model(tenant, "junk", b"not an onnx model", timeout_s=120)
    assert not result.ok
    assert result.error_kind == "InvalidModel"
    assert result.error
    assert result.report is None
    assert result.artifact_object is None
    assert result.artifact_url is None
    store = await ensure_object_store(client._bus, GRAPH_MODELS_STORE)
    try:
        infos = await store.list(ignore_deletes=True)
    except nats.js.errors.NotFoundError:  # nats-py's answer for a store with no object at all
        infos = []
    assert not [i.name for i in infos if i.name.startswith(f"artifacts/{tenant}/")]


async def test_heartbeats_while_compiling(start_compiler, client, tenant):
    # Heartbeats every 50 ms: the child's start, the compile and the timing child take longer.
    svc = await start_compiler(heartbeat_s=0.05, select_runs=5)
    policy = PrecisionPolicy(priority_order=["int8", "fp32"])
    result = await client.compile_model(tenant, "ln", overflow_ln(), policy, timeout_s=120)
    assert result.ok, result.error
    rep = result.report
    assert rep is not None
    assert rep.machine is not None
    assert rep.machine.startswith("CPU ")
    assert rep.provider == "CPUExecutionProvider"
    assert {t.candidate for t in rep.timings} >= {"baseline", "fp32"}
    assert sum(t.chosen for t in rep.timings) == 1
    assert svc.metrics.heartbeats_total._value.get() >= 1


async def test_worker_announces_its_capability(start_compiler, nats_url, client):
    svc = await start_compiler(worker_id="gc-cap-test")
    kv = await ensure_bucket(client._bus, WORKERS_BUCKET)
    entry = await kv.get("gc-cap-test")
    cap = msgspec.msgpack.decode(entry.value, type=CompilerCapability)
    assert "CPUExecutionProvider" in cap.providers
    assert "CUDAExecutionProvider" not in cap.providers  # the CPU wheel: no GPU to claim
    assert cap.targets == ["cpu"]
    assert cap.machine.startswith("CPU ")
    await svc.stop()
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get("gc-cap-test")


async def test_cuda_request_without_a_gpu_worker_fails_with_the_reason(
    start_compiler, client, tenant
):
    await start_compiler()
    policy = PrecisionPolicy(priority_order=["fp16", "fp32"])
    result = await client.compile_model(
        tenant, "ln", overflow_ln(), policy, target="cuda", timeout_s=120
    )
    assert not result.ok
    assert result.error_kind == "NoGpuWorker"
    assert result.error is not None
    assert "no graph-compiler worker with CUDAExecutionProvider is announced" in result.error
    assert result.artifact_object is None
    assert result.artifact_url is None


async def test_cuda_request_is_left_for_an_announced_gpu_worker(start_compiler, client, tenant):
    # A GPU worker is announced but never takes the request (it is only a KV entry here): the
    # CPU worker hands it back on each delivery, then answers with the reason on the last.
    kv = await ensure_bucket(client._bus, WORKERS_BUCKET)
    gpu = CompilerCapability(
        worker_id=f"gpu-{tenant}",
        providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
        targets=["cpu", "cuda", "transformer-gpu"],
    )

    async def announce_forever() -> None:
        # As a real worker does: the bucket's TTL (60 s) is shorter than this test on a loaded
        # machine (the compiler's start-up, then three deliveries).
        while True:
            await kv.put(gpu.worker_id, msgspec.msgpack.encode(gpu))
            await asyncio.sleep(10)

    announcer = asyncio.create_task(announce_forever())
    await asyncio.sleep(0)
    try:
        await start_compiler()
        result = await client.compile_model(
            tenant,
            "m",
            mlp(),
            PrecisionPolicy(priority_order=["fp32"]),
            target="cuda",
            timeout_s=120,
        )
    finally:
        await stop_task(announcer)  # it puts to the KV: one cancel can be lost
        await kv.delete(gpu.worker_id)
    assert not result.ok
    assert result.error_kind == "NoGpuWorker"
    assert result.error is not None
    assert f"gpu-{tenant}" in result.error
    assert "did not take it in 3 deliveries" in result.error


async def _request(
    client: SeedanceClient, tenant: str, request_id: str, model: bytes, **fields: Any
) -> CompileRequest:
    if "model_url" not in fields:
        store = await ensure_object_store(client._bus, GRAPH_MODELS_STORE)
        obj = input_name(tenant, request_id, "m")
        await store.put(obj, io.BytesIO(model))
        fields.setdefault("model_object", obj)
    return CompileRequest(
        id=new_event_id(),
        at=datetime.now(UTC),
        request_id=request_id,
        tenant=tenant,
        model_name="m",
        policy=PrecisionPolicy(priority_order=["fp32"]),
        **fields,
    )


async def _results(client: SeedanceClient, tenant: str) -> int:
    info = await client._bus.js.stream_info(
        "SEEDANCE_GRAPH", subjects_filter=graph.subject(tenant, "result")
    )
    return sum((info.state.subjects or {}).values())


async def test_duplicate_request_gets_one_result(start_compiler, client, tenant):
    svc = await start_compiler()
    first = await _request(client, tenant, "r1", mlp())
    again = await _request(client, tenant, "r1", mlp())  # same request id, another event id
    assert first.id != again.id
    result = await client._request_compile(first, 120)
    assert result.ok, result.error
    await client._bus.publish(graph.subject(tenant, "request"), again)

    async def answered_twice() -> bool:
        return svc.metrics.duplicates_total._value.get() >= 1

    await eventually(answered_twice, 60)  # the service's counter: no event to wait on
    assert await _results(client, tenant) == 1


async def test_bad_requests_get_invalid_request_results(start_compiler, client, tenant, tmp_path):
    await start_compiler(model_dir=str(tmp_path))
    (tmp_path / tenant).mkdir()
    path = tmp_path / tenant / "m.onnx"
    path.write_bytes(mlp())
    wrong = hashlib.sha256(b"something else").hexdigest()
    bad_sha = await client._request_compile(
        await _request(client, tenant, "bad-sha", b"", model_url=str(path), model_sha256=wrong),
        120,
    )
    assert (bad_sha.ok, bad_sha.error_kind) == (False, "InvalidRequest")
    assert "sha256 mismatch" in (bad_sha.error or "")
    absent = await _request(
        client, tenant, "missing", b"", model_object=input_name(tenant, "nope", "m")
    )
    missing = await client._request_compile(absent, 120)
    assert (missing.ok, missing.error_kind) == (False, "InvalidRequest")
    assert "no object" in (missing.error or "")
    other = await _request(client, tenant, "other-tenant", b"", model_object="inputs/x/y/m.onnx")
    crossed = await client._request_compile(other, 120)
    assert crossed.error_kind == "InvalidRequest"
    assert "not under" in (crossed.error or "")


async def test_large_artifact_goes_by_reference(start_compiler, client, tenant, tmp_path):
    await start_compiler(max_inline_artifact_mib=0.0, artifact_dir=str(tmp_path / "artifacts"))
    result = await client.compile_model(
        tenant, "mlp", mlp(), PrecisionPolicy(priority_order=["fp32"]), timeout_s=120
    )
    assert result.ok, result.error
    assert result.artifact_object is None
    assert result.artifact_url
    assert result.artifact_url.startswith("file://")
    data = await client.fetch_artifact(result)
    assert hashlib.sha256(data).hexdigest() == result.artifact_sha256


async def test_cli_compiles_and_writes_the_artifact(
    start_compiler, nats_url, tenant, tmp_path, capsys
):
    await start_compiler()
    src = tmp_path / "mlp.onnx"
    src.write_bytes(mlp())
    out = tmp_path / "mlp.compiled.onnx"
    argv = ["--nats-url", nats_url, "graph", "compile", "--tenant", tenant]
    argv += ["--model", str(src), "--out", str(out), "--precisions", "fp32"]
    rc = await asyncio.to_thread(cli.main, argv)
    assert rc == 0, capsys.readouterr().err
    assert "precision fp32" in capsys.readouterr().out
    onnx.checker.check_model(onnx.load_from_string(out.read_bytes()))


async def test_workers_on_alike_hosts_with_one_pid_announce_apart(
    nats_url: str, client: SeedanceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers whose host name and pid agree (two hosts named alike, or a restart that
    reuses its predecessor's pid: every container's first process is pid 1) each have their
    own key in the workers bucket, and one's stop leaves the other's announcement. The id was
    ``<host>-<pid>``: one key for both, the second announce overwrote the first, and the
    first's stop deleted what the second announced."""
    drawn = iter(range(1, 100))

    def built() -> GraphCompilerService:
        # Each worker is a process of its own: its holder name is drawn afresh. Its random
        # suffix comes from a stand-in sequence, so that two draws cannot happen to agree (one
        # chance in 65,536) and fail this test.
        with monkeypatch.context() as alike:
            alike.setattr(socket, "gethostname", lambda: "gc-node")
            alike.setattr(os, "getpid", lambda: 1)
            alike.setattr(secrets, "token_hex", lambda n: f"{next(drawn):0{2 * n}x}")
            default_holder.cache_clear()
            try:
                runtime = ServiceRuntime("graph-compiler", BusSettings(url=nats_url, name="gc"))
                return GraphCompilerService(runtime, GraphCompilerSettings())
            finally:
                default_holder.cache_clear()  # this process's own name again, for others

    kv = await ensure_bucket(client._bus, WORKERS_BUCKET)
    async with contextlib.AsyncExitStack() as running:
        first = await running.enter_async_context(serving(built()))
        second = await running.enter_async_context(serving(built()))
        ids = {first._worker_id, second._worker_id}
        assert len(ids) == 2, ids
        for worker_id in ids:
            assert worker_id.startswith("gc-node-1-")
            entry = await kv.get(worker_id)
            assert msgspec.msgpack.decode(entry.value, type=CompilerCapability).worker_id == (
                worker_id
            )
        await first.stop()
        entry = await kv.get(second._worker_id)  # still announced
        assert entry.value
