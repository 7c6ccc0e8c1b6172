"""The session's guard against a service run under another user than its own: a service process
started as the operator is named by the check of the server's connections (``/connz``), and one
under its own user passes it. (In-process services are refused at connect:
``tests/integration/graph/test_graph_shipped_user.py``.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from seedance.testing.identities import ADMIN, password
from seedance.testing.processes import ServiceProcesses
from seedance.testing.servers import NatsServer
from tests.conftest import check_identities, shipped_test_server


async def _connected(
    server: NatsServer, name: str, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """The open connections named ``name``, once there is one (the process started)."""
    async with asyncio.timeout(timeout_s):
        while True:
            conns = [c for c in server.connections("open") if c.get("name") == name]
            if conns:
                return conns
            await asyncio.sleep(0.1)  # polling the server's monitor, bounded by the timeout


@pytest.mark.parametrize("as_operator", [True, False])
async def test_a_service_process_under_another_user_fails_the_check(
    tmp_path: Path, as_operator: bool
) -> None:
    server = shipped_test_server()
    procs = ServiceProcesses(
        server.url,
        tmp_path,
        environment={"NATS_USER": ADMIN, "NATS_PASSWORD": password(ADMIN)} if as_operator else {},
    )
    try:
        procs.start("slicer", pool="guard", replica="a")
        (conn,) = await _connected(server, "seedance-slicer")
        assert conn["authorized_user"] == (ADMIN if as_operator else "slicer")
        if as_operator:
            with pytest.raises(AssertionError, match="'seedance-slicer' authorised as 'admin'"):
                check_identities(server, set())
        else:
            check_identities(server, set())
    finally:
        procs.stop_all()
        server.stop()
