"""Provision's put-back when a run fails after an older stream gave up its subjects (review of
the job streams' split, MEDIUM: only a failed create put them back, so a time-out on a later
stream's info left ``seedance.jobs.>`` and ``seedance.observed.>`` with no stream at all), and
when the call that failed was carried out all the same (its reply lost: the put-back follows
what the server holds, not what the run knew it had done). Review of that fix: a refusal is not
read back (HIGH-1); an unread create is put back as not made, then as made where the server
refuses the overlap, each source once (HIGH-2); a subject left with no stream is named
(MEDIUM-3). Second review: a call the server carries out after the read-back (an update is
always put back; a create read back as not made is checked, and a subject held by two streams
named). Each failure is followed by a run that converges (`_converges`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError
from structlog.testing import capture_logs

from seedance.core.drift import converge, stream_config
from seedance.core.errors import StreamlessSubjects
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
    stream whose subjects overlap another's (err_code 10065) and a repeated source (10140).
    ``SEEDANCE_TELEMETRY``'s info times out (a server busy past the request's time-out); a
    create or update of a stream in ``silent`` is made and then, the first time, times out (its
    reply lost); the ``lost[name]``-th create or update of a stream (from 0) times out unmade (its
    request lost); a create of a stream in ``refused`` is refused (10047, past
    ``max_file_store``); once a create or update of a stream in ``unread`` was asked, its next
    ``unread[name]`` infos time out. The ``late[name]``-th create or update of a stream (from 0)
    times out unmade, and the server carries it out right before the next create or update
    (which queues behind it; infos do not), that one checked for overlaps as if it had not:
    both in flight pass the check (the race review 2 saw on nats-server), or, not ``race``,
    after it."""

    def __init__(
        self,
        *configs: js_api.StreamConfig,
        silent: Collection[str] = (),
        lost: dict[str, int] | None = None,
        refused: Collection[str] = (),
        unread: dict[str, int] | None = None,
        late: dict[str, int] | None = None,
        race: bool = True,
    ) -> None:
        self.configs = {c.name: c for c in configs}
        self.silent, self.refused = set(silent), set(refused)
        self.lost, self.unread = lost or {}, dict(unread or {})
        self.late, self.queued, self.race = late or {}, list[js_api.StreamConfig](), race
        self.calls: dict[str, int] = {}

    async def stream_info(self, name: str) -> js_api.StreamInfo:
        if name == LATER.name:
            raise NatsTimeoutError
        if name in self.calls and self.unread.get(name, 0) > 0:
            self.unread[name] -= 1
            raise NatsTimeoutError
        if name not in self.configs:
            raise NotFoundError
        state = js_api.StreamState(messages=0, bytes=0, first_seq=0, last_seq=0, consumer_count=0)
        return js_api.StreamInfo(config=self.configs[name], state=state)

    async def update_stream(self, config: js_api.StreamConfig) -> None:
        self._store(config)

    async def add_stream(self, config: js_api.StreamConfig) -> None:
        if config.name in self.refused:
            self.calls[config.name or ""] = self.calls.get(config.name or "", 0) + 1
            raise APIError(code=500, err_code=10047, description="insufficient storage resources")
        self._store(config)

    def _store(self, config: js_api.StreamConfig) -> None:
        name = config.name or ""
        call = self.calls.get(name, 0)
        self.calls[name] = call + 1
        if self.lost.get(name) == call:
            raise NatsTimeoutError
        if self.late.get(name) == call:
            self.queued.append(config)
            raise NatsTimeoutError
        checked = dict(self.configs)  # what the server had applied when it checked this one
        self.carry_out_late()
        if not self.race:
            checked = dict(self.configs)
        for other in checked.values():
            if other.name != config.name and set(other.subjects or ()) & set(config.subjects or ()):
                raise APIError(code=400, err_code=10065, description="subjects overlap")
        origins = [src.name for src in config.sources or ()]
        if len(origins) != len(set(origins)):
            raise APIError(code=400, err_code=10140, description="duplicate source configuration")
        self.configs[config.name] = config
        if config.name in self.silent:  # once: a put-back of it is answered
            self.silent.discard(config.name)
            raise NatsTimeoutError

    def carry_out_late(self) -> None:
        """Carry out the calls held back by ``late``, in order."""
        for config in self.queued:
            self.configs[config.name] = config
        self.queued.clear()

    def holders(self) -> dict[str, list[str]]:
        """Each subject of the old SEEDANCE_JOBS and the streams that hold it."""
        return {
            subject: [c.name or "" for c in self.configs.values() if subject in (c.subjects or ())]
            for subject in (jobs.ALL, observed.ALL)
        }


