"""`seedance.core.mirror`: what a mirror's stream info says of its copy, and the wait on it."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.api import StreamConfig, StreamInfo, StreamSourceInfo, StreamState

import seedance.core.mirror as mirror
from seedance.core.mirror import await_mirror, mirror_behind
from seedance.events.subjects import ledger

ORIGIN = ledger.IN_STREAM
MIRROR = ledger.NODE_STREAM


def _info(
    *, lag: int | None = 0, active: int | None = 1_000, error: dict[str, Any] | None = None
) -> StreamInfo:
    return StreamInfo(
        config=StreamConfig(name=MIRROR),
        state=StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0),
        mirror=StreamSourceInfo(name=ORIGIN, lag=lag, active=active, error=error),
    )


def _plain() -> StreamInfo:
    return StreamInfo(
        config=StreamConfig(name=ORIGIN),
        state=StreamState(messages=3, bytes=0, first_seq=1, last_seq=3, consumer_count=0),
    )


class _Clock:
    """Sleeps return at once, having moved the clock on."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


class _Bus:
    """Answers each stream info from a script; records what it was asked to provision."""

    def __init__(self, *infos: StreamInfo | None) -> None:
        self.infos = list(infos)
        self.clock = _Clock()
        self.ensured: list[list[str]] = []

    async def stream_info(self, stream: str) -> StreamInfo | None:
        assert stream == MIRROR
        return self.infos.pop(0)

    async def ensure_streams(self, specs: Any) -> None:
        self.ensured.append([s.name for s in specs])


def test_the_module_exports_exactly_these_names() -> None:
    assert sorted(mirror.__all__) == [
        "MIRROR_LINE_EVERY_S",
        "MIRROR_POLL_S",
        "await_mirror",
        "mirror_behind",
    ]


def test_a_mirror_with_no_lag_that_has_heard_from_its_origin_is_caught_up() -> None:
    assert mirror_behind(_info(lag=0, active=250_000_000)) is None


def test_a_stream_that_is_no_mirror_is_its_own_origin() -> None:
    assert mirror_behind(_plain()) is None


@pytest.mark.parametrize("active", [-1, None])
def test_a_mirror_that_never_heard_from_its_origin_is_behind_whatever_its_lag(
    active: int | None,
) -> None:
    reason = mirror_behind(_info(lag=0, active=active))
    assert reason is not None
    assert "not heard from its origin" in reason
    assert ORIGIN in reason


def test_a_mirror_with_lag_is_behind_by_that_many_messages() -> None:
    reason = mirror_behind(_info(lag=4321))
    assert reason is not None
    assert "4321" in reason


def test_a_mirror_whose_copy_failed_is_behind_with_the_servers_reason() -> None:
    reason = mirror_behind(_info(error={"code": 404, "description": "stream not found"}))
    assert reason is not None
    assert "stream not found" in reason


async def test_the_wait_ends_at_the_second_look_in_a_row_that_finds_it_caught_up() -> None:
    bus = _Bus(_info(active=-1), _info(lag=7), _info(), _info(lag=2), _info(), _info())
    heard: list[str | None] = []
    got = await await_mirror(bus, MIRROR, on_behind=heard.append, poll_s=0.5)  # type: ignore[arg-type]
    assert got.mirror is not None
    assert not bus.infos
    assert [h is None for h in heard] == [False, False, True, False, True, True]
    assert bus.clock.slept == [0.5] * 5


async def test_a_stream_that_is_no_mirror_takes_one_look() -> None:
    bus = _Bus(_plain())
    got = await await_mirror(bus, MIRROR)  # type: ignore[arg-type]
    assert got.mirror is None
    assert bus.clock.slept == []


async def test_a_missing_mirror_is_waited_for_as_provision_creates_it() -> None:
    bus = _Bus(None, _info(), _info())
    heard: list[str | None] = []
    await await_mirror(bus, MIRROR, on_behind=heard.append)  # type: ignore[arg-type]
    assert bus.ensured == [[MIRROR]]
    assert heard == ["it does not exist", None, None]
