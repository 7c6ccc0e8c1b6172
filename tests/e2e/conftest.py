"""End-to-end fixtures: Seedance services as real processes against the session's nats-server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.stack import ServiceProcesses

SERVICES = ("telemetry-collector", "slicer", "cost-ledger")


async def wait_for_consumers(
    nats_url: str, *durables: tuple[str, str], timeout_s: float = 30.0
) -> None:
    """Wait until the services have provisioned the streams and bound their durables."""
    import asyncio

    from nats.js.errors import NotFoundError

    from seedance.core import Bus, BusSettings

    bus = await Bus.connect(BusSettings(url=nats_url))
    try:
        async with asyncio.timeout(timeout_s):
            for stream, durable in durables:
                while True:
                    try:
                        await bus.js.consumer_info(stream, durable)
                        break
                    except NotFoundError:
                        await asyncio.sleep(0.05)  # polling the server, bounded by the timeout
    finally:
        await bus.close()


@pytest.fixture
def services(nats_url: str, tmp_path: Path) -> Iterator[ServiceProcesses]:
    procs = ServiceProcesses(nats_url, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def node_csv(tmp_path: Path) -> Callable[[int], Path]:
    def make(nodes: int, gpus: int = 2, model: str = "T4") -> Path:
        path = tmp_path / "nodes.csv"
        rows = ["sn,cpu_milli,memory_mib,gpu,model"]
        rows += [f"e2e-node-{i},32000,131072,{gpus},{model}" for i in range(nodes)]
        path.write_text("\n".join(rows) + "\n")
        return path

    return make
