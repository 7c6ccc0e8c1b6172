"""Warm-up benchmark: P95 latency of a new Triton replica's first requests, cold vs warmed up.

Each trial starts two fresh real Triton 2.51 servers (PyTriton, CPU, 127.0.0.1) and puts each
behind its own gateway as that gateway's only replica:
- cold: the gateway sends it traffic as soon as it answers ready (no warm-up);
- warm: the gateway first sends warm-up requests until latency settles (WarmupPolicy defaults).
Then N requests go client -> gateway -> replica one at a time, and the client-side latencies of
those first N requests give the P95. The client's own channel to the gateway is connected
before timing, so only the replica side is new. The order (cold first / warm first) alternates
between trials. Figures are medians over trials.

The product brief claims 1,842 ms -> 127 ms (ratio 0.069); this prints what holds here.

    nice .venv/bin/python tools/bench/bench_warmup.py --first-n 50 --trials 5

Last line: `warmup: cold_p95_ms=<n> warm_p95_ms=<n> ratio=<n>` (ratio = warm / cold).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import structlog
from prometheus_client import CollectorRegistry
from tritonclient.grpc import InferInput
from tritonclient.grpc import aio as triton_aio

from seedance.router.gateway import (
    GatewaySettings,
    LayoutConversion,
    ModelRoute,
    OipGateway,
    WarmupPolicy,
)

BRIEF_COLD_MS, BRIEF_WARM_MS = 1842.0, 127.0


def _load_triton_process() -> object:
    from seedance.testing import triton as triton_process

    return triton_process


def _models(warm_up: bool) -> tuple[ModelRoute, ...]:
    return (
        ModelRoute(name="echo", warm_up=warm_up),
        ModelRoute(
            name="nchw_stats",
            warm_up=warm_up,
            input_layouts=(
                LayoutConversion(tensor="image", client_layout="NHWC", backend_layout="NCHW"),
            ),
        ),
    )


def _p95(values_ms: list[float]) -> float:
    return float(np.percentile(values_ms, 95, method="higher"))


async def _first_requests(address: str, first_n: int, seed: int) -> list[float]:
    """Latencies (ms) of the first `first_n` requests, alternating the two models."""
    rng = np.random.default_rng(seed)
    latencies_ms = []
    async with triton_aio.InferenceServerClient(address) as client:
        await client.is_server_live()  # connect the client's own channel before timing
        for i in range(first_n):
            if i % 2 == 0:
                image = rng.standard_normal((1, 64, 64, 3)).astype(np.float32)
                tensor = InferInput("image", list(image.shape), "FP32")
                tensor.set_data_from_numpy(image)
                model, inputs = "nchw_stats", [tensor]
            else:
                inputs = []
                for name, datatype, data in (
                    ("x_fp32", "FP32", rng.standard_normal((1, 16)).astype(np.float32)),
                    ("x_int64", "INT64", rng.integers(0, 100, (1, 16), dtype=np.int64)),
                    ("x_bytes", "BYTES", np.array([[b"abc"] * 16], dtype=np.object_)),
                ):
                    tensor = InferInput(name, list(data.shape), datatype)
                    tensor.set_data_from_numpy(data)
                    inputs.append(tensor)
                model = "echo"
            start = time.perf_counter()
            await client.infer(model, inputs, client_timeout=60)
            latencies_ms.append((time.perf_counter() - start) * 1000.0)
    return latencies_ms


async def _measure(address: str, *, warm_up: bool, first_n: int, seed: int) -> dict[str, float]:
    settings = GatewaySettings(
        replicas={"new": address},
        models=_models(warm_up),
        warmup=WarmupPolicy(),
        probe_interval_s=5.0,
    )
    async with OipGateway(settings, registry=CollectorRegistry()) as gateway:
        start = time.perf_counter()
        await gateway.wait_ready(timeout_s=120)
        ready_s = time.perf_counter() - start
        latencies_ms = await _first_requests(gateway.address, first_n, seed)
    return {
        "p95_ms": _p95(latencies_ms),
        "first_ms": latencies_ms[0],
        "max_ms": max(latencies_ms),
        "median_ms": statistics.median(latencies_ms),
        "ready_s": ready_s,
    }


async def _trial(tp: Any, index: int, first_n: int, log_dir: Path) -> dict[str, dict]:
    servers = {
        kind: tp.TritonProcess(f"{kind}-{index}", log_dir=log_dir) for kind in ("cold", "warm")
    }
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready(180)
        order = ("cold", "warm") if index % 2 == 0 else ("warm", "cold")
        results = {}
        for kind in order:
            results[kind] = await _measure(
                servers[kind].address, warm_up=kind == "warm", first_n=first_n, seed=index
            )
        return results
    finally:
        for server in servers.values():
            server.terminate()
        for server in servers.values():
            server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-n", type=int, default=50, help="requests timed per replica")
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    # Progress and the gateway's logs go to stderr; stdout carries the figures.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    tp = _load_triton_process()
    trials = []
    with tempfile.TemporaryDirectory(prefix="bench-warmup-") as tmp:
        for index in range(args.trials):
            result = await _trial(tp, index, args.first_n, Path(tmp))
            trials.append(result)
            for kind in ("cold", "warm"):
                r = result[kind]
                print(
                    f"trial {index} {kind}: p95={r['p95_ms']:.1f} ms first={r['first_ms']:.1f} ms "
                    f"max={r['max_ms']:.1f} ms median={r['median_ms']:.2f} ms "
                    f"ready_after={r['ready_s']:.2f} s",
                    file=sys.stderr,
                )

    def med(kind: str, key: str) -> float:
        return statistics.median(t[kind][key] for t in trials)

    cold_p95, warm_p95 = med("cold", "p95_ms"), med("warm", "p95_ms")
    ratio = warm_p95 / cold_p95 if cold_p95 > 0 else float("nan")
    print(
        f"first {args.first_n} requests of a new replica, median of {args.trials} trials: "
        f"P95 cold {cold_p95:.1f} ms, warm {warm_p95:.1f} ms; first request cold "
        f"{med('cold', 'first_ms'):.1f} ms, warm {med('warm', 'first_ms'):.1f} ms; "
        f"max cold {med('cold', 'max_ms'):.1f} ms, warm {med('warm', 'max_ms'):.1f} ms; "
        f"warm-up took {med('warm', 'ready_s'):.2f} s "
        f"(cold admitted after {med('cold', 'ready_s'):.2f} s)"
    )
    print(
        f"brief's anchor: cold {BRIEF_COLD_MS:.0f} ms -> warm {BRIEF_WARM_MS:.0f} ms, "
        f"ratio {BRIEF_WARM_MS / BRIEF_COLD_MS:.3f}; here ratio {ratio:.3f}"
    )
    print(f"warmup: cold_p95_ms={cold_p95:.1f} warm_p95_ms={warm_p95:.1f} ratio={ratio:.3f}")
