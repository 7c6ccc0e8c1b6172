"""The end of a `seedance.core.drift.converge` run: the missing streams' creation and, where a
step fails after an older stream gave up subjects to a new one, the put-back of that stream's
former config, decided by what the server answers and holds, then checked on the server.

Why the server's state and not what the run asked for: a call that gets no answer (a
time-out, a dropped connection) may still have been carried out, by a server busy past the
request's time-out or a meta leader that applied it after the client gave up. Put back from
what the run knew it did, a create made in silence kept the job subjects while the old stream
was given them back (the server refuses such an overlap, so the put-back failed and every
subject no new stream took had none), and an update made in silence was never put back. A
refusal (`APIError`) is an answer: nothing was made, and nothing is read back.

What is not handled (review 2): the server answers a stream's info from another queue than
its creates and updates, so a call it carries out after the read-back is not seen there. An
update that got no answer is therefore always put back (the put-back queues behind it); a
create read back as not made is put back as not made, then, on an overlap, as made. But a
create carried out right before the put-back can pass the server's overlap check with it (a
server-side race), leaving a subject held by two streams; and any call carried out after the
check below can still leave a subject with none or with two. The check names what it sees
(`StreamlessSubjects`); what it does not see stays until the next run, which converges. While a
subject is held twice, an event on it is stored in both and `SEEDANCE_JOBS` copies it twice:
the slicer applies it twice where the next run comes after the copies' 120-s duplicate window.
This module owns that decision; it must not compare configs (`seedance.core.drift`) nor
choose what converge changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NoReturn

import nats.errors
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import APIError, NotFoundError

from seedance.core.errors import StreamlessSubjects
from seedance.core.logs import get_logger

__all__ = ["NO_ANSWER", "UNREAD", "Unread", "Updated", "create_missing", "held", "put_back"]

log = get_logger(__name__)

#: What a JetStream call raises when no answer came: no reply in time (nats-py raises either
#: timeout kind), no JetStream listening, a connection lost, closed or reconnecting. The call
#: may have been carried out all the same. Not `APIError`: that is the server's answer, a
#: refusal, after which nothing was made. Not `TRANSIENT_BUS_ERRORS` (it holds every
#: `nats.errors.Error`, refusals too; and `seedance.core.bus` imports this module's caller).
NO_ANSWER: tuple[type[Exception], ...] = (
    TimeoutError,
    ConnectionError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError,
)
#: What a call that failed raises, refused or unanswered: where only its failure matters (an
#: info that does not tell a stream's state, a put-back that did not go through).
_FAILED: tuple[type[Exception], ...] = (APIError, *NO_ANSWER)
#: The server's err_code for a stream whose subjects overlap another's.
_OVERLAP = 10065

#: The streams a run updated, by name: (the config before, the config it was given).
Updated = dict[str, tuple[js_api.StreamConfig, js_api.StreamConfig]]


class Unread:
    """A stream whose state the server did not tell either (its info failed too)."""


UNREAD = Unread()


async def held(
    js: JetStreamContext, name: str, error: Exception
) -> js_api.StreamConfig | Unread | None:
    """Stream ``name``'s config as the server holds it after a create of it got no answer
    (``error``); None where it has no such stream (yet: the server answers infos from another
    queue and may still carry the create out); `UNREAD` where its info fails too."""
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        log.warning("stream_call_failed", stream=name, error=repr(error), held="no such stream")
        return None
    except _FAILED as unread:
        log.error("stream_call_failed", stream=name, error=repr(error), held=f"unread: {unread!r}")
        return UNREAD
    subjects = list(info.config.subjects or ())
    log.warning(
        "stream_call_failed", stream=name, error=repr(error), held="stream", subjects=subjects
    )
    return info.config


async def create_missing(
    js: JetStreamContext, missing: list[js_api.StreamConfig], updated: Updated
) -> list[js_api.StreamConfig]:
    """Create ``missing`` in order (what was created); where one fails, `put_back` what
    ``updated`` changed and raise.

    A refused create (`APIError`) made nothing. One that got no answer (`NO_ANSWER`) is read
    back (`held`): made, its subjects as the server holds them stay there, sourced back; not
    made or unread, it goes to `put_back` as ``unknown`` (not made then may still be made
    later: the server answers infos from another queue) and to the check after it."""
    created: list[js_api.StreamConfig] = []
    for wanted in missing:
        try:
            await js.add_stream(wanted)
        except APIError as exc:
            await put_back(js, updated, created, exc)
        except NO_ANSWER as exc:
            found = await held(js, wanted.name or "", exc)
            if found is None or isinstance(found, Unread):  # not made yet, or may be: see put_back
                await put_back(js, updated, created, exc, unknown=wanted)
            await put_back(js, updated, [*created, found], exc)
        created.append(wanted)
    return created


async def put_back(
    js: JetStreamContext,
    updated: Updated,
    created: list[js_api.StreamConfig],
    error: Exception,
    *,
    unknown: js_api.StreamConfig | None = None,
) -> NoReturn:
    """After a create, or a later stream's info or update, failed with ``error``: give each
    stream this run updated (or may have: `held`) its config from before, so that every subject
    it gave up has a stream again (review H1: the old SEEDANCE_JOBS gave up the job subjects,
    SEEDANCE_OBSERVED's create was refused for its reservation, and tenants' and observers'
    publishes found no stream at all); then raise ``error``.

    A subject a stream of ``created`` (as the server holds it) now holds stays there and is
    sourced back from it (this user may not delete what it created: the provisioner's grant),
    so nothing already stored in it is lost. ``unknown``: a create that got no answer and that
    the server did not show made (its info said no such stream, or failed): every subject goes
    back first; where the server refuses that as an overlap (10065), it was made after all, and
    only the others go back.

    Then the server is asked, stream by stream (`_holders`: the run's updated and created
    streams and ``unknown``), which hold each subject given up (``stream_subjects_held``); one
    that none holds (a put-back that failed too, a call carried out late) or whose holder does
    not tell is named at error level (``stream_subjects_without_stream``), one that more than
    one holds (a late create that raced the put-back) too (``stream_subjects_held_twice``), and
    `StreamlessSubjects` naming them is raised from ``error`` in its place. A call the server
    carries out after this check is not seen: the next run converges it."""
    for name, (before, wanted) in reversed(updated.items()):
        back = _before(before, wanted, created)
        try:
            try:
                await js.update_stream(back)
            except APIError as refused:
                if unknown is None or refused.err_code != _OVERLAP:
                    raise
                # the overlap proves the unknown create made: its subjects stay with it
                back = _before(before, wanted, [*created, unknown])
                await js.update_stream(back)
        except _FAILED as exc:  # ``error`` is the one to raise
            log.error("stream_put_back_failed", stream=name, error=repr(exc))
            continue
        log.warning("stream_put_back", stream=name, subjects=back.subjects or [])
    given_up = [s for before, _ in updated.values() for s in before.subjects or ()]
    touched = [*updated, *(new.name or "" for new in (*created, *([unknown] if unknown else [])))]
    holders = await _holders(js, given_up, touched)
    streamless = [subject for subject, names in holders.items() if not names]
    shared = {subject: names for subject, names in holders.items() if len(names) > 1}
    if streamless:
        log.error("stream_subjects_without_stream", subjects=streamless, error=repr(error))
    if shared:
        log.error("stream_subjects_held_twice", held=shared, error=repr(error))
    if streamless or shared:
        raise StreamlessSubjects(streamless, error, shared=shared) from error
    if holders:
        log.warning("stream_subjects_held", held=holders)
    raise error


def _before(
    before: js_api.StreamConfig, wanted: js_api.StreamConfig, created: list[js_api.StreamConfig]
) -> js_api.StreamConfig:
    """``before`` with the subjects ``created`` holds taken out, and sourcing the streams of
    ``created`` that ``wanted`` sources, each source once (the server refuses a repeated one,
    10140: ``before`` may name one already, from a run that failed part-way)."""
    taken = {subject for new in created for subject in new.subjects or ()}
    kept = [subject for subject in before.subjects or () if subject not in taken]
    back = dataclasses.replace(before, subjects=kept or None)
    names = {new.name for new in created}
    sources = list(before.sources or ())
    for src in wanted.sources or ():
        if src.name in names and all(src.name != old.name for old in sources):
            sources.append(src)
    back.sources = sources or None
    return back


async def _holders(
    js: JetStreamContext, subjects: Sequence[str], streams: Sequence[str]
) -> dict[str, list[str]]:
    """Each of ``subjects`` and every stream of ``streams`` the server says holds it, as the
    server answers each info, one after the other (not one snapshot): none where none does, or
    where the one that might does not tell (its info failed: logged); more than one where a
    call the server carried out late raced the put-back (the server checks overlaps against
    what it has applied, and two calls in flight can both pass). Only ``streams`` are asked
    (the run's, including a create read back as not made): a stream outside them, or a call
    carried out after these infos, is not seen."""
    holders: dict[str, list[str]] = {subject: [] for subject in subjects}
    for name in dict.fromkeys(streams):
        try:
            held_now = (await js.stream_info(name)).config.subjects or ()
        except NotFoundError:
            continue
        except _FAILED as exc:
            log.error("stream_unread_after_put_back", stream=name, error=repr(exc))
            continue
        for subject in held_now:
            if subject in holders:
                holders[subject].append(name)
    return holders
