"""Test-session fixtures shared by every tier.

Integration tests talk to a real nats-server: by default the pinned binary in the project's
virtual environment, started once per session on a random port with a temporary store; with
``--nats-url`` they run against an external server instead (the compose stack, say).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nats-url", default=None, help="use this nats-server, not a new one")


def nats_server_binary() -> str:
    exe = Path(sys.executable).parent / "nats-server"
    if exe.exists():
        return str(exe)
    found = shutil.which("nats-server")
    if not found:
        raise RuntimeError("no nats-server: run `make install` (it installs the pinned one)")
    return found


class NatsServer:
    """A nats-server process on a random loopback port with its own store."""

    def __init__(self, *extra_args: str, config: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="seedance-nats-"))
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(self.dir)]
        if config is not None:
            conf = self.dir / "server.conf"
            conf.write_text(config)
            args += ["-c", str(conf)]
        self.ports_dir = self.dir / "ports"
        self.ports_dir.mkdir()
        args += ["--ports_file_dir", str(self.ports_dir), *extra_args]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = self._wait_for_port()

    def _wait_for_port(self, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"nats-server exited at start: {err[-2000:]}")
            files = list(self.ports_dir.glob("*.ports"))
            if files:
                import json

                ports = json.loads(files[0].read_text())
                return str(ports["nats"][0])
            time.sleep(0.02)  # polling a file the server writes; bounded by the deadline
        raise RuntimeError(f"nats-server did not report its port within {timeout_s} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    external = request.config.getoption("--nats-url") or os.environ.get("SEEDANCE_TEST_NATS_URL")
    if external:
        yield external
        return
    server = NatsServer()
    try:
        yield server.url
    finally:
        server.stop()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Wait until ``await check()`` is true; fail with a TimeoutError after the deadline.

    For state the server settles asynchronously (acks are fire-and-forget messages).
    """
    import asyncio

    async with asyncio.timeout(timeout_s):
        while not await check():  # noqa: ASYNC110 - the state is the server's, no local event
            await asyncio.sleep(0.02)  # re-asks the server; bounded by the deadline


@pytest.fixture
def unique() -> str:
    """A short unique token for per-test names."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[object]:
    from seedance.core import Bus, BusSettings

    b = await Bus.connect(BusSettings(url=nats_url, name="test"))
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()
