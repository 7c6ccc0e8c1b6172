"""Pod created -> bound, through the k8s-bridge and the slicer as processes, at a fixed rate.

The test API server (``python -m seedance.testing.kube_api``), a pinned nats-server, the slicer
and the bridge run as processes on this machine; this script creates ``--pods`` one-GPU pods
at ``--rate`` pods/s over HTTP (a node per 8 pods, so every pod fits) and follows them with
its own watch. A pod's latency is from just before its create request is sent to the watch
event that shows it bound: an upper bound on "pod created -> Binding posted" (it adds the
watch's delivery to this script). The anchor is the same path on the bus alone, measured by
the slicer benches. Not the full `make bench-k8s` (trace pods, same-placement check): the
bridge's own probe.

    python -m seedance.bench.k8s_bridge_latency --pods 2000 --rate 50

Last line: ``k8s_bridge: pods=<n> bound=<n> p50_ms=<n> p99_ms=<n> max_ms=<n> rate=<n>
slicer_p50_ms=<n> slicer_p99_ms=<n>`` (slicer: job.submitted stored -> placement stored, the
server's clock: the slicer's share of the path, the anchor).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import nats.errors
import numpy as np
import yaml

from seedance.core import Bus, BusSettings
from seedance.events import decode
from seedance.events.subjects import observed, slicing
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer

NS = "bench"
#: Pods bound before the measured ones (the bridge leads, the slicer knows every node).
_WARM = 5


def _kubeconfig(url: str, path: Path) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": {"server": url}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        "current-context": "bench",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "seedance",
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "1", "memory": "1Gi"}},
                }
            ],
        },
    }


def _node(name: str) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
            },
        },
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with http.post(url, json=body) as resp:
        if resp.status not in (200, 201):
            raise RuntimeError(f"POST {url}: {resp.status} {await resp.text()}")


class BoundWatch:
    """This script's own watch of the bench namespace's pods: when each was first bound."""

    def __init__(self, http: aiohttp.ClientSession, api: str) -> None:
        self.bound_at: dict[str, float] = {}
        self._http = http
        self._api = api
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        url = f"{self._api}/api/v1/namespaces/{NS}/pods?watch=true&timeoutSeconds=3600"
        async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
            async for line in resp.content:
                if not line.strip():
                    continue
                obj = json.loads(line)["object"]
                name = obj["metadata"]["name"]
                if (obj.get("spec") or {}).get("nodeName") and name not in self.bound_at:
                    self.bound_at[name] = time.perf_counter()


async def _wait_bound(watch: BoundWatch, names: list[str], timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline and any(n not in watch.bound_at for n in names):
        await asyncio.sleep(0.05)


async def _stored_at(bus: Bus, subject: str) -> dict[str, datetime]:
    """Per job id, when the stream stored its first event on ``subject`` (the server's clock)."""
    out: dict[str, datetime] = {}
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                return out
            job_id = str(getattr(decode(msg.data), "job_id", ""))
            out.setdefault(job_id, msg.metadata.timestamp)
    finally:
        await sub.unsubscribe()


async def _slicer_latencies_ms(url: str) -> np.ndarray:
    """job.submitted stored -> placement stored, per job: the slicer's share (the anchor)."""
    bus = await Bus.connect(BusSettings(url=url, name="bench-reader"))
    try:
        submitted = await _stored_at(bus, observed.subject("bench", "submitted"))
        placed = await _stored_at(bus, slicing.subject("bench", "placement"))
    finally:
        await bus.close()
    return np.array(
        [(placed[j] - t).total_seconds() * 1000 for j, t in submitted.items() if j in placed]
    )


def _start_kube(logdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The test API server as a process, and its URL (its first line on stdout)."""
    with open(logdir / "kube-api.log", "ab") as log:  # the child keeps its own handle
        kube = subprocess.Popen(
            [sys.executable, "-m", "seedance.testing.kube_api", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=log,
        )
    assert kube.stdout is not None
    return kube, kube.stdout.readline().decode().strip()


async def run(pods: int, rate: float, logdir: Path, nats_url: str, api: str) -> dict[str, float]:
    procs = ServiceProcesses(nats_url, logdir)
    try:
        kubeconfig = _kubeconfig(api, logdir / "kubeconfig")
        async with aiohttp.ClientSession() as http:
            for ns in (NS, "seedance-system"):
                labels = {"seedance.io/tenant": "bench"} if ns == NS else {}
                await _post(
                    http, f"{api}/api/v1/namespaces", {"metadata": {"name": ns, "labels": labels}}
                )
            for i in range((pods + _WARM) // 8 + 1):  # room for every pod, warm-ups too
                await _post(http, f"{api}/api/v1/nodes", _node(f"gpu-{i:04d}"))
            procs.start("slicer", replica="bench")
            procs.start("k8s-bridge", replica="bench", kubeconfig=str(kubeconfig))
            watch = BoundWatch(http, api)
            # warm-up: the bridge leads, the slicer knows every node
            for i in range(_WARM):
                await _post(http, f"{api}/api/v1/namespaces/{NS}/pods", _pod(f"warm-{i}"))
            await _wait_bound(watch, [f"warm-{i}" for i in range(_WARM)], 120)
            if len(watch.bound_at) < _WARM:
                raise RuntimeError("the warm-up pods were not bound: see " + str(logdir))
            sent: dict[str, float] = {}
            start = time.perf_counter()
            tasks = []
            for i in range(pods):
                due = start + i / rate
                if (wait := due - time.perf_counter()) > 0:
                    await asyncio.sleep(wait)
                name = f"pod-{i:05d}"
                sent[name] = time.perf_counter()
                tasks.append(
                    asyncio.create_task(
                        _post(http, f"{api}/api/v1/namespaces/{NS}/pods", _pod(name))
                    )
                )
            await asyncio.gather(*tasks)
            offered = pods / (time.perf_counter() - start)
            await _wait_bound(watch, list(sent), 60)
            watch.task.cancel()
            slicer_ms = await _slicer_latencies_ms(nats_url)
            unbound = [n for n in sent if n not in watch.bound_at]
            if unbound:  # kept for a look: their conditions say why
                async with http.get(f"{api}/api/v1/namespaces/{NS}/pods") as resp:
                    items = (await resp.json())["items"]
                left = [p for p in items if p["metadata"]["name"] in set(unbound)]
                (logdir / "unbound.json").write_text(json.dumps(left, indent=1))
        lat = np.array([watch.bound_at[n] - t for n, t in sent.items() if n in watch.bound_at])
        (logdir / "latencies_s.json").write_text(json.dumps(lat.tolist()))
        return {
            "pods": pods,
            "bound": len(lat),
            "p50_ms": float(np.percentile(lat, 50) * 1000) if len(lat) else -1.0,
            "p99_ms": float(np.percentile(lat, 99) * 1000) if len(lat) else -1.0,
            "max_ms": float(lat.max() * 1000) if len(lat) else -1.0,
            "rate": offered,
            "slicer_p50_ms": float(np.percentile(slicer_ms, 50)) if len(slicer_ms) else -1.0,
            "slicer_p99_ms": float(np.percentile(slicer_ms, 99)) if len(slicer_ms) else -1.0,
        }
    finally:
        procs.stop_all()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m seedance.bench.k8s_bridge_latency")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--logdir", type=Path, default=None)
    args = parser.parse_args(argv)
    logdir = args.logdir or Path(tempfile.mkdtemp(prefix="seedance-k8s-bench-"))
    logdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SEEDANCE_CONNECT_TIMEOUT_S", "30")
    nats = NatsServer()
    kube, api = _start_kube(logdir)
    try:
        r = asyncio.run(run(args.pods, args.rate, logdir, nats.url, api))
    finally:
        kube.terminate()
        kube.wait(timeout=10)
        nats.stop()
    print(f"logs: {logdir}")
    print(
        f"k8s_bridge: pods={r['pods']} bound={r['bound']} p50_ms={r['p50_ms']:.1f} "
        f"p99_ms={r['p99_ms']:.1f} max_ms={r['max_ms']:.1f} rate={r['rate']:.1f} "
        f"slicer_p50_ms={r['slicer_p50_ms']:.1f} slicer_p99_ms={r['slicer_p99_ms']:.1f}"
    )


if __name__ == "__main__":
    main()