async def _converges(server: _Server) -> None:
    """The next run, its faults gone, converges: each job subject in its new stream, the old one
    sourcing both, each once."""
    server.refused.clear()
    server.unread.clear()
    await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [observed.STREAM]}
    merged = server.configs[jobs.IN_STREAM]
    assert sorted(s.name or "" for s in merged.sources or ()) == [jobs.STREAM, observed.STREAM]
    assert await converge(server, SPLIT) == []  # type: ignore[arg-type]


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


async def test_a_create_made_whose_state_cannot_be_read_keeps_its_subjects() -> None:
    """The requests' stream is made, its reply lost, and its info times out too: given every
    subject back, the old stream is refused as an overlap (the create was made after all), and
    is given back only the observers' events."""
    server = _Server(OLD_JOBS, silent={jobs.STREAM}, unread={jobs.STREAM: 1})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    await _converges(server)


async def test_a_create_not_made_whose_state_cannot_be_read_gives_every_subject_back() -> None:
    """Review HIGH-2: the requests' create never reaches the server and its info times out.
    Taken as made, the old stream got back only the observers' events and ``seedance.jobs.>``
    had no stream; now it gets back every subject, which the server accepts."""
    server = _Server(OLD_JOBS, lost={jobs.STREAM: 0}, unread={jobs.STREAM: 1})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.IN_STREAM], observed.ALL: [jobs.IN_STREAM]}
    assert jobs.STREAM not in server.configs
    await _converges(server)


async def test_a_refused_create_is_not_read_back() -> None:
    """Review HIGH-1: the server refuses the observers' stream (10047) and an info of it would
    time out. A refusal is an answer (nothing made): read back, the info's time-out had it
    taken as made and ``seedance.observed.>`` had no stream; now the old stream gets it back."""
    server = _Server(OLD_JOBS, refused={observed.STREAM}, unread={observed.STREAM: 1})
    with pytest.raises(APIError) as refused:
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert refused.value.err_code == 10047
    assert server.unread == {observed.STREAM: 1}  # never asked
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    await _converges(server)


async def test_a_put_back_names_each_source_once() -> None:
    """Review HIGH-2: the old stream already sources the requests' stream (an earlier run that
    failed part-way) and this run creates it: put back with the source twice, the server
    refused it (10140) and ``seedance.observed.>`` had no stream."""
    earlier = dataclasses.replace(
        OLD_JOBS, subjects=[observed.ALL], sources=[js_api.StreamSource(name=jobs.STREAM)]
    )
    server = _Server(earlier, refused={observed.STREAM})
    with pytest.raises(APIError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    assert [s.name for s in server.configs[jobs.IN_STREAM].sources or ()] == [jobs.STREAM]
    await _converges(server)


async def test_a_subject_left_without_a_stream_is_named_in_the_error_and_the_log() -> None:
    """Review MEDIUM-3: the requests' create is refused and the put-back of the old stream is
    lost too: no stream holds either job subject, and the error raised (from the refusal) and
    an error-level line name both, where before the refusal alone was raised and the log said
    the stream was put back."""
    server = _Server(OLD_JOBS, refused={jobs.STREAM}, lost={jobs.IN_STREAM: 1})
    with capture_logs() as logs, pytest.raises(StreamlessSubjects) as left:
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [], observed.ALL: []}
    assert left.value.subjects == [jobs.ALL, observed.ALL]
    assert f"left {jobs.ALL}, {observed.ALL} with no stream" in str(left.value)
    assert isinstance(left.value.__cause__, APIError)
    named = [e for e in logs if e["event"] == "stream_subjects_without_stream"]
    assert [(e["log_level"], e["subjects"]) for e in named] == [("error", [jobs.ALL, observed.ALL])]
    await _converges(server)


