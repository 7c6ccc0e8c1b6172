"""Router REST/gRPC latency: what the gateway adds in front of one real Triton replica.

Starts one real Triton 2.51 server (PyTriton, CPU, 127.0.0.1) and one gateway (`OipGateway`
with its `RestGateway`) whose only replica it is, then sends the same `echo` request N times,
one at a time, four ways: Triton's own gRPC, the router's gRPC, Triton's own KServe v2 REST,
the router's REST. Each client's connection is opened and used once before timing. Figures are
client-side latencies (P50, P95); the ratios are router / Triton for the same protocol, so the
anchor is measured in the same run.

    nice .venv/bin/python tools/bench/bench_router_reach.py --requests 500

Last line: `router-reach: grpc_p50_ms=<n> rest_p50_ms=<n> grpc_ratio=<n> rest_ratio=<n>`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import structlog
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferInput
from tritonclient.grpc import aio as triton_aio

from seedance.router.gateway import (
    GatewaySettings,
    ModelRoute,
    OipGateway,
    RestGateway,
    WarmupPolicy,
)

__all__ = ["main"]

_BODY = {
    "inputs": [
        {"name": "x_fp32", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))},
        {"name": "x_int64", "shape": [1, 1], "datatype": "INT64", "data": [1]},
        {"name": "x_bytes", "shape": [1, 1], "datatype": "BYTES", "data": ["tag"]},
    ]
}


def _grpc_inputs() -> list[InferInput]:
    inputs = []
    for name, dtype, arr in (
        ("x_fp32", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16)),
        ("x_int64", "INT64", np.array([[1]], dtype=np.int64)),
        ("x_bytes", "BYTES", np.array([[b"tag"]], dtype=np.object_)),
    ):
        inp = InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    return inputs


async def _timed(n: int, call: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    await call()  # connect
    latencies_ms = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        latencies_ms.append((time.perf_counter() - start) * 1000.0)
    return float(np.percentile(latencies_ms, 50)), float(np.percentile(latencies_ms, 95))


async def _grpc(address: str, n: int) -> tuple[float, float]:
    inputs = _grpc_inputs()
    async with triton_aio.InferenceServerClient(address) as client:

        async def call() -> None:
            result = await client.infer("echo", inputs)
            assert result.as_numpy("y_fp32") is not None

        return await _timed(n, call)


async def _rest(base: str, n: int) -> tuple[float, float]:
    async with aiohttp.ClientSession() as http:

        async def call() -> None:
            async with http.post(f"{base}/v2/models/echo/infer", json=_BODY) as r:
                assert r.status == 200, await r.text()
                await r.read()

        return await _timed(n, call)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="requests timed per path")
    args = parser.parse_args()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    from seedance.testing.triton import TritonProcess

    with tempfile.TemporaryDirectory(prefix="bench-router-reach-") as tmp:
        triton = TritonProcess("bench", log_dir=Path(tmp))
        triton.start()
        try:
            triton.wait_ready(180.0)
            settings = GatewaySettings(
                replicas={"t": triton.address},
                models=(ModelRoute(name="echo"),),
                warmup=WarmupPolicy(window=3, tolerance=0.5, min_requests=6, max_requests=30),
            )
            async with OipGateway(settings, registry=CollectorRegistry()) as gateway:
                await gateway.wait_ready(timeout_s=60)
                rest = RestGateway(gateway, listen_address="127.0.0.1:0")
                await rest.start()
                try:
                    figures = {
                        "triton_grpc": await _grpc(triton.address, args.requests),
                        "router_grpc": await _grpc(gateway.address, args.requests),
                        "triton_rest": await _rest(
                            f"http://127.0.0.1:{triton.http_port}", args.requests
                        ),
                        "router_rest": await _rest(f"http://{rest.address}", args.requests),
                    }
                finally:
                    await rest.stop()
        finally:
            triton.stop()
    for path, (p50, p95) in figures.items():
        print(f"{path}: p50={p50:.2f} ms p95={p95:.2f} ms ({args.requests} requests)")
    grpc_ratio = figures["router_grpc"][0] / figures["triton_grpc"][0]
    rest_ratio = figures["router_rest"][0] / figures["triton_rest"][0]
    print(
        f"router-reach: grpc_p50_ms={figures['router_grpc'][0]:.2f} "
        f"rest_p50_ms={figures['router_rest'][0]:.2f} grpc_ratio={grpc_ratio:.2f} "
        f"rest_ratio={rest_ratio:.2f}"
    )
