"""``make demo`` on a server of the user's (``NATS_URL``) that runs the shipped users and was
never provisioned: the demo provisions it as the ``provisioner``, as compose and the Kubernetes
Job do (so the shipped grants are proved enough for it), before any service starts (a service's
user may not create a stream: it would wait for ever)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.testing.identities import password
from seedance.testing.paths import REPO
from seedance.testing.servers import shipped_auth_server

pytestmark = pytest.mark.slow

_PLACED = re.compile(r"jobs placed (\d+) of (\d+)")


async def test_the_demo_provisions_a_users_server_before_its_services_start(
    tmp_path: Path,
) -> None:
    server = shipped_auth_server(password, provisioned=False)
    try:
        run = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tools.demo", "--jobs", "20", "--node-every", "150",
             "--seed", "7", "--inference-requests", "0", "--no-compile",
             "--out", str(tmp_path / "demo")],
            cwd=REPO, env={**os.environ, "NATS_URL": server.url}, capture_output=True,
            text=True, timeout=280,
        )  # fmt: skip
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    using = f"nats    using {server.url} (provisioned as provisioner)"
    assert using in run.stdout, run.stdout[:2000]
    placed = _PLACED.search(run.stdout)
    assert placed, run.stdout
    assert placed[1] == placed[2] == "20", placed[0]
