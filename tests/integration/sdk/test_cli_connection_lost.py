"""A NATS connection lost in the middle of a command: one line naming the URL, exit 69 (and a
follow stopped by Ctrl-C: 130, quietly).

The CLI runs as a real ``seedance`` subprocess under its tenant's shipped user, against a
pinned nats-server of its own running the shipped authorization, which the test stops while
the command waits (a cost stream followed, a job's answer awaited). ``--connect-timeout-s``
also bounds how long the lost connection is retried. Before: the follow waited for ever (the
client reconnected for ever and the reader sat on an empty queue), and a submit waited its
whole ``--wait-s`` and ended 1, "no answer", blaming the slicer. A Ctrl-C that landed as a
guarded call (the connect, the consumer's creation) ended was lost, and the follow ran on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from seedance.core import Bus, BusSettings
from seedance.core.service import EXIT_BUS_UNAVAILABLE
from seedance.events import new_event_id
from seedance.events.cost import CostEntry
from seedance.events.subjects import costs, jobs
from seedance.sdk.cli import invoke
from seedance.sdk.refusals import Violations
from seedance.testing.paths import REPO
from seedance.testing.servers import NatsServer
from seedance.testing.waits import eventually, last_stored
from tests.conftest import shipped_test_server
from tests.integration.conftest import shipped_password
from tests.integration.sdk.conftest import TENANT

pytestmark = pytest.mark.slow

AT = datetime(2026, 1, 5, 12, tzinfo=UTC)
#: How long the CLI tries to reach (and reach again) the server: the bound under test.
RECONNECT_S = "1"
#: Python's start-up on a loaded machine plus the bound: the command must end well inside.
END_WITHIN_S = 60.0


@contextlib.contextmanager
def ctrl_c_as_in_a_terminal() -> Iterator[None]:
    """SIGINT handled here as Python does by default (KeyboardInterrupt), as in a terminal's
    foreground, while the block runs: a child started meanwhile gets SIGINT's default action,
    and an ``asyncio.run`` here installs its own handler. A suite started where SIGINT is
    ignored (a non-interactive shell's background job, nohup) hands the ignoring on to every
    child (POSIX), whose Ctrl-C then does nothing: the test waited out END_WITHIN_S."""
    was = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if was is not None:
            signal.signal(signal.SIGINT, was)


async def seedance(url: str, *args: str) -> asyncio.subprocess.Process:
    user = f"tenant-{TENANT}"
    with ctrl_c_as_in_a_terminal():
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "seedance.sdk.cli", "--nats-url", url, "--user", user,
            "--password", shipped_password(user), "--connect-timeout-s", RECONNECT_S, *args,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(REPO),
        )  # fmt: skip


async def ended(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), timeout=END_WITHIN_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def said_lost(err: str, url: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(f"seedance: connection to NATS at {url} lost ("), lines[0]
    assert "--nats-url, --connect-timeout-s" in lines[0]


async def admin_of(server: NatsServer) -> Bus:
    admin = await Bus.connect(
        BusSettings(url=server.url, user="admin", password=shipped_password("admin"))
    )
    await admin.ensure_streams()
    return admin


async def store_entry(server: NatsServer, job_id: str) -> None:
    """One cost entry of ``job_id`` in the tenant's cost stream."""
    admin = await admin_of(server)
    try:
        await admin.publish(costs.subject(TENANT, "entry"), CostEntry(
            id=new_event_id(at=AT), at=AT, tenant=TENANT, job_id=job_id, period_start=AT,
            period_end=AT + timedelta(minutes=5), cost_micro_usd=1_000, gpu_hours_micro=83_333,
        ))  # fmt: skip
    finally:
        await admin.close()


async def following(server: NatsServer, job_id: str) -> asyncio.subprocess.Process:
    """A ``costs watch`` that has printed the one cost entry of ``job_id`` stored before it
    started: the stream was read, and the next event is awaited."""
    await store_entry(server, job_id)
    proc = await seedance(server.url, "costs", "watch", "--tenant", TENANT)
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), timeout=END_WITHIN_S)
        assert job_id.encode() in first
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc


async def test_a_cost_follow_ends_69_once_the_lost_server_is_given_up() -> None:
    server = shipped_test_server()
    proc = None
    try:
        proc = await following(server, "lost-1")
        server.stop()
        rc, out, err = await ended(proc)
        assert (rc, out) == (EXIT_BUS_UNAVAILABLE, "")
        said_lost(err, server.url)
        assert f"no reconnection for {RECONNECT_S} s, gave up" in err
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()


async def test_a_submit_waiting_for_its_answer_ends_69_not_no_answer() -> None:
    server = shipped_test_server()
    proc = None
    try:
        admin = await admin_of(server)
        try:
            proc = await seedance(
                server.url, "jobs", "submit", "--tenant", TENANT, "--job", "lost-2",
                "--wait-s", "600",
            )  # fmt: skip
            subject = jobs.subject(TENANT, "submitted")

            async def published() -> bool:
                return await last_stored(admin.js, "SEEDANCE_JOBS", subject) is not None

            await eventually(published, timeout_s=END_WITHIN_S)
        finally:
            await admin.close()
        server.stop()  # no slicer: the CLI waits for an answer that cannot come now
        rc, out, err = await ended(proc)
        assert (rc, out) == (EXIT_BUS_UNAVAILABLE, "")
        said_lost(err, server.url)
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()


async def test_a_cost_follow_stopped_by_ctrl_c_ends_130_quietly() -> None:
    """Not a lost connection, the other way a follow ends: the user's Ctrl-C (SIGINT) ends it
    with the shell's 130 and no traceback, having printed what it read."""
    server = shipped_test_server()
    proc = None
    try:
        proc = await following(server, "stopped-1")
        proc.send_signal(signal.SIGINT)
        rc, out, err = await ended(proc)
        assert (rc, out, err) == (130, "", "")
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()
        server.stop()


@pytest.mark.parametrize("guarded", [1, 2], ids=["connect", "consumer-creation"])
def test_a_ctrl_c_as_a_guarded_call_ends_is_not_lost(
    guarded: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C at the instant the ``guarded``-th call the client guards against a refused
    permission (the connect, the consumer's creation) has ended, while the guard ends its watch
    for a refusal. The SIGINT is raised in that watch's cancellation, in-process, so that
    ``asyncio.run``'s own handler cancels the command there. Before: the cancel was handed to
    the watch and swallowed with it, and the follow ran on (here it printed the entry and ended
    0 at ``--count 1``; without it, for ever: the suite's 60 s hang of the test above)."""
    server = shipped_test_server()
    try:
        asyncio.run(store_entry(server, f"interrupted-{guarded}"))
        watches = 0
        watch = Violations.next

        async def interrupted(self: Violations) -> object:
            nonlocal watches
            watches += 1
            mine = watches
            try:
                return await watch(self)
            except asyncio.CancelledError:
                if mine == guarded:
                    signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
                raise

        monkeypatch.setattr(Violations, "next", interrupted)
        user = f"tenant-{TENANT}"
        with ctrl_c_as_in_a_terminal():
            rc = invoke([
                "--nats-url", server.url, "--user", user, "--password", shipped_password(user),
                "costs", "watch", "--tenant", TENANT, "--count", "1",
            ])  # fmt: skip
    finally:
        server.stop()
    assert watches >= guarded
    assert (rc, *capsys.readouterr()) == (130, "", "")