async def test_an_update_made_before_its_time_out_is_put_back() -> None:
    """The old stream's update is made (its subjects given up) but its reply is lost: it is put
    back, both subjects with it again (before, only an update that answered was put back, and
    every job subject was left with no stream)."""
    server = _Server(OLD_JOBS, silent={jobs.IN_STREAM})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.IN_STREAM], observed.ALL: [jobs.IN_STREAM]}
    assert server.configs.keys() == {jobs.IN_STREAM}


async def test_a_subject_whose_holder_the_server_does_not_tell_is_named() -> None:
    """The requests' stream is made, its reply lost, and neither its read-back nor the check
    after the put-back is answered: ``seedance.jobs.>`` may have no stream, so the error names
    it (the observers' events, read back in the old stream, are not named)."""
    server = _Server(OLD_JOBS, silent={jobs.STREAM}, unread={jobs.STREAM: 2})
    with pytest.raises(StreamlessSubjects) as left:
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert left.value.subjects == [jobs.ALL]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    await _converges(server)


async def test_an_update_carried_out_after_its_read_back_is_put_back() -> None:
    """Review 2: the old stream's update times out and the server carries it out after the
    read-back, which still showed both subjects: nothing was put back and, once it was carried
    out, both job subjects had no stream and no error named them. Now an update that got no
    answer is always put back, queued behind it."""
    server = _Server(OLD_JOBS, late={jobs.IN_STREAM: 0})
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    server.carry_out_late()
    assert server.holders() == {jobs.ALL: [jobs.IN_STREAM], observed.ALL: [jobs.IN_STREAM]}
    await _converges(server)


async def test_a_create_carried_out_after_its_read_back_is_named_when_held_twice() -> None:
    """Review 2: the requests' create times out, its read-back finds no such stream, and the
    server carries it out right before the put-back, both passing the overlap check: two
    streams hold ``seedance.jobs.>`` and, that create not checked, the run raised its time-out
    alone. Now the check asks it too and the error and an error-level line name the subject
    and both holders; the next run converges."""
    server = _Server(OLD_JOBS, late={jobs.STREAM: 0})
    with capture_logs() as logs, pytest.raises(StreamlessSubjects) as left:
        await converge(server, SPLIT)  # type: ignore[arg-type]
    twice = {jobs.ALL: [jobs.IN_STREAM, jobs.STREAM]}
    assert server.holders() == {**twice, observed.ALL: [jobs.IN_STREAM]}
    assert (left.value.subjects, left.value.shared) == ([], twice)
    assert f"{jobs.ALL} held by {jobs.IN_STREAM} and {jobs.STREAM}" in str(left.value)
    assert isinstance(left.value.__cause__, NatsTimeoutError)
    named = [e for e in logs if e["event"] == "stream_subjects_held_twice"]
    assert [(e["log_level"], e["held"]) for e in named] == [("error", twice)]
    await _converges(server)


async def test_a_create_carried_out_after_its_read_back_keeps_its_subjects_on_overlap() -> None:
    """Review 2 (nats-server, the put-back checked after the late create): read back as not
    made, the requests' stream was made before the put-back, which the server refused as an
    overlap, and ``seedance.observed.>`` was left with no stream. Now a create read back as not
    made is put back as an unread one: on the overlap, the old stream gets back the rest."""
    server = _Server(OLD_JOBS, late={jobs.STREAM: 0}, race=False)
    with pytest.raises(NatsTimeoutError):
        await converge(server, SPLIT)  # type: ignore[arg-type]
    assert server.holders() == {jobs.ALL: [jobs.STREAM], observed.ALL: [jobs.IN_STREAM]}
    assert [s.name for s in server.configs[jobs.IN_STREAM].sources or ()] == [jobs.STREAM]
    await _converges(server)
