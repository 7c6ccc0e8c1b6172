"""The graph-compiler compiles under its own generated NATS user (issue 27): a compile through
the bus, the compiler connected as ``graph-compiler`` with the shipped permissions, which the
server confirms. Run with another user's permissions, nats-py's object-store read asked
``$JS.API.STREAM.NAMES``, which that user lacked, and every compile failed as ``InternalError``;
and a model of a few MiB, whose read meets the server's flow-control requests
(``$JS.FC.OBJ_<store>...``, which that user could not answer either), stalled for ever.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from seedance.core import ServiceRuntime
from seedance.core.bus import set_connect_policy
from seedance.events.graph import PrecisionPolicy
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import SeedanceClient
from seedance.testing.identities import ForeignIdentity, as_user, connect_policy
from tests.conftest import serving, started_server
from tests.integration.graph.test_graph_service import _model, mlp


def wide_matmul(n: int = 1024) -> bytes:
    """One MatMul with an n×n float32 weight: 4 MiB at n=1024, read in 32 chunks of 128 KiB."""
    w = (np.random.default_rng(0).standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, n])
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="fc")
    return _model([node], x, y, [numpy_helper.from_array(w, "W")])


async def test_compiles_as_its_own_generated_user(nats_url: str, client: SeedanceClient, tenant):
    server = started_server(nats_url)
    if server is None:
        pytest.skip("--nats-url: the server's connections cannot be listed here")
    settings = as_user(nats_url, "graph-compiler", name=f"gc-own-{tenant}")
    runtime = ServiceRuntime("graph-compiler", settings)
    async with serving(GraphCompilerService(runtime, GraphCompilerSettings())):
        mine = [c for c in server.connections("open") if c.get("name") == settings.name]
        assert [c.get("authorized_user") for c in mine] == ["graph-compiler"]
        policy = PrecisionPolicy(priority_order=["fp32"])
        small = await client.compile_model(tenant, "mlp", mlp(), policy, timeout_s=60)
        big = await client.compile_model(tenant, "wide", wide_matmul(), policy, timeout_s=60)
    for result in (small, big):
        assert result.ok, result.error
        assert result.error_kind is None
        assert result.artifact_sha256
    assert big.report is not None
    assert big.report.nodes_before == 1


async def test_a_service_cannot_run_as_the_operator(nats_url: str):
    """The session's guard: a service started in-process with another user's settings is
    refused before it connects (so no test passes on permissions the deployment lacks)."""
    assert set_connect_policy(connect_policy) is connect_policy  # the session installed it
    runtime = ServiceRuntime("graph-compiler", as_user(nats_url, "admin"))
    service = GraphCompilerService(runtime, GraphCompilerSettings())
    with pytest.raises(ForeignIdentity, match="'graph-compiler' would connect as 'admin'"):
        await service.start()
    await service.close()
