"""The compose stack's router configuration serves inference, against its own Triton model
repository: the router runs with compose's ``SEEDANCE_ROUTER_*`` values, the replica is a real
`tritonserver` (PyTriton's bundled binary, the server of the Triton image) serving the mounted
deploy/compose/triton/models, and a client calls the router over REST and gRPC.

Only the replica's host is rewritten (compose's DNS name ``triton`` -> 127.0.0.1 and its random
port): everything else is the shipped file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
import pytest
import yaml
from tritonclient.grpc import InferInput
from tritonclient.grpc import aio as triton_aio

from seedance.core import BusSettings, ServiceRuntime, WallClock
from seedance.router.service import RouterService
from seedance.router.settings import RouterSettings, parse_replicas
from seedance.testing.paths import REPO
from seedance.testing.triton import RepositoryTritonProcess
from seedance.testing.waits import eventually
from tests.conftest import serving

pytestmark = pytest.mark.slow

COMPOSE = REPO / "deploy" / "compose"


def _compose() -> dict[str, Any]:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def compose_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RepositoryTritonProcess]:
    triton = _compose()["services"]["triton"]
    (mount,) = [v for v in triton["volumes"] if v.split(":")[1] == "/models"]
    repository = (COMPOSE / mount.split(":")[0]).resolve()
    models = tuple(sorted(p.parent.name for p in repository.glob("*/config.pbtxt")))
    log_dir: Path = tmp_path_factory.mktemp("compose-triton")
    server = RepositoryTritonProcess(
        "compose", log_dir=log_dir, repository=repository, models=models
    )
    server.start()
    try:
        server.wait_ready(120.0)
        yield server
    finally:
        server.stop()


def _router_settings(triton: RepositoryTritonProcess) -> RouterSettings:
    env = _compose()["services"]["router"]["environment"]
    fields = {
        k[len("SEEDANCE_ROUTER_") :].lower(): v
        for k, v in env.items()
        if k.startswith("SEEDANCE_ROUTER_")
    }
    replicas = parse_replicas(fields["replicas"])
    assert {a.rsplit(":", 1)[0] for a in replicas.values()} == {"triton"}
    fields["replicas"] = ",".join(f"{n}={triton.address}" for n in replicas)
    # Random ports here; compose's 8001/8000 are checked by tests/unit/deploy/test_compose.py.
    fields |= {"listen_address": "127.0.0.1:0", "rest_address": "127.0.0.1:0", "http_port": "0"}
    return msgspec.convert(fields, RouterSettings, strict=False)


async def test_the_compose_router_config_serves_the_compose_triton_over_rest_and_grpc(
    nats_url: str, compose_triton: RepositoryTritonProcess
) -> None:
    settings = _router_settings(compose_triton)
    runtime = ServiceRuntime("router", BusSettings(url=nats_url, name="test-compose-router"))
    service = RouterService(runtime, settings, WallClock())
    async with serving(service, None):
        await service.gateway.wait_ready(timeout_s=60)
        assert service.rest is not None
        rest = f"http://{service.rest.address}"
        body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{rest}/v2/health/ready") as r:
                assert r.status == 200
            async with http.post(f"{rest}/v2/models/echo/infer", json=body) as r:
                assert r.status == 200, await r.text()
                (out,) = (await r.json())["outputs"]
        assert (out["name"], out["shape"], out["data"]) == ("y", [1, 3], [1.0, 2.0, 3.0])
        async with triton_aio.InferenceServerClient(service.gateway.address) as client:
            x = InferInput("x", [1, 2], "FP32")
            x.set_data_from_numpy(np.array([[4.0, 5.0]], dtype=np.float32))
            result = await client.infer("echo", [x])
        assert result.as_numpy("y").tolist() == [[4.0, 5.0]]
        await eventually(
            lambda: (
                (
                    runtime.registry.get_sample_value(
                        "seedance_router_decisions_total", {"reason": "only_candidate"}
                    )
                    or 0
                )
                >= 2
            ),
            timeout_s=5,
        )
