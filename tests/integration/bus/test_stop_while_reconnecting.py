"""A service stopped while its connection is reconnecting exits 69 with one line.

docs/deploy.md: what needs the server at stop (the drain) cannot be done, so the process exits
69 after one ``service_stop_incomplete`` line. A service whose own stop needs no NATS (no
lease: telemetry-collector, node-agent, graph-compiler, router) learns it from the close
alone: `Bus.close` closes a reconnecting connection (nothing to drain) and says so
(``undrained``), which ``ServiceRuntime.close`` raises. Before, it closed quietly and the
process exited 0 as after a clean drain.
"""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from seedance.core import Bus, BusSettings, serve
from seedance.core.service import EXIT_BUS_UNAVAILABLE, ServiceRuntime
from seedance.testing.waits import eventually, stop_task
from tests.conftest import shipped_test_server
from tests.integration.conftest import shipped_password


async def test_a_lease_less_service_stopped_while_reconnecting_exits_69_with_one_line() -> None:
    server = shipped_test_server()
    admin = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    try:
        await admin.ensure_streams()  # the operator's provision
    finally:
        await admin.close()
    service = ServiceRuntime("telemetry-collector", BusSettings(url=server.url))

    async def lose_then_stop() -> None:
        await eventually(service.ready, timeout_s=30)
        server.stop()

        def reconnecting() -> bool:
            return service._bus is not None and service._bus.nc.is_reconnecting

        await eventually(reconnecting, timeout_s=30)
        await service.stop()  # what SIGTERM does

    # serve() awaited here, not in a task: asyncio re-raises a task's SystemExit out of the loop.
    stopping = asyncio.ensure_future(lose_then_stop())
    try:
        with capture_logs() as logs, pytest.raises(SystemExit) as ended:
            await serve(service)
        await stopping
    finally:
        await stop_task(stopping)
        server.stop()
    assert ended.value.code == EXIT_BUS_UNAVAILABLE
    assert [r["event"] for r in logs if r["log_level"] == "error"] == ["service_stop_incomplete"]
    assert service._bus is None  # closed all the same
