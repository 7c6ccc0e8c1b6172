"""End to end: a model is routed only to its owner's replicas (issue 27, build item 2).

Two EndpointSlices labelled ``seedance.io/model=echo`` in the test API server: one in the
operator's shared namespace (listed in the bridge's ``shared_namespaces``) at Triton A, one in
a namespace of the tenant globex at Triton B (a tenant running its own "echo": to anyone else,
a rogue backend). The k8s-bridge registers both, each under its owner; the real router (gRPC
and REST fronts) sends requests without a tenant header only to the shared replica, requests
naming globex only to globex's, and a request naming acme (which runs no echo) to nobody.

Run as the deployment runs: the shipped-auth nats-server, the bridge as ``k8s-bridge``, the
router as ``router``; real Triton servers (nvidia-pytriton), the test API server over HTTP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from tritonclient.grpc import InferInput
from tritonclient.grpc import aio as triton_aio
from tritonclient.utils import InferenceServerException

from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.waits import eventually
from tests.integration.k8s.bridge import SYSTEM, bridge, shipped
from tests.integration.router.test_router_reach import (
    _ready_replicas,
    _served,
    discovering_router,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TENANT_HEADER = "x-seedance-tenant"


def _slice(kube: KubeApiServer, ns: str, pod: str, fleet: str, address: str) -> None:
    """The slice the EndpointSlice controller writes for a labelled Service with one pod."""
    host, port = address.rsplit(":", 1)
    seed.endpoint_slice(
        kube,
        ns,
        f"triton-{pod}",
        service="triton",
        labels={"seedance.io/model": "echo", "seedance.io/router-fleet": fleet},
        endpoints=[
            {
                "addresses": [host],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": ns},
            }
        ],
        ports=[{"name": "grpc", "port": int(port), "protocol": "TCP"}],
    )


async def _echo(address: str, tenant: str | None) -> None:
    headers = {TENANT_HEADER: tenant} if tenant else None
    async with triton_aio.InferenceServerClient(address) as client:
        inputs = []
        for name, dtype, arr in (
            ("x_fp32", "FP32", np.full((1, 4), 1.0, dtype=np.float32)),
            ("x_int64", "INT64", np.array([[1]], dtype=np.int64)),
            ("x_bytes", "BYTES", np.array([[b"t"]], dtype=np.object_)),
        ):
            inp = InferInput(name, list(arr.shape), dtype)
            inp.set_data_from_numpy(arr)
            inputs.append(inp)
        result = await client.infer("echo", inputs, headers=headers)
        assert result.as_numpy("y_fp32").tolist() == [[1.0] * 4]


REST_BODY = {
    "inputs": [
        {"name": "x_fp32", "shape": [1, 4], "datatype": "FP32", "data": [1, 1, 1, 1]},
        {"name": "x_int64", "shape": [1, 1], "datatype": "INT64", "data": [1]},
        {"name": "x_bytes", "shape": [1, 1], "datatype": "BYTES", "data": ["t"]},
    ]
}


async def _rest_echo(rest: str, tenant: str | None) -> tuple[int, Any]:
    headers = {TENANT_HEADER: tenant} if tenant else {}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://{rest}/v2/models/echo/infer", json=REST_BODY, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_model_is_routed_only_to_its_owners_replicas(
    auth_url: str, tritons: dict[str, Any], unique: str, tmp_path: Path
) -> None:
    fleet = f"fleet-{unique}"
    a, b = tritons["a"].address, tritons["b"].address
    shared, globex = f"inference-{unique}", f"globex-{unique}"
    async with KubeApiServer(KubeApiSettings(bookmark_interval_s=0.5)) as kube:
        seed.namespace(kube, SYSTEM)
        seed.namespace(kube, shared)
        seed.namespace(kube, globex, labels={"seedance.io/tenant": "globex"})
        # "a-rogue" sorts before "z-shared": were it a candidate, it would be picked first.
        _slice(kube, shared, "z-shared", fleet, a)
        _slice(kube, globex, "a-rogue", fleet, b)
        async with (
            discovering_router(auth_url, "", fleet, bus=shipped(auth_url, "router")) as router,
            bridge(
                kube, auth_url, unique, tmp_path, user="k8s-bridge", policy_key="",
                publish_inventory=False, shared_namespaces=shared,
            ),
        ):  # fmt: skip
            mine, theirs = f"{shared}_z-shared", f"globex/{globex}_a-rogue"
            await eventually(lambda: _ready_replicas(router) == {mine: a, theirs: b}, timeout_s=90)
            assert router.gateway.replica_owners() == {mine: "", theirs: "globex"}
            registry = router._rt.registry
            address = router.gateway.address
            assert router.rest is not None
            rest = router.rest.address

            # No tenant named: the shared pool's echo, on both fronts, never globex's.
            for _ in range(3):
                await _echo(address, None)
            status, _ = await _rest_echo(rest, None)
            assert status == 200
            assert _served(registry, mine) == 4
            assert _served(registry, theirs) == 0

            # globex's own echo: its replica only.
            await _echo(address, "globex")
            status, _ = await _rest_echo(rest, "globex")
            assert status == 200
            assert _served(registry, theirs) == 2
            assert _served(registry, mine) == 4

            # acme runs no echo: nobody else's stands in for it; a bad value is refused.
            with pytest.raises(InferenceServerException) as none:
                await _echo(address, "acme")
            assert "UNAVAILABLE" in str(none.value.status())
            assert "tenant acme's model 'echo'" in str(none.value)
            status, answer = await _rest_echo(rest, "acme")
            assert status == 503
            assert "tenant acme's" in answer["error"]
            status, answer = await _rest_echo(rest, "Not.A.Tenant")
            assert status == 400
            assert TENANT_HEADER in answer["error"]
            assert _served(registry, theirs) == 2
            assert _served(registry, mine) == 4
