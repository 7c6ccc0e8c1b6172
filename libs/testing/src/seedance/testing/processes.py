"""Seedance services as real processes (``python -m seedance.<svc>``) for the end-to-end tests,
the benches and the demo, each with its log in a file of one directory (never a pipe: nobody
drains it). ``stop_all`` drains them with SIGTERM and reports their exit codes. Each connects as
its own shipped NATS user (``NATS_USER`` / ``NATS_PASSWORD``), with its test password unless the
caller hands others.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from seedance.events.node_permissions import FLEET_REPLAYER, TELEMETRY_REPLAYER
from seedance.testing.identities import password, service_user, users
from seedance.testing.waits import eventually

__all__ = ["ServiceProcesses"]


class ServiceProcesses:
    """Seedance services as processes; ``start(name, **settings)`` sets SEEDANCE_<SVC>_*."""

    def __init__(
        self,
        nats_url: str,
        logdir: Path,
        credentials: dict[str, str] | None = None,
        *,
        detach: bool = False,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.nats_url = nats_url
        self.logdir = logdir
        #: Variables every service gets that are none of its settings (``OTEL_*``, say).
        self.environment = dict(environment or {})
        #: Each service in a session of its own: it outlives this process (`make local-stack`).
        self.detach = detach
        #: Service name -> password: each service then connects as its own NATS user. By
        #: default every service's shipped user with its test password (``identities``).
        self.credentials = (
            credentials
            if credentials is not None
            else {u: password(u) for u in users() if service_user(u) is not None}
        )
        logdir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *, instance: str = "", **settings: str) -> subprocess.Popen[bytes]:
        """Start service ``name``; ``instance`` tells replicas of one service apart."""
        module = "seedance." + name.replace("-", "_")
        prefix = "SEEDANCE_" + name.upper().replace("-", "_") + "_"
        # The collector replaying a fleet (its default source) as a replaying collector's user
        # in the credentials (`fleet-replayer` first, else compose's `telemetry-replayer`): the
        # shipped `telemetry-collector` (a real node's) follows no decision.
        replay = name == "telemetry-collector" and settings.get("source", "replay") == "replay"
        replayers = [u for u in (FLEET_REPLAYER, TELEMETRY_REPLAYER) if u in self.credentials]
        user = replayers[0] if replay and replayers else name
        env = {
            **os.environ,
            "NATS_URL": self.nats_url,
            **(
                {"NATS_USER": user, "NATS_PASSWORD": self.credentials[user]}
                if user in self.credentials
                else {}
            ),
            prefix + "HTTP_PORT": "0",
            **self.environment,
            **{prefix + k.upper(): str(v) for k, v in settings.items()},
        }
        key = f"{name}{instance}"
        with open(self.logdir / f"{key}.log", "ab") as log:  # the child keeps its own handle
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self.detach,
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

    def logged(self, key: str, event: str) -> dict[str, Any] | None:
        """``key``'s first log record of ``event`` (where a server it runs on port 0 says it
        listens, say); None before that line is written."""
        for line in self.log(key).splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a library's own print, not a log record
            if isinstance(record, dict) and record.get("event") == event:
                return record
        return None

    async def wait_logged(self, key: str, event: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """`logged`, once written (``TimeoutError`` naming the line after ``timeout_s``)."""
        await eventually(
            lambda: self.logged(key, event) is not None, timeout_s, what=f"{key}'s {event} line"
        )
        record = self.logged(key, event)
        assert record is not None  # a log file is only appended to
        return record

    def metrics_url(self, key: str) -> str | None:
        """Where ``key`` serves ``/metrics``, as its ``http_listening`` line says (its port is
        any free one: ``start`` sets ``HTTP_PORT=0``); None before that line is written."""
        record = self.logged(key, "http_listening")
        return None if record is None else str(record["metrics_url"])
