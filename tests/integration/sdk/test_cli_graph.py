"""``seedance graph compile --tenant acme`` as README.md shows it: a ``seedance`` subprocess
under ``tenant-acme`` on the shipped-auth server, the compiler under its own user. Before, the
command ended "no result in time: is a graph compiler running?" (rc 1): tenants had no graph
subject and no object store (the hostile docs audit).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from tests.conftest import serving
from tests.integration.conftest import shipped_password
from tests.integration.graph.test_graph_service import mlp
from tests.integration.sdk.conftest import TENANT, cli

pytestmark = pytest.mark.slow


def _settings(url: str, user: str) -> BusSettings:
    return BusSettings(url=url, user=user, password=shipped_password(user))


async def test_a_tenant_compiles_with_the_cli_and_only_its_own(auth_url: str, tmp_path: Path):
    admin = await Bus.connect(_settings(auth_url, "admin"))
    try:
        await admin.ensure_streams()
    finally:
        await admin.close()
    model, out = tmp_path / "mlp.onnx", tmp_path / "mlp.compiled.onnx"
    model.write_bytes(mlp())
    runtime = ServiceRuntime("graph-compiler", _settings(auth_url, "graph-compiler"))
    async with serving(GraphCompilerService(runtime, GraphCompilerSettings())):
        rc, stdout, stderr = await cli(
            auth_url, "graph", "compile", "--tenant", TENANT, "--model", str(model),
            "--out", str(out), "--precisions", "fp32", "--json",
        )  # fmt: skip
        assert (rc, stderr) == (0, ""), stderr
        assert '"ok":true' in stdout
        sha = hashlib.sha256(out.read_bytes()).hexdigest()
        assert f'"artifact_sha256":"{sha}"' in stdout
        rc, _, stderr = await cli(
            auth_url, "graph", "compile", "--tenant", "globex", "--model", str(model)
        )
    assert rc == 1
    assert "the server refused publishing to 'seedance.models.globex.upload." in stderr
