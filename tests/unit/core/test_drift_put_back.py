"""Provision's put-back when a run fails after an older stream gave up its subjects (review of
the job streams' split, MEDIUM: only a failed create put them back, so a time-out on a later
stream's info left ``seedance.jobs.>`` and ``seedance.observed.>`` with no stream at all)."""

from __future__ import annotations

import dataclasses

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from seedance.core.drift import converge, stream_config
from seedance.events.subjects import STREAMS, jobs, observed

SPECS = {s.name: s for s in STREAMS}
WANTED_JOBS = stream_config(SPECS[jobs.IN_STREAM], 1)
#: SEEDANCE_JOBS as a release before the split made it: the requests and the observed events.
OLD_JOBS = dataclasses.replace(WANTED_JOBS, subjects=[jobs.ALL, observed.ALL], sources=None)
LATER = stream_config(SPECS["SEEDANCE_TELEMETRY"], 1)


class _Server:
    """The JetStream calls `converge` makes, on configs held here; ``SEEDANCE_TELEMETRY``'s
    info times out (a server busy past the request's time-out)."""

    def __init__(self, *configs: js_api.StreamConfig) -> None:
        self.configs = {c.name: c for c in configs}

    async def stream_info(self, name: str) -> js_api.StreamInfo:
        if name == LATER.name:
            raise NatsTimeoutError
        if name not in self.configs:
            raise NotFoundError
        state = js_api.StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
        return js_api.StreamInfo(config=self.configs[name], state=state)

    async def update_stream(self, config: js_api.StreamConfig) -> None:
        self.configs[config.name] = config

    async def add_stream(self, config: js_api.StreamConfig) -> None:  # pragma: no cover
        raise AssertionError("nothing is created before the failing info")


async def test_a_later_streams_time_out_puts_back_what_gave_up_its_subjects() -> None:
    server = _Server(OLD_JOBS)
    with pytest.raises(NatsTimeoutError):
        await converge(server, [WANTED_JOBS, LATER])  # type: ignore[arg-type]
    assert server.configs[jobs.IN_STREAM].subjects == [jobs.ALL, observed.ALL]
