"""A consolidation move as a user sees it (issue 30): ``seedance jobs submit --movable``, then
``seedance jobs status`` says the job was moved (reason ``consolidation``, and why) and where it
runs now. A real nats-server with the shipped authorization, the slicer under its own user,
every command a ``seedance`` subprocess under ``tenant-acme``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from seedance.core import Bus, BusSettings
from seedance.events import new_event_id
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory
from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password
from tests.integration.sdk.conftest import TENANT, cli, running_slicer

pytestmark = pytest.mark.slow


async def test_status_shows_a_consolidation_move_and_the_new_placement(auth_url: str) -> None:
    mover, filler, other = (f"{p}-{uuid.uuid4().hex[:6]}" for p in ("mover", "filler", "other"))
    async with running_slicer(auth_url, consolidate_interval_s=1e-6) as node_a:
        submit = ("jobs", "submit", "--tenant", TENANT)
        assert (await cli(auth_url, *submit, "--job", filler))[0] == 0
        assert (await cli(auth_url, *submit, "--job", mover, "--movable"))[0] == 0
        # A second node joins; a job lands there, so it is busy, with room for one move.
        node_b = f"cli-node-b-{uuid.uuid4().hex[:6]}"
        admin = await Bus.connect(
            BusSettings(url=auth_url, user="admin", password=shipped_password("admin"))
        )
        try:
            inv = NodeInventory(
                id=new_event_id(), at=datetime.now(UTC), node=node_b, cpu_milli=32_000,
                memory_mib=131_072,
                gpus=[GpuInfo(index=i, model="T4", mem_total_mib=16_000) for i in range(4)],
            )  # fmt: skip
            await admin.publish(telemetry.inventory(node_b), inv)
        finally:
            await admin.close()

        # Three GPUs: only node B holds them (waiting, not refused, until the slicer knows it).
        assert (await cli(auth_url, *submit, "--job", other, "--gpus", "3", "--no-wait"))[0] == 0

        async def placed_on_b() -> bool:
            rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", other)
            return rc == 0 and f"placed on {node_b}" in out

        await eventually(placed_on_b, 30)
        # The filler ends: the mover alone holds half of node A, which empties onto node B.
        assert (await cli(auth_url, "jobs", "finish", "--tenant", TENANT, "--job", filler))[0] == 0

        async def moved() -> bool:
            rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", mover)
            return rc == 0 and f"placed on {node_b}" in out

        await eventually(moved, 30)
        rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", mover)
        assert rc == 0
        assert f"preempted  on {node_a} at " in out
        assert "(consolidation)" in out
        assert f"consolidation: node {node_a} is being emptied" in out
        rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", other)
        assert "preempted" not in out  # only the job that said it is movable moved
