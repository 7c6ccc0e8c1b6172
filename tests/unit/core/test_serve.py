"""`seedance.core.service.serve` ends the process however the service's start and stop go.

A service that refuses to start as things stand (``StartRefused``) ends the process with one
``service_refused`` line naming the reason and EX_CONFIG, never a traceback, and is stopped and
closed like any other. A service whose run fails and whose stop meets a vanished NATS (a slicer
whose leader start met a server that went away) must still be closed: an open connection keeps
nats-py's reconnect loop running, and the process then never exited after logging that it
stopped.
"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from structlog.testing import capture_logs

from seedance.core import serve
from seedance.core.errors import StartRefused
from seedance.core.service import EXIT_BUS_UNAVAILABLE, EXIT_START_REFUSED
from seedance.core.state_store import CorruptState


class Refusing:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> None:
        self.calls.append("start")
        raise StartRefused("nvidia.com/gpu is already served on node n by another device plugin")

    async def run(self) -> None:
        self.calls.append("run")

    async def stop(self) -> None:
        self.calls.append("stop")

    async def close(self) -> None:
        self.calls.append("close")


async def test_a_refused_start_exits_ex_config_with_one_line() -> None:
    service = Refusing()
    with capture_logs() as logs, pytest.raises(SystemExit) as exited:
        await serve(service)
    assert exited.value.code == EXIT_START_REFUSED == 78
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert line["event"] == "service_refused"
    assert "already served on node n" in line["reason"]
    assert "exc_info" not in line
    assert service.calls == ["start", "stop", "close"]


class Failing:
    """Runs into a failure, then cannot stop cleanly: the bus is gone."""

    def __init__(self) -> None:
        self.closed = False

    async def start(self) -> None:
        pass

    async def run(self) -> None:
        raise nats.errors.TimeoutError

    async def stop(self) -> None:
        raise nats.errors.ConnectionReconnectingError

    async def close(self) -> None:
        self.closed = True


def test_a_stop_that_cannot_finish_still_closes_the_service() -> None:
    service = Failing()
    with pytest.raises(SystemExit) as ended:
        asyncio.run(serve(service))
    assert ended.value.code == EXIT_BUS_UNAVAILABLE
    assert service.closed


class RefusingOnceRunning(Refusing):
    """Refuses what it finds once running (a new leader's restore, in its task group)."""

    async def start(self) -> None:
        self.calls.append("start")

    async def run(self) -> None:
        self.calls.append("run")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._restore())

    async def _restore(self) -> None:
        raise CorruptState("state key 'pool.default.j.3' does not decode")


async def test_a_refusal_found_once_running_exits_ex_config_with_one_line() -> None:
    # The slicer's restore of a journal key the cost-ledger's reply had overwritten ended in a
    # `service_failed` zlib traceback, and the process was restarted into it again.
    service = RefusingOnceRunning()
    with capture_logs() as logs, pytest.raises(SystemExit) as exited:
        await serve(service)
    assert exited.value.code == EXIT_START_REFUSED
    (line,) = [e for e in logs if e["log_level"] == "error"]
    assert (line["event"], line["reason"]) == (
        "service_refused",
        "state key 'pool.default.j.3' does not decode",
    )
    assert service.calls == ["start", "run", "stop", "close"]
