"""Provision's put-back when a run fails after an older stream gave up its subjects (review of
the job streams' split, MEDIUM: only a failed create put them back, so a time-out on a later
stream's info left ``seedance.jobs.>`` and ``seedance.observed.>`` with no stream at all), and
when the call that failed was carried out all the same (its reply lost: the put-back follows
what the server holds, not what the run knew it had done)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from seedance.core.drift import converge, stream_config
from seedance.events.subjects import STREAMS, jobs, observed

SPECS = {s.name: s for s in STREAMS}
WANTED_JOBS = stream_config(SPECS[jobs.IN_STREAM], 1)
#: SEEDANCE_JOBS as a release before the split made it: the requests and the observed events.
OLD_JOBS = dataclasses.replace(WANTED_JOBS, subjects=[jobs.ALL, observed.ALL], sources=None)
LATER = stream_config(SPECS["SEEDANCE_TELEMETRY"], 1)
#: The split as provision converges it: the old stream first, then the two it sources.
SPLIT = [
    WANTED_JOBS,
    stream_config(SPECS[jobs.STREAM], 1),
    stream_config(SPECS[observed.STREAM], 1),
]


class _Server:
    """The JetStream calls `converge` makes, on configs held here. Like nats-server it refuses a
    stream whose subjects overlap another's (err_code 10065). ``SEEDANCE_TELEMETRY``'s info
    times out (a server busy past the request's time-out); a create or update of a stream in
    ``silent`` is made and then, the first time, times out (its reply lost); the info of a stream in
    ``unread`` times out once the stream exists."""

    def __init__(
        self,
        *configs: js_api.StreamConfig,
        silent: Collection[str] = (),
        unread: Collection[str] = (),
    ) -> None:
        self.configs = {c.name: c for c in configs}
        self.silent, self.unread = set(silent), unread

    async def stream_info(self, name: str) -> js_api.StreamInfo:
        if name == LATER.name or (name in self.unread and name in self.configs):
            raise NatsTimeoutError
        if name not in self.configs:
            raise NotFoundError
        state = js_api.StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
        return js_api.StreamInfo(config=self.configs[name], state=state)

    async def update_stream(self, config: js_api.StreamConfig) -> None:
        self._store(config)

    async def add_stream(self, config: js_api.StreamConfig) -> None:
        self._store(config)

    def _store(self, config: js_api.StreamConfig) -> None:
        for other in self.configs.values():
            if other.name != config.name and set(other.subjects or ()) & set(config.subjects or ()):
                raise APIError(code=400, err_code=10065, description="subjects overlap")
        self.configs[config.name] = config
        if config.name in self.silent:  # once: a put-back of it is answered
            self.silent.discard(config.name)
            raise NatsTimeoutError

    def holders(self) -> dict[str, list[str]]:
        """Each subject of the old SEEDANCE_JOBS and the streams that hold it."""
        return {
            subject: [c.name or "" for c in self.configs.values() if subject in (c.subjects or ())]
            for subject in (jobs.ALL, observed.ALL)
        }


async def test_a_later_streams_time_out_puts_back_what_gave_up_its_subjects() -> None:
    server = _Server(OLD_JOBS)
    with pytest.raises(NatsTimeoutError):
        await converge(server, [WANTED_JOBS, LATER])  # type: ignore[arg-type]
    assert server.configs[jobs.IN_STREAM].subjects == [jobs.ALL, observed.ALL]


async def test_a_create_made_before_its_time_out_keeps_its_subjects_and_the_rest_go_back() -> None:
    """The requests' stream is made but its reply is lost: the old stream gets back only the
    observed events and sources the new stream, so each subject has exactly one stream (before,
    the put-back gave it both, the server refused the overlap, and the observers' subject was
    left with none)."""
    server = _Server(OLD_JOBS, silent={jobs.STREAM})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    back = server.configs[jobs.IN_STREAM]
    assert [s.name for s in back.sources or ()] == [jobs.STREAM]
    assert observed.STREAM not in server.configs


async def test_a_create_whose_state_cannot_be_read_is_taken_as_made() -> None:
    """The requests' stream is made, its reply lost, and its info times out too: taken as made,
    the old stream gets back what no new stream may hold (given both back, the server refuses
    the overlap and neither subject has the old stream)."""
    server = _Server(OLD_JOBS, silent={jobs.STREAM}, unread={jobs.STREAM})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}


async def test_an_update_made_before_its_time_out_is_put_back() -> None:
    """The old stream's update is made (its subjects given up) but its reply is lost: it is put
    back, both subjects with it again (before, only an update that answered was put back, and
    every job subject was left with no stream)."""
    server = _Server(OLD_JOBS, silent={jobs.IN_STREAM})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.IN_STREAM], observed.ALL: [jobs.IN_STREAM]}
    assert server.configs.keys() == {jobs.IN_STREAM}
