"""A report that cannot be written is said as such, never as "cannot reach NATS".

``seedance-cost-ledger report`` and ``seedance costs report`` as real subprocesses, logged in
as the shipped operator, over a stream that holds lines: an ``--out`` that cannot be created
exits 73 (``EX_CANTCREAT``) and stdout that fails (``> /dev/full``) 74 (``EX_IOERR``), each in
one line naming where and the OS's reason; a reader that went away (``| head``) ends the
command quietly, 141. Before: every ``OSError`` of the command was reported as "cannot reach
NATS at <url>: [Errno 2] No such file or directory: ..." with 69, the status of no server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seedance.core import Bus
from seedance.cost_ledger.core.mapping import to_bus
from seedance.sdk.cli_output import EXIT_CANNOT_CREATE, EXIT_READER_GONE, EXIT_WRITE_FAILED
from seedance.testing.identities import ADMIN
from tests.integration.conftest import shipped_password
from tests.integration.ledger.test_report_cli import _line as cost_line
from tests.integration.sdk.test_cli_failures import one_line

pytestmark = pytest.mark.slow

#: Each command, the prefix of its error line, and its arguments before the connection's.
COMMANDS = {
    "ledger": ("seedance-cost-ledger report", ["seedance.cost_ledger", "report", "--fleet"]),
    "seedance": ("seedance", ["seedance.sdk.cli", "costs", "report", "--fleet"]),
}


@pytest.fixture
async def stream(admin: Bus, auth_url: str, unique: str) -> dict[str, str]:
    """Lines on the stream (more than a pipe holds, in CSV), and the operator's login."""
    lines = [cost_line(f"w{unique}", "a", w, 1_000) for w in range(2_000)]
    await admin.publish_many([(p.subject, p.event) for p in map(to_bus, lines)])
    return {"NATS_URL": auth_url, "NATS_USER": ADMIN, "NATS_PASSWORD": shipped_password(ADMIN)}


def run(command: str, *args: str, login: dict[str, str], **kw: object) -> tuple[int, str]:
    """The command with only ``login``'s NATS and Seedance variables: status and stderr."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SEEDANCE_", "NATS_"))}
    module, *rest = COMMANDS[command][1]
    done = subprocess.run(
        [sys.executable, "-m", module, *rest, "--format", "csv", *args],
        env={**base, **login}, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        **kw,  # type: ignore[call-overload]
    )  # fmt: skip
    return done.returncode, done.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_out_that_cannot_be_created_exits_73_naming_it(
    stream: dict[str, str], tmp_path: Path, command: str
) -> None:
    prog = COMMANDS[command][0]
    cases = {
        tmp_path / "absent" / "r.csv": "No such file or directory",
        tmp_path: "Is a directory",
    }
    for out, reason in cases.items():
        rc, err = run(command, "--out", str(out), login=stream, stdout=subprocess.DEVNULL)
        assert rc == EXIT_CANNOT_CREATE, err
        assert one_line(err) == f"{prog}: cannot write --out {out}: {reason}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_stdout_that_fails_exits_74_and_one_that_closed_quietly(
    stream: dict[str, str], command: str
) -> None:
    prog = COMMANDS[command][0]
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        rc, err = run(command, login=stream, stdout=full)
    assert rc == EXIT_WRITE_FAILED, err
    assert one_line(err) == f"{prog}: cannot write to stdout: No space left on device"

    read, write = os.pipe()
    os.close(read)  # the reader went away (`| head` once it has its lines): EPIPE
    try:
        rc, err = run(command, login=stream, stdout=write)
    finally:
        os.close(write)
    assert (rc, err) == (EXIT_READER_GONE, "")
