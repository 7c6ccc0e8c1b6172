"""`ConnectWatch` giving a lost connection up after ``BusSettings.reconnect_for_s``.

A command line's client must end rather than wait on a dead server (the CLI's lost-connection
line, tests/integration/sdk/test_cli_connection_lost.py, is the real server's side); a
connection back within the bound is kept, and a service's (no bound) is retried for ever.
"""

from __future__ import annotations

import asyncio

from seedance.core.bus import BusSettings
from seedance.core.clock import WALL_CLOCK
from seedance.core.connect_watch import ConnectWatch
from seedance.core.errors import BusUnavailable

URL = "nats://127.0.0.1:4222"


def watching(reconnect_for_s: float | None) -> tuple[ConnectWatch, list[str]]:
    closes: list[str] = []
    watch = ConnectWatch(BusSettings(url=URL, reconnect_for_s=reconnect_for_s), WALL_CLOCK)

    async def close() -> None:
        closes.append("closed")
        await watch.closed()  # as nats-py's close calls the closed callback

    watch.close_connection = close
    watch.connected = True
    return watch, closes


async def test_a_connection_back_within_the_bound_is_kept_and_a_later_loss_given_up() -> None:
    watch, closes = watching(reconnect_for_s=0.2)
    await watch.disconnected()
    giving_up = watch._giving_up
    assert giving_up is not None
    await watch.reconnected()
    await asyncio.wait_for(giving_up, timeout=5)  # ends at once: the connection is back
    assert (closes, watch.gave_up.is_set()) == ([], False)
    await watch.disconnected()  # lost again, and this time for good
    await asyncio.wait_for(watch.gave_up.wait(), timeout=5)
    assert closes == ["closed"]
    lost = watch.lost()
    assert isinstance(lost, BusUnavailable)
    assert not lost.refused
    assert str(lost).startswith(
        f"connection to NATS at {URL} lost (no reconnection for 0.2 s, gave up)"
    )


async def test_a_service_connection_is_retried_for_ever() -> None:
    watch, closes = watching(reconnect_for_s=None)
    await watch.disconnected()
    assert watch._giving_up is None
    assert (closes, watch.gave_up.is_set()) == ([], False)
    assert "reconnecting when the command failed" in str(watch.lost())


async def test_our_own_close_is_no_loss() -> None:
    watch, closes = watching(reconnect_for_s=0.2)
    watch.closing = True
    await watch.disconnected()
    await watch.closed()
    assert watch._giving_up is None
    assert (closes, watch.gave_up.is_set()) == ([], False)


async def test_our_own_close_while_the_give_up_waits_is_no_give_up() -> None:
    # Bus.close while reconnecting: the give-up timer already runs. Before, reconnect_for_s
    # later it logged nats_reconnect_given_up, closed again and set gave_up for our own close.
    watch, closes = watching(reconnect_for_s=0.05)
    await watch.disconnected()
    giving_up = watch._giving_up
    assert giving_up is not None
    watch.closing = True  # set by Bus.close before it closes
    await watch.closed()
    await asyncio.wait_for(giving_up, timeout=5)  # its bound passes, with the close ours
    assert (closes, watch.gave_up.is_set()) == ([], False)


async def test_bus_close_cancels_a_waiting_give_up() -> None:
    watch, closes = watching(reconnect_for_s=60)
    await watch.disconnected()
    giving_up = watch._giving_up
    assert giving_up is not None
    watch.closing = True
    watch.stop_giving_up()  # what Bus.close calls: the task ends now, not a minute later
    await asyncio.gather(giving_up, return_exceptions=True)
    assert giving_up.cancelled()
    assert (closes, watch.gave_up.is_set(), watch._giving_up) == ([], False, None)
