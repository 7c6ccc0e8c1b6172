"""The graph-compiler compiles under its own generated NATS user (issue 27): a compile through
the bus, the compiler connected as ``graph-compiler`` with the shipped permissions, which the
server confirms. Run with another user's permissions, nats-py's object-store read asked
``$JS.API.STREAM.NAMES``, which that user lacked, and every compile failed as ``InternalError``.
"""

from __future__ import annotations

import pytest

from seedance.core import ServiceRuntime
from seedance.core.bus import set_connect_policy
from seedance.events.graph import PrecisionPolicy
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import SeedanceClient
from seedance.testing.identities import ForeignIdentity, as_user, connect_policy
from tests.conftest import serving, started_server
from tests.integration.graph.test_graph_service import mlp


async def test_compiles_as_its_own_generated_user(nats_url: str, client: SeedanceClient, tenant):
    server = started_server(nats_url)
    if server is None:
        pytest.skip("--nats-url: the server's connections cannot be listed here")
    settings = as_user(nats_url, "graph-compiler", name=f"gc-own-{tenant}")
    runtime = ServiceRuntime("graph-compiler", settings)
    async with serving(GraphCompilerService(runtime, GraphCompilerSettings())):
        mine = [c for c in server.connections("open") if c.get("name") == settings.name]
        assert [c.get("authorized_user") for c in mine] == ["graph-compiler"]
        result = await client.compile_model(
            tenant, "mlp", mlp(), PrecisionPolicy(priority_order=["fp32"]), timeout_s=120
        )
    assert result.ok, result.error
    assert result.error_kind is None
    assert result.artifact_sha256


async def test_a_service_cannot_run_as_the_operator(nats_url: str):
    """The session's guard: a service started in-process with another user's settings is
    refused before it connects (so no test passes on permissions the deployment lacks)."""
    assert set_connect_policy(connect_policy) is connect_policy  # the session installed it
    runtime = ServiceRuntime("graph-compiler", as_user(nats_url, "admin"))
    service = GraphCompilerService(runtime, GraphCompilerSettings())
    with pytest.raises(ForeignIdentity, match="'graph-compiler' would connect as 'admin'"):
        await service.start()
    await service.close()
