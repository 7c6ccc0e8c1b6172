"""Test API server benchmark: what one ``KubeApiServer`` sustains for the k8s-bridge's load.

N pods are created through kubernetes_asyncio (one at a time, or paced at ``--rate`` pods/s),
then bound through ``pods/binding``, while two watches follow them (one unfiltered, one with
the bridge's ``spec.schedulerName`` field selector). Client and server share one process and
event loop, so the figures are a floor for the server. The anchor is the bridge bench's load:
2,000 pods at 50 pods/s; the ratio is the unpaced create rate over 50.

    nice .venv/bin/python tools/bench/bench_kube_api.py --pods 2000

Last line: ``kube_api: create_per_s=<n> create_p99_ms=<n> bind_per_s=<n> bind_p99_ms=<n>
watch_lag_ms=<n> ratio=<n>``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from kubernetes_asyncio import client, watch

from seedance.testing.kube_api import KubeApiServer, seed

__all__ = ["main"]

ANCHOR_PODS_PER_S = 50.0
NS = "bench"


def _pod(i: int) -> client.V1Pod:
    container = client.V1Container(
        name="main",
        image="registry.example/job:1",
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"p{i}"),
        spec=client.V1PodSpec(scheduler_name="seedance", containers=[container]),
    )


async def _follow(core: client.CoreV1Api, rv: str, want: int, **kw: Any) -> float:
    """Count events until ``want``; the monotonic time of the last."""
    seen = 0
    w = watch.Watch()
    async for _ in w.stream(
        core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=600, **kw
    ):
        seen += 1
        if seen >= want:
            break
    await w.close()
    return time.perf_counter()


def _p(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] * 1000


async def _timed(calls: list[Any], rate: float) -> tuple[float, list[float]]:
    lat: list[float] = []
    start = time.perf_counter()
    for i, call in enumerate(calls):
        if rate > 0:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        t = time.perf_counter()
        await call()
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - start, lat


async def run(pods: int, rate: float) -> dict[str, float]:
    async with KubeApiServer() as api:
        seed.namespace(api, NS)
        async with client.ApiClient(client.Configuration(host=api.url)) as api_client:
            core = client.CoreV1Api(api_client)
            rv = (await core.list_namespaced_pod(NS)).metadata.resource_version
            followers = [
                asyncio.ensure_future(_follow(core, rv, 2 * pods)),
                asyncio.ensure_future(
                    _follow(core, rv, 2 * pods, field_selector="spec.schedulerName=seedance")
                ),
            ]

            def create(i: int) -> Any:
                return lambda: core.create_namespaced_pod(NS, _pod(i))

            def bind(i: int) -> Any:
                body = client.V1Binding(
                    metadata=client.V1ObjectMeta(name=f"p{i}"),
                    target=client.V1ObjectReference(kind="Node", name="n"),
                )
                return lambda: core.create_namespaced_pod_binding(
                    f"p{i}", NS, body, _preload_content=False
                )

            create_s, create_lat = await _timed([create(i) for i in range(pods)], rate)
            bind_s, bind_lat = await _timed([bind(i) for i in range(pods)], rate)
            done = time.perf_counter()
            last = max(await asyncio.wait_for(asyncio.gather(*followers), 120))
    return {
        "create_per_s": pods / create_s,
        "create_p99_ms": _p(create_lat, 0.99),
        "bind_per_s": pods / bind_s,
        "bind_p99_ms": _p(bind_lat, 0.99),
        "watch_lag_ms": max(0.0, (last - done) * 1000),
    }


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=0.0, help="pods/s (0: as fast as it goes)")
    args = parser.parse_args(argv)
    fig = await run(args.pods, args.rate)
    ratio = fig["create_per_s"] / ANCHOR_PODS_PER_S
    print(
        f"kube_api: create_per_s={fig['create_per_s']:.0f} "
        f"create_p99_ms={fig['create_p99_ms']:.2f} bind_per_s={fig['bind_per_s']:.0f} "
        f"bind_p99_ms={fig['bind_p99_ms']:.2f} watch_lag_ms={fig['watch_lag_ms']:.0f} "
        f"ratio={ratio:.1f}"
    )
    return 0
