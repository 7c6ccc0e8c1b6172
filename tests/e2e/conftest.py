"""End-to-end fixtures: Seedance services as real processes, each test on a nats-server of its own.

A whole stack reads its streams from the start (the slicer's durable replays every job event), so
an end-to-end test gets a fresh server rather than the session's, where other tests' jobs would
queue ahead of its own. With ``--nats-url`` the external server is used as it is. Either runs the
shipped authorization: each service process connects as its own user (``ServiceProcesses``), and
after the test the server's connections are checked for a service under another user.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from seedance.testing.processes import ServiceProcesses
from tests.conftest import nats_server_url


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from nats_server_url(request.config.getoption("--nats-url"))


SERVICES = ("telemetry-collector", "slicer", "cost-ledger")


async def wait_for_consumers(
    nats_url: str, *durables: tuple[str, str], timeout_s: float = 30.0
) -> None:
    """Wait until the services have provisioned the streams and bound their durables."""
    from seedance.core import Bus, BusSettings
    from seedance.testing.waits import wait_consumers_bound

    bus = await Bus.connect(BusSettings(url=nats_url))
    try:
        await wait_consumers_bound(bus, *durables, timeout_s=timeout_s)
    finally:
        await bus.close()


async def wait_until_consumed(
    nats_url: str, stream: str, durable: str, subject: str, timeout_s: float = 30.0
) -> None:
    """Wait until ``subject`` has a message in ``stream`` and ``durable`` has acknowledged it.

    A service's start-up output (the collector's inventory) must have been read by its consumer
    (the slicer) before a test acts on it; the two processes start in any order.
    """
    from nats.js.errors import NotFoundError

    from seedance.core import Bus, BusSettings
    from seedance.testing.waits import eventually

    bus = await Bus.connect(BusSettings(url=nats_url))

    async def consumed() -> bool:
        try:
            seq = (await bus.js.get_last_msg(stream, subject)).seq
            info = await bus.js.consumer_info(stream, durable)
        except NotFoundError:
            return False  # not published or not bound yet
        return info.ack_floor is not None and (info.ack_floor.stream_seq or 0) >= seq

    try:
        # eventually's deadline, not one cancel: both reads are nats requests (see its module)
        await eventually(
            consumed, timeout_s, what=f"{durable} acknowledged {subject}", interval_s=0.05
        )
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
