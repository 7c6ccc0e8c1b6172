"""`seedance-cost-ledger report` / `rightsize` log in and fail as the `seedance` CLI does.

Each command is a real ``python -m seedance.cost_ledger`` subprocess with only the NATS and
Seedance variables a test gives it, against the shipped ``deploy/auth/nats-auth.conf`` (the
operator ``admin`` by ``NATS_USER`` / ``NATS_PASSWORD``, as docs/deploy.md has it) or a port
nothing listens on. Before: both commands read only ``--nats-url`` and ``--creds``, so the
operator was refused as "no user" in a ~30-line traceback (exit 1), and with no server they
tried for 10 s whatever ``SEEDANCE_CONNECT_TIMEOUT_S`` said, then the same traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from seedance.core import Bus
from seedance.core.service import EXIT_BUS_REFUSED, EXIT_BUS_UNAVAILABLE
from seedance.cost_ledger.core.mapping import to_bus
from seedance.testing.identities import ADMIN
from seedance.testing.servers import refusing_port
from tests.integration.conftest import shipped_password
from tests.integration.ledger.test_report_cli import _line as cost_line
from tests.integration.ledger.test_report_cli import measured_lines
from tests.integration.sdk.test_cli_failures import START_SLACK_S, one_line, seedance

pytestmark = pytest.mark.slow

COMMANDS = {
    "report": ("report", "--fleet", "--format", "text"),
    "rightsize": ("rightsize", "--fleet"),
}


def ledger(*args: str, **env: str) -> tuple[int, str, str, float]:
    """The ledger's CLI with only ``env``'s NATS and Seedance variables: status, stdout,
    stderr, seconds."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDANCE_", "NATS_"))}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "seedance.cost_ledger", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


async def test_the_operator_logs_in_by_nats_user_and_password(
    admin: Bus, auth_url: str, unique: str
) -> None:
    tenant = f"l{unique}"
    lines = measured_lines(tenant)
    await admin.publish_many([(p.subject, p.event) for p in map(to_bus, lines)])
    login = {"NATS_URL": auth_url, "NATS_USER": ADMIN, "NATS_PASSWORD": shipped_password(ADMIN)}

    rc, out, err, _ = ledger(*COMMANDS["report"], **login)
    assert (rc, err) == (0, "")
    assert tenant in out

    rc, out, err, _ = ledger(*COMMANDS["rightsize"], **login)
    assert (rc, err) == (0, "")
    assert tenant in out
    assert "$3,766.80" in out  # docs/cost-ledger.md's example: a whole H100 used as a 25 % share


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_wrong_password_is_refused_at_once_in_one_line(auth_url: str, command: str) -> None:
    rc, out, err, took = ledger(
        *COMMANDS[command], NATS_URL=auth_url, NATS_USER=ADMIN,
        NATS_PASSWORD="not-the-password", SEEDANCE_CONNECT_TIMEOUT_S="60",
    )  # fmt: skip
    assert took < START_SLACK_S  # well inside the 60 s bound: retrying cannot help
    assert (rc, out) == (EXIT_BUS_REFUSED, "")
    line = one_line(err)
    assert line.startswith(f"seedance-cost-ledger {command}: NATS at {auth_url} refused user")
    assert f"refused user '{ADMIN}'" in line
    assert "authorization violation" in line
    assert "--user/--password or --creds" in line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_server_ends_within_the_connect_timeout_in_one_line(command: str) -> None:
    with refusing_port() as port:
        url = f"nats://127.0.0.1:{port}"
        rc, out, err, took = ledger(
            *COMMANDS[command], NATS_URL=url, SEEDANCE_CONNECT_TIMEOUT_S="2"
        )
    assert 2 <= took < 2 + START_SLACK_S
    assert (rc, out) == (EXIT_BUS_UNAVAILABLE, "")
    line = one_line(err)
    assert line.startswith(
        f"seedance-cost-ledger {command}: could not connect to NATS at {url} within 2 s"
    )
    assert "Check that a nats-server runs there" in line
    assert "--nats-url, --connect-timeout-s" in line


async def test_the_password_may_come_from_nats_password_file(
    admin: Bus, auth_url: str, unique: str, tmp_path: Path
) -> None:
    """``NATS_PASSWORD_FILE`` logs the commands in as it logs the services in (a node's own
    credentials, mounted): read only without ``NATS_PASSWORD``, never printed. Before, the
    ``seedance`` CLI and these commands ignored it and were refused (77)."""
    tenant = f"f{unique}"
    line = cost_line(tenant, "a", 0, 1_000)
    await admin.publish_many([(p.subject, p.event) for p in map(to_bus, [line])])
    secret = tmp_path / "nats-password"
    secret.write_text(shipped_password(ADMIN) + "\n")  # one trailing newline is not part of it
    login = {"NATS_URL": auth_url, "NATS_USER": ADMIN, "NATS_PASSWORD_FILE": str(secret)}

    rc, out, err, _ = ledger(*COMMANDS["report"], **login)
    assert (rc, err) == (0, "")
    assert tenant in out
    rc, out, err, _ = seedance("costs", "report", "--fleet", "--format", "text", **login)
    assert (rc, err) == (0, "")
    assert tenant in out

    # As for the services, NATS_PASSWORD comes first: a wrong one is refused, the file unread.
    rc, out, err, _ = ledger(*COMMANDS["report"], **login, NATS_PASSWORD="not-the-password")
    assert (rc, out) == (EXIT_BUS_REFUSED, "")
    assert "not-the-password" not in err
    assert shipped_password(ADMIN) not in err

    absent = tmp_path / "absent"
    rc, out, err, _ = ledger(*COMMANDS["report"], **{**login, "NATS_PASSWORD_FILE": str(absent)})
    assert (rc, out) == (2, "")
    assert one_line(err) == (
        f"seedance-cost-ledger report: NATS_PASSWORD_FILE={str(absent)!r}: cannot read it "
        "(No such file or directory)"
    )
