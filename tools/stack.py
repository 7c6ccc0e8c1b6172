"""A local Seedance stack for the demo, the benchmarks and the end-to-end tests.

``NatsServer`` runs the pinned nats-server on a random loopback port with a throw-away store;
``ServiceProcesses`` runs Seedance services as real processes (``python -m seedance.<svc>``)
with their logs in a directory. Both clean up after themselves. Loopback only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["NatsServer", "ServiceProcesses", "nats_server_binary", "shipped_auth_server"]

REPO = Path(__file__).resolve().parents[1]


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
        # The server's log goes to a file, never a pipe: nobody drains a pipe while the server
        # runs, and a server that logs enough (permission violations, a chaos run) would block
        # on a full one.
        self.log_path = self.dir / "server.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        try:
            self.url = self._wait_for_port()
        except BaseException:
            self.stop()
            raise

    def _wait_for_port(self, timeout_s: float = 15.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.log_path.read_text(errors="replace")
                raise RuntimeError(f"nats-server exited at start: {err[-2000:]}")
            files = list(self.ports_dir.glob("*.ports"))
            if files:
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
        shutil.rmtree(self.dir, ignore_errors=True)


def shipped_auth_server(password: Callable[[str], str]) -> NatsServer:
    """A server running the shipped ``deploy/auth/nats-auth.conf`` (what compose mounts), with
    every user's password variable defined as ``password(user)`` and a fresh auth-callout
    issuer key, so that tests exercise exactly the permissions deployments get."""
    from seedance.core.auth_callout import new_issuer
    from seedance.events.nats_config import CALLOUT_ISSUER_VAR, password_var
    from tools.gen import gen_nats_auth

    text = (REPO / "deploy" / "auth" / "nats-auth.conf").read_text()
    users = [u.name for u in gen_nats_auth.users_from(gen_nats_auth.load_source())]
    defs = "".join(f'{password_var(u)}: "{password(u)}"\n' for u in users)
    defs += f"{CALLOUT_ISSUER_VAR}: {new_issuer().public_key.decode()}\n"
    return NatsServer(config=defs + text)


class ServiceProcesses:
    """Seedance services as processes; ``start(name, **settings)`` sets SEEDANCE_<SVC>_*."""

    def __init__(
        self, nats_url: str, logdir: Path, credentials: dict[str, str] | None = None
    ) -> None:
        self.nats_url = nats_url
        self.logdir = logdir
        #: Service name -> password: each service then connects as its own NATS user.
        self.credentials = credentials or {}
        logdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *, instance: str = "", **settings: str) -> subprocess.Popen[bytes]:
        """Start service ``name``; ``instance`` tells replicas of one service apart."""
        module = "seedance." + name.replace("-", "_")
        prefix = "SEEDANCE_" + name.upper().replace("-", "_") + "_"
        env = {
            **os.environ,
            "NATS_URL": self.nats_url,
            **(
                {"NATS_USER": name, "NATS_PASSWORD": self.credentials[name]}
                if name in self.credentials
                else {}
            ),
            prefix + "HTTP_PORT": "0",
            **{prefix + k.upper(): str(v) for k, v in settings.items()},
        }
        key = f"{name}{instance}"
        with open(self.logdir / f"{key}.log", "ab") as log:  # the child keeps its own handle
            proc = subprocess.Popen(
                [sys.executable, "-m", module], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.procs[key] = proc
        return proc

    def kill(self, key: str) -> None:
        proc = self.procs.pop(key)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self, timeout_s: float = 15.0) -> dict[str, int]:
        """SIGTERM every service (a clean drain) and return their exit codes."""
        codes: dict[str, int] = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for key, proc in self.procs.items():
            try:
                codes[key] = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[key] = proc.wait()
        self.procs.clear()
        return codes

    def log(self, key: str) -> str:
        return (self.logdir / f"{key}.log").read_text(errors="replace")


async def wait_consumer_settled(
    bus: Any, stream: str, durable: str, seq: int = 0, timeout_s: float = 60.0
) -> None:
    """Wait until ``durable`` exists and has acknowledged everything up to stream ``seq``.

    With ``seq=0``: until it exists and has nothing pending. This is how a driver knows a
    service has handled what it published (the service acks only after its effects are durable).
    """
    import asyncio

    from nats.js.errors import NotFoundError

    async with asyncio.timeout(timeout_s):
        while True:
            try:
                info = await bus.js.consumer_info(stream, durable)
            except NotFoundError:
                info = None
            if info is not None and (
                (seq and info.ack_floor.stream_seq >= seq)
                or (info.num_pending == 0 and info.num_ack_pending == 0)
            ):
                return
            await asyncio.sleep(0.01)  # polls the server's consumer state; bounded


async def wait_inventory_known(bus: Any, timeout_s: float = 60.0) -> None:
    """Wait until the collector published inventory and the slicer handled all of it."""
    import asyncio

    async with asyncio.timeout(timeout_s):
        while True:
            info = await bus.stream_info("SEEDANCE_TELEMETRY")
            if info is not None and info.state.messages:
                break
            await asyncio.sleep(0.05)  # polls the server; bounded by the timeout
    from seedance.events.subjects import telemetry

    inv = await bus.js.stream_info("SEEDANCE_TELEMETRY", subjects_filter=telemetry.INVENTORY)
    await wait_consumer_settled(
        bus, "SEEDANCE_TELEMETRY", "slicer-inventory", inv.state.last_seq, timeout_s
    )
