"""`make demo`'s inference section: echo requests routed by the router to two real Triton
servers (CPU, from nvidia-pytriton), one killed midway; each answer checked, latencies and the
router's decisions (by replica and reason) reported. Must not start the other services: the
demo's `ServiceProcesses` is handed in, and the router is started here.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import Any

from nats.aio.msg import Msg

from seedance.bench.demo_console import say
from seedance.core import Bus
from seedance.events import decode
from seedance.events.routing import RoutingDecision
from seedance.events.subjects import routing
from seedance.testing.identities import ADMIN, as_user
from seedance.testing.processes import ServiceProcesses

__all__ = ["inference_phase"]


async def _wait_model_ready(client: Any, model: str) -> None:
    async with asyncio.timeout(120):
        while True:
            try:
                if await client.is_model_ready(model):
                    return
            except Exception:
                pass
            await asyncio.sleep(0.2)  # the router is starting and warming its replicas


class _EchoLoad:
    """Echo requests through the router: each answer checked, latencies of the good ones."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.ok = 0
        self.failed = 0
        self.latencies: list[float] = []

    async def one(self, i: int) -> None:
        import numpy as np

        from seedance.testing.triton import echo_request

        inputs, x = echo_request(i, b"demo")
        t0 = time.perf_counter()
        try:
            res = await self.client.infer("echo", inputs, client_timeout=30)
            assert np.array_equal(res.as_numpy("y_fp32"), x)
            self.ok += 1
            self.latencies.append((time.perf_counter() - t0) * 1000)
        except Exception as exc:
            self.failed += 1
            say(f"  request {i} failed: {exc}")

    def report(self, requests: int) -> None:
        latencies = sorted(self.latencies)
        p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else 0.0
        say(
            f"  {self.ok} of {requests} requests answered correctly, {self.failed} failed; "
            f"latency p50 {latencies[len(latencies) // 2] if latencies else 0:.1f} ms, "
            f"p95 {p95:.1f} ms"
        )


async def inference_phase(url: str, procs: ServiceProcesses, requests: int) -> int:
    """Route real inference through the router to two real Triton servers; kill one midway."""
    import tritonclient.grpc.aio as grpcclient

    from seedance.testing.triton import TritonProcess

    say("")
    say("Inference: the router in front of two real Triton servers (CPU, from nvidia-pytriton)")
    tritons = {n: TritonProcess(n, log_dir=procs.logdir) for n in ("triton-a", "triton-b")}
    for t in tritons.values():
        t.start()
    try:
        for t in tritons.values():
            await asyncio.to_thread(t.wait_ready, 180.0)
        procs.start(  # both fronts on any free port: its gateway_started line says where
            "router",
            listen_address="127.0.0.1:0",
            rest_address="127.0.0.1:0",
            replicas=",".join(f"{n}={t.address}" for n, t in tritons.items()),
            models="echo",
            forecast_interval_s="0.5",
        )
        bus = await Bus.connect(as_user(url, ADMIN, name="seedance-demo-router"))  # the operator
        decisions: dict[tuple[str, str], int] = defaultdict(int)

        async def on_decision(msg: Msg) -> None:
            ev = decode(msg.data, RoutingDecision)
            decisions[(ev.replica, ev.reason)] += 1

        await bus.subscribe(routing.subject("echo", "decision"), on_decision)
        started = await procs.wait_logged("router", "gateway_started")
        client = grpcclient.InferenceServerClient(str(started["address"]))
        await _wait_model_ready(client, "echo")
        load = _EchoLoad(client)
        killed_at = requests // 2
        for start in range(0, requests, 8):
            if start <= killed_at < start + 8:
                tritons["triton-b"].kill()
                say(f"  killed triton-b after {start} requests")
            await asyncio.gather(*(load.one(i) for i in range(start, min(requests, start + 8))))
        await client.close()
        await asyncio.sleep(0.5)  # the router flushes its decision queue every 100 ms
        await bus.close()
        load.report(requests)
        for (replica, reason), n in sorted(decisions.items()):
            say(f"  routed to {replica:<9} {n:4d}  ({reason})")
        return 0 if load.failed == 0 else 1
    finally:
        for t in tritons.values():
            t.stop()
