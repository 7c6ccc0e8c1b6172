"""The CLI's failures as a user meets them: each ends in time, in one line, non-zero (#19).

Every command is a real ``seedance`` subprocess. The servers are real: none at all (a port
nothing listens on), the shipped ``deploy/auth/nats-auth.conf`` (wrong password, a tenant the
server does not know), a bare server whose streams were never created, and a real slicer whose
quota file does not name the tenant. Before: no server meant a traceback after the connect
bound (``BusUnavailable`` was not caught), and a stream that did not exist a traceback too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from seedance.core.bus import BusSettings, set_connect_policy
from seedance.core.service import EXIT_BUS_REFUSED, EXIT_BUS_UNAVAILABLE
from seedance.sdk.cli import invoke
from seedance.testing.nats_proxy import LosingProxy
from seedance.testing.servers import NatsServer, refusing_port
from tests.integration.conftest import shipped_password
from tests.integration.sdk.conftest import TENANT, cli, running_slicer

pytestmark = pytest.mark.slow

#: Python's start-up and imports on a loaded 2-core machine, on top of any bound.
START_SLACK_S = 20.0


def seedance(*args: str, **env: str) -> tuple[int, str, str, float]:
    """The CLI with only ``env``'s NATS and Seedance variables: status, stdout, stderr, seconds."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDANCE_", "NATS_"))}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "seedance.sdk.cli", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def bare_server() -> Iterator[NatsServer]:
    server = NatsServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_no_server_at_the_url_ends_within_the_bound_naming_what_to_check(how: str) -> None:
    bound = (
        {"args": ("--connect-timeout-s", "2"), "env": {}}
        if how == "flag"
        else {"args": (), "env": {"SEEDANCE_CONNECT_TIMEOUT_S": "2"}}
    )
    with refusing_port() as port:
        url = f"nats://127.0.0.1:{port}"
        rc, out, err, took = seedance(
            "--nats-url", url, *bound["args"], "jobs", "status", "--tenant", TENANT, "--job", "j",
            **bound["env"],
        )  # fmt: skip
    assert 2 <= took < 2 + START_SLACK_S
    assert (rc, out) == (EXIT_BUS_UNAVAILABLE, "")
    line = one_line(err)
    assert line.startswith(f"seedance: could not connect to NATS at {url} within 2 s")
    assert "Check that a nats-server runs there" in line
    assert "--nats-url, --connect-timeout-s" in line


def test_a_wrong_password_is_refused_at_once_naming_the_user(auth_url: str) -> None:
    rc, out, err, took = seedance(
        "--nats-url", auth_url, "--user", f"tenant-{TENANT}", "--connect-timeout-s", "60",
        "jobs", "list", "--tenant", TENANT, NATS_PASSWORD="not-the-password",
    )  # fmt: skip
    assert took < START_SLACK_S  # well inside the 60 s bound: retrying cannot help
    assert (rc, out) == (EXIT_BUS_REFUSED, "")
    line = one_line(err)
    assert f"refused user 'tenant-{TENANT}'" in line
    assert "authorization violation" in line
    assert "--user/--password or --creds" in line


def test_a_tenant_the_server_does_not_know_is_refused_saying_how_tenants_are_added(
    auth_url: str,
) -> None:
    rc, out, err, took = seedance(
        "--nats-url", auth_url, "--user", "tenant-nobody", "--password", "guess",
        "jobs", "submit", "--tenant", "nobody", "--job", "j",
    )  # fmt: skip
    assert took < START_SLACK_S
    assert (rc, out) == (EXIT_BUS_REFUSED, "")
    line = one_line(err)
    assert "refused user 'tenant-nobody'" in line
    assert "seedance-auth add-tenant" in line


def test_streams_never_created_are_said_not_a_traceback(bare_server: NatsServer) -> None:
    for args in (("status", "--job", "j"), ("list",)):
        rc, out, err, _ = seedance(
            "--nats-url", bare_server.url, "jobs", *args[:1], "--tenant", TENANT, *args[1:]
        )
        assert (rc, out) == (1, "")
        line = one_line(err)
        assert "no stream SEEDANCE_SLICING on this server" in line
        assert "seedance admin provision" in line


async def test_a_provision_call_without_an_answer_says_to_run_provision_again(
    auth_url: str,
) -> None:
    """The server, not a service, leaves a provision call unanswered (every stream API request
    lost on the way, as a JetStream meta leader busy past the time-out does): the CLI said
    "is the service that answers running?", where none is, and nothing of what to do."""

    def stream_call(subject: str) -> bool:
        return subject.startswith("$JS.API.STREAM.")

    async with LosingProxy(auth_url, lambda _: False, stream_call) as proxy:
        done = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "seedance.sdk.cli", "--nats-url", proxy.url,
            "--user", "provisioner", "--password", shipped_password("provisioner"),
            "admin", "provision",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await done.communicate()
    assert proxy.lost_requests, "the proxy lost no stream call: the test tested nothing"
    assert (done.returncode, out) == (1, b"")
    line = one_line(err.decode())
    assert line.startswith("seedance: provision: a JetStream API call ")
    assert "had no answer from the NATS server at " in line
    assert "run `seedance admin provision` again at once" in line
    assert "running?" not in line


async def test_a_tenant_the_slicer_does_not_know_is_rejected_and_status_says_so(
    auth_url: str, tmp_path: Path
) -> None:
    quota = tmp_path / "quota.yaml"
    quota.write_text("version: 1\ntenants:\n  globex:\n    quota: {gpus: 2}\n")
    async with running_slicer(auth_url, quota_file=str(quota)):
        rc, out, err = await cli(auth_url, "jobs", "submit", "--tenant", TENANT, "--job", "q")
        assert (rc, out) == (1, "")
        assert "rejected (unknown_tenant)" in one_line(err)
        rc, out, _ = await cli(auth_url, "jobs", "status", "--tenant", TENANT, "--job", "q")
        assert rc == 0
        assert out.splitlines()[1].split() == ["state", "rejected"]
        assert "rejected (unknown_tenant): " in out


def test_a_server_seedance_cannot_use_exits_69_as_the_services_do(
    auth_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/deploy.md: the CLI ends "with the same exit statuses" as a service, and a server
    older than 2.10 (or without JetStream) is 69 there; the CLI said 1. The pinned server is new
    enough, so the session's connect policy raises the minimum instead (as test_bus does)."""
    deployed = set_connect_policy(None)
    assert deployed is not None

    def too_new(settings: BusSettings, service: str | None) -> BusSettings:
        return replace(deployed(settings, service), min_server_version=(99, 0, 0))

    set_connect_policy(too_new)
    try:
        user = f"tenant-{TENANT}"
        rc = invoke([
            "--nats-url", auth_url, "--user", user, "--password", shipped_password(user),
            "jobs", "list", "--tenant", TENANT,
        ])  # fmt: skip
    finally:
        set_connect_policy(deployed)
    out, err = capsys.readouterr()
    assert (rc, out) == (EXIT_BUS_UNAVAILABLE, "")
    assert one_line(err).startswith("seedance: nats-server ")
    assert "is too old: Seedance needs 99.0.0 or newer" in err
