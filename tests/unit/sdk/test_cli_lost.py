"""What a command's failure is said as while its connection is down.

A connection error (nats-py's "reconnecting" or "closed", a wait that timed out) while the
connection is down (reconnecting or given up) is the lost connection (69). Before, any failure
while reconnecting was: a bad argument or a refusal raised during a short outage ended with
"connection ... lost" and 69 instead of its own line and status.
"""

from __future__ import annotations

import argparse

import nats.errors
import pytest

from seedance.core.errors import BusUnavailable
from seedance.sdk import cli


class Client:
    """A client whose connection is reconnecting (or given up)."""

    def __init__(self, *, gave_up: bool) -> None:
        self.connection_lost = True  # either way
        self.gave_up = gave_up

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    def lost(self) -> BusUnavailable:
        return BusUnavailable("connection to NATS at nats://x lost", refused=False)


def run_failing(exc: Exception, *, gave_up: bool, monkeypatch: pytest.MonkeyPatch) -> cli._Command:
    async def connect(args: argparse.Namespace) -> Client:
        return Client(gave_up=gave_up)

    async def command(client: object, args: argparse.Namespace) -> int:
        raise exc

    monkeypatch.setattr(cli, "connect", connect)
    return command  # type: ignore[return-value]


async def test_a_bad_argument_during_a_blip_is_said_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = run_failing(
        ValueError("--since is not a time"), gave_up=False, monkeypatch=monkeypatch
    )
    with pytest.raises(ValueError, match="--since is not a time"):
        await cli._run(argparse.Namespace(), command)


@pytest.mark.parametrize(
    ("exc", "gave_up"),
    [
        (nats.errors.ConnectionReconnectingError(), False),
        (TimeoutError("no answer"), False),
        (nats.errors.ConnectionClosedError(), True),
    ],
)
async def test_a_connection_error_while_reconnecting_or_anything_given_up_is_the_loss(
    exc: Exception, gave_up: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = run_failing(exc, gave_up=gave_up, monkeypatch=monkeypatch)
    with pytest.raises(BusUnavailable, match="lost"):
        await cli._run(argparse.Namespace(), command)
