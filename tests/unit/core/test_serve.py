"""`seedance.core.service.serve` ends the process however the service's stop goes.

A service whose run fails and whose stop meets a vanished NATS (a slicer whose leader start met
a server that went away) must still be closed: an open connection keeps nats-py's reconnect
loop running, and the process then never exited after logging that it stopped.
"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from seedance.core.service import EXIT_BUS_UNAVAILABLE, serve


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
        asyncio.run(serve(service))  # type: ignore[arg-type]
    assert ended.value.code == EXIT_BUS_UNAVAILABLE
    assert service.closed
