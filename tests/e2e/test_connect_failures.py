"""A service started as a user would, against a bus that is not there or refuses it.

Each test runs the real slicer process (``python -m seedance.slicer``, the same runtime and
``serve()`` as every service) and asserts what the user sees: the exit status, one structured
line saying what to check (naming the URL and the user), within the connect bound, no stdlib
tracebacks; SIGTERM honoured while it is still connecting; ``/healthz`` answering 503 meanwhile;
a misspelt setting refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from seedance.core.service import EXIT_BUS_REFUSED, EXIT_BUS_UNAVAILABLE
from seedance.testing.servers import NatsServer, refusing_port

#: Python's start-up and imports on a loaded 2-core machine, on top of the connect bound.
START_SLACK_S = 20.0


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A NATS URL nothing answers at for the test: its port held bound, never listening."""
    with refusing_port() as port:
        yield f"nats://127.0.0.1:{port}"


class Slicer:
    """``python -m seedance.slicer`` as a user starts it, its HTTP endpoint on any free port
    (``HTTP_PORT=0``: it binds, then says where in its ``http_listening`` line, so no port is
    read, released and raced for), its output drained line by line on a thread: a test waits
    for the line it needs and reads the rest once the process ends (a pipe nobody reads
    would block the service)."""

    def __init__(self, nats_url: str, **env: str) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDANCE_", "NATS_"))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "seedance.slicer"],
            env={**base, "NATS_URL": nats_url, "SEEDANCE_SLICER_HTTP_PORT": "0", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._ended = False  # the output is closed: the process is gone
        self._more = threading.Condition()
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as out:
            for line in out:
                with self._more:
                    self.lines.append(line)
                    self._more.notify_all()
        with self._more:
            self._ended = True
            self._more.notify_all()

    def _listening_port(self) -> int | None:
        for line in self.lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the test that reads it fails on an unstructured line
            if isinstance(record, dict) and record.get("event") == "http_listening":
                return urllib.parse.urlsplit(record["metrics_url"]).port
        return None

    def http_port(self, timeout_s: float) -> int:
        """Where ``/healthz`` answers, as the ``http_listening`` line says."""
        with self._more:
            self._more.wait_for(
                lambda: self._ended or self._listening_port() is not None, timeout_s
            )
            port = self._listening_port()
            if port is None:
                pytest.fail(f"no http_listening line within {timeout_s} s:\n{self.output()}")
            return port

    def output(self) -> str:
        return "".join(self.lines)[-3000:]

    def wait(self, timeout_s: float) -> tuple[int, list[str]]:
        """Exit status and every output line, once it ended (killed after ``timeout_s``)."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"still running after {timeout_s} s:\n{self.output()}")
        self._drain.join(timeout=10)  # the pipe closes with the process
        assert not self._drain.is_alive(), "its output stayed open after it exited"
        return code, [ln for ln in self.lines if ln.strip()]

    def finish(self, timeout_s: float) -> tuple[int, list[dict[str, Any]]]:
        """Exit status and log lines; every line must be one JSON object (structured only)."""
        code, lines = self.wait(timeout_s)
        records = []
        for ln in lines:
            try:
                records.append(json.loads(ln))
            except json.JSONDecodeError:
                pytest.fail(f"an unstructured log line: {ln!r}\nwhole output:\n{self.output()}")
        return code, records

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_http(
    proc: subprocess.Popen[str], port: int, path: str, timeout_s: float
) -> tuple[int, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the service exited while it should be connecting"
        try:
            return http_get(port, path)
        except (ConnectionError, urllib.error.URLError):
            time.sleep(0.1)  # the endpoint is not bound yet; bounded by the deadline
    pytest.fail(f"nothing answered on :{port}{path} within {timeout_s} s")


@pytest.fixture
def password_server() -> Iterator[NatsServer]:
    server = NatsServer(
        config='authorization { users = [ {user: "alice", password: "right-one"} ] }\n'
    )
    try:
        yield server
    finally:
        server.stop()


def test_no_server_at_the_url_ends_within_the_bound_with_one_line(refused_url: str) -> None:
    url = refused_url
    started = time.monotonic()
    slicer = Slicer(url, SEEDANCE_CONNECT_TIMEOUT_S="2")
    code, records = slicer.finish(timeout_s=2 + START_SLACK_S)
    assert time.monotonic() - started < 2 + START_SLACK_S
    assert code == EXIT_BUS_UNAVAILABLE == 69
    last = records[-1]
    assert last["event"] == "nats_unavailable"
    assert last["level"] == "error"
    assert f"could not connect to NATS at {url} within 2 s" in last["reason"]
    assert "Check that a nats-server runs there" in last["reason"]
    assert "NATS_URL" in last["reason"]
    # The attempts in between are one warning, not a line per retry (nor tracebacks); before
    # them, where /healthz answers (it is up while connecting).
    assert [r["event"] for r in records] == [
        "http_listening",
        "nats_connect_retrying",
        "nats_unavailable",
    ]


def test_wrong_password_is_refused_at_once_naming_the_user(password_server: NatsServer) -> None:
    started = time.monotonic()
    slicer = Slicer(
        password_server.url,
        NATS_USER="alice",
        NATS_PASSWORD="wrong",
        SEEDANCE_CONNECT_TIMEOUT_S="60",
    )
    code, records = slicer.finish(timeout_s=START_SLACK_S)
    # Well inside the 60 s bound: retrying a wrong password cannot help.
    assert time.monotonic() - started < START_SLACK_S
    assert code == EXIT_BUS_REFUSED == 77
    listening, line = records  # where /healthz answers, then why it ends
    assert listening["event"] == "http_listening"
    assert line["event"] == "nats_unavailable"
    assert f"NATS at {password_server.url} refused user 'alice'" in line["reason"]
    assert "authorization violation" in line["reason"]
    assert "NATS_USER / NATS_PASSWORD" in line["reason"]


def test_sigterm_while_connecting_exits_promptly_and_healthz_says_connecting(
    refused_url: str,
) -> None:
    url = refused_url
    slicer = Slicer(url, SEEDANCE_CONNECT_TIMEOUT_S="120")
    try:
        port = slicer.http_port(timeout_s=START_SLACK_S)
        status, body = wait_http(slicer.proc, port, "/healthz", timeout_s=START_SLACK_S)
        assert (status, body) == (503, f"not ready: connecting to NATS at {url}\n")
        assert http_get(port, "/readyz")[0] == 503
        slicer.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code, records = slicer.finish(timeout_s=10)
        assert time.monotonic() - sent < 10
    finally:
        slicer.kill()
    assert code == 0
    assert records[-1]["event"] == "service_stopped_while_starting"


def test_a_misspelt_setting_is_refused_naming_the_right_one() -> None:
    slicer = Slicer("nats://127.0.0.1:1", SEEDANCE_SLICER_POLCY="best_fit")
    code, lines = slicer.wait(timeout_s=START_SLACK_S)
    assert code == 1
    (line,) = lines
    assert line.startswith(
        "unknown setting SEEDANCE_SLICER_POLCY (did you mean SEEDANCE_SLICER_POLICY?)"
    )


def test_sigterm_while_reconnecting_exits_within_the_grace_period_in_structured_lines() -> None:
    """NATS goes away under a running service; SIGTERM still ends it, inside Kubernetes' 30 s.

    What needs the server at stop (the slicer's lease, the drain) cannot be done: the exit
    status says so (69) and one line why, and the lease lapses after its TTL.
    """
    server = NatsServer()
    slicer = Slicer(server.url)
    try:
        deadline = time.monotonic() + START_SLACK_S
        port = slicer.http_port(timeout_s=START_SLACK_S)
        while wait_http(slicer.proc, port, "/readyz", timeout_s=START_SLACK_S)[0] != 200:
            assert time.monotonic() < deadline, "never ready"
            time.sleep(0.1)  # polling readiness; bounded by the deadline
        server.stop()
        while http_get(port, "/readyz")[0] != 503:
            assert time.monotonic() < deadline + 10, "still ready with no server"
            time.sleep(0.1)  # the client notices the closed socket; bounded
        assert http_get(port, "/healthz")[0] == 200  # alive: a restart would not bring NATS back
        slicer.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code, records = slicer.finish(timeout_s=30)
        assert time.monotonic() - sent < 30
    finally:
        server.stop()
        slicer.kill()
    assert code == EXIT_BUS_UNAVAILABLE
    assert records[-1]["event"] == "service_stop_incomplete"
    # The reconnect loop's failures are one line, not one per attempt.
    assert sum(r["event"] == "nats_error" for r in records) <= 2
