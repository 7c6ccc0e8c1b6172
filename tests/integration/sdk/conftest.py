"""The SDK's integration fixtures: a real slicer under its own shipped user, the CLI as a process.

``slicer_up`` runs a `SlicerService` in-process on the shipped-auth server (``auth_url``) with
one node of two T4 GPUs it knows from an inventory; ``cli`` runs ``python -m seedance.sdk.cli``
as a subprocess under a tenant's shipped user, as a user would.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from seedance.core import Bus, BusSettings, ServiceRuntime, WallClock
from seedance.events import new_event_id
from seedance.events.subjects import telemetry
from seedance.events.telemetry import GpuInfo, NodeInventory
from seedance.slicer.service import SlicerService
from seedance.slicer.settings import SlicerSettings
from seedance.testing.paths import REPO
from tests.conftest import serving
from tests.integration.conftest import shipped_password

#: The tenant the CLI runs as (``tenant-acme``, listed in the shipped users).
TENANT = "acme"


@contextlib.asynccontextmanager
async def running_slicer(auth_url: str, **settings: Any) -> AsyncIterator[str]:
    """A slicer under its shipped user (``settings``: more `SlicerSettings`), knowing one node of
    two T4s; yields the node's name."""
    admin = await Bus.connect(
        BusSettings(url=auth_url, user="admin", password=shipped_password("admin"))
    )
    try:  # closed on a failure before the slicer starts too: left to the GC, it fails the next test
        await admin.ensure_streams()
        node = f"cli-node-{uuid.uuid4().hex[:6]}"
        inv = NodeInventory(
            id=new_event_id(),
            at=datetime.now(UTC),
            node=node,
            cpu_milli=32_000,
            memory_mib=131_072,
            gpus=[GpuInfo(index=i, model="T4", mem_total_mib=16_000) for i in range(2)],
        )
        await admin.publish(telemetry.inventory(node), inv)
        runtime = ServiceRuntime(
            "slicer", BusSettings(url=auth_url, user="slicer", password=shipped_password("slicer"))
        )
        config = SlicerSettings(
            pool=f"cli{uuid.uuid4().hex[:6]}", replica="a", lease_ttl_s=1.5, **settings
        )
        async with serving(SlicerService.build(runtime, WallClock(), config)):
            yield node
    finally:
        await admin.close()


@pytest.fixture
async def slicer_up(auth_url: str) -> AsyncIterator[str]:
    """The slicer, running; yields the name of the one node it knows."""
    async with running_slicer(auth_url) as node:
        yield node


async def cli(url: str, *args: str, user: str = f"tenant-{TENANT}") -> tuple[int, str, str]:
    """``seedance --nats-url url --user user --password <its shipped one> *args``: the exit
    status, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "seedance.sdk.cli", "--nats-url", url,
        "--user", user, "--password", shipped_password(user), *args,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(REPO),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
