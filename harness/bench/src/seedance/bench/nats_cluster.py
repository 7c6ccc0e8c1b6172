"""A loopback nats-server cluster for the scaling demo: three pinned servers on random ports (fixed
for the run, so the routes can name them and a restarted node comes back where its peers and
clients look: chosen outside the kernel's ephemeral range, `seedance.testing.ports`) with
temporary stores and full-mesh routes, killed and restarted by name, and the waits a driver of
such a cluster needs (provisioned with the peers known, a restarted node caught up), plus the
retry that measures how long a publish stalls while the cluster fails over.

Harness code: it reads the wall clock and sleeps for real (bounded by deadlines). It must not
start Seedance services (``seedance.testing.processes`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seedance.core import Bus, BusSettings
from seedance.testing.servers import nats_server_binary

__all__ = ["Cluster", "Stalls", "stream_leader", "wait_cluster", "wait_peers_current"]


async def stream_leader(bus: Bus, stream: str) -> str | None:
    """The server leading ``stream`` (``None`` while there is none, or on a single server)."""
    info = await bus.js.stream_info(stream)
    return info.cluster.leader if info.cluster else None


@dataclass
class Cluster:
    root: Path
    client_ports: list[int]
    route_ports: list[int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def urls(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def start(self, i: int) -> None:
        name = f"n{i}"
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.route_ports)
        args = [
            nats_server_binary(),
            "-a", "127.0.0.1",
            "-p", str(self.client_ports[i]),
            "-n", name,
            "-js",
            "-sd", str(self.root / name),
            "--cluster_name", "seedance-demo",
            "--cluster", f"nats://127.0.0.1:{self.route_ports[i]}",
            "--routes", routes,
        ]  # fmt: skip
        with open(self.root / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@dataclass
class Stalls:
    """Retries an operation while the cluster fails over; the longest stall after the kill."""

    kill_at: float | None = None
    longest_after_kill_s: float = 0.0
    failures: int = 0

    async def retry(
        self, op: Callable[[], Awaitable[Any]], what: str, limit_s: float = 60.0
    ) -> Any:
        first_fail: float | None = None
        end = time.monotonic() + limit_s
        while True:
            try:
                result = await op()
                break
            except Exception as exc:  # the cluster is failing over: retry, bounded
                self.failures += 1
                if first_fail is None:
                    first_fail = time.monotonic()
                if time.monotonic() > end:
                    raise RuntimeError(f"{what}: still failing after {limit_s} s") from exc
                await asyncio.sleep(0.1)  # back off between attempts; bounded by limit_s
        if first_fail is not None and self.kill_at is not None and first_fail >= self.kill_at - 1:
            self.longest_after_kill_s = max(
                self.longest_after_kill_s, time.monotonic() - first_fail
            )
        return result


async def wait_cluster(urls: str, timeout_s: float = 60.0) -> Bus:
    deadline = time.monotonic() + timeout_s
    while True:
        bus: Bus | None = None
        try:
            bus = await Bus.connect(BusSettings(url=urls, name="scale-demo"))
            # discovered peers decide R3; wait until both others are known
            for _ in range(100):
                if len(bus.nc.discovered_servers) >= 2:
                    break
                await asyncio.sleep(0.1)  # the INFO with the peers comes after the connect
            await bus.ensure_streams()
            return bus
        except Exception as exc:  # meta leader not elected yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ready in {timeout_s} s: {exc}") from exc
            if bus is not None:
                with contextlib.suppress(Exception):
                    await bus.close()
            await asyncio.sleep(0.5)  # retry the provisioning; bounded by the deadline


async def wait_peers_current(bus: Bus, stream: str, timeout_s: float) -> None:
    """Until the restarted node has caught up: both followers of ``stream`` are current."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            info = await bus.js.stream_info(stream)
            replicas = (info.cluster.replicas if info.cluster else None) or []
            if sum(1 for r in replicas if r.current and not r.offline) == 2:
                return
        await asyncio.sleep(0.5)  # the node is replaying its peers' logs; bounded
    raise TimeoutError(f"{stream}: the restarted nats-server not current in {timeout_s} s")
