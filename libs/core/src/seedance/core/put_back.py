"""The end of a `seedance.core.drift.converge` run: the missing streams' creation and, where a
step fails after an older stream gave up subjects to a new one, the put-back of that stream's
former config, decided by what the server holds.

Why the server's state and not what the run asked for: a call that gets no answer (a
time-out, a dropped connection) may still have been carried out, by a server busy past the
request's time-out or a meta leader that applied it after the client gave up. Put back from
what the run knew it did, a create made in silence kept the job subjects while the old stream
was given them back (the server refuses such an overlap, so the put-back failed and every
subject no new stream took had none), and an update made in silence was never put back.
This module owns that decision; it must not compare configs (`seedance.core.drift`) nor
choose what converge changes.
"""

from __future__ import annotations

import dataclasses

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import NotFoundError

from seedance.core.logs import get_logger

__all__ = ["NO_ANSWER", "UNREAD", "Unread", "Updated", "create_missing", "held", "put_back"]

log = get_logger(__name__)

#: What a JetStream call raises when it fails: a refusal (`APIError`, a `NatsError`), no reply
#: (nats-py raises either timeout kind) or a dropped socket. Not `TRANSIENT_BUS_ERRORS`:
#: `seedance.core.bus` imports the comparison this module's caller lives in.
NO_ANSWER: tuple[type[Exception], ...] = (NatsError, TimeoutError, ConnectionError)

#: The streams a run updated, by name: (the config before, the config it was given).
Updated = dict[str, tuple[js_api.StreamConfig, js_api.StreamConfig]]


class Unread:
    """A stream whose state the server did not tell either (its info failed too)."""


UNREAD = Unread()


async def held(
    js: JetStreamContext, name: str, error: Exception
) -> js_api.StreamConfig | Unread | None:
    """Stream ``name``'s config as the server holds it after a create or update of it failed
    with ``error``; None where it has no such stream; `UNREAD` where its info fails too."""
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        log.warning("stream_call_failed", stream=name, error=repr(error), held=None)
        return None
    except NO_ANSWER as unread:
        log.error("stream_call_failed", stream=name, error=repr(error), held=repr(unread))
        return UNREAD
    log.warning("stream_call_failed", stream=name, error=repr(error), held=info.config.subjects)
    return info.config


async def create_missing(
    js: JetStreamContext, missing: list[js_api.StreamConfig], updated: Updated
) -> list[js_api.StreamConfig]:
    """Create ``missing`` in order (what was created); where one fails, `put_back` what
    ``updated`` changed and raise the error.

    The failed one counts as created where the server holds it (its subjects, as the server
    holds them, stay there, sourced back), and where its state cannot be read either: given
    back every subject, an old stream is refused as an overlap if the new one was made, and
    every subject no new stream took is left with none; taken as made, only its own subjects
    wait for the next run."""
    created: list[js_api.StreamConfig] = []
    for wanted in missing:
        try:
            await js.add_stream(wanted)
        except NO_ANSWER as exc:
            found = await held(js, wanted.name or "", exc)
            if found is not None:
                created.append(wanted if isinstance(found, Unread) else found)
            await put_back(js, updated, created)
            raise
        created.append(wanted)
    return created


async def put_back(
    js: JetStreamContext, updated: Updated, created: list[js_api.StreamConfig]
) -> None:
    """After a create, or a later stream's info or update, failed: give each stream this run
    updated (or may have: `held`) its config from before, so that every subject it gave up
    has a stream again (review H1: the old SEEDANCE_JOBS gave up the job subjects,
    SEEDANCE_OBSERVED's create was refused for its reservation, and tenants' and observers'
    publishes found no stream at all). A subject a stream of ``created`` (as the server holds
    it) now holds stays there and is sourced back from it (this user may not delete what it
    created: the provisioner's grant), so nothing already stored in it is lost. Best effort: a
    put-back that fails is logged; the create's error is what the caller gets."""
    taken = {subject: new for new in created for subject in new.subjects or ()}
    for name, (before, wanted) in reversed(updated.items()):
        kept = [subject for subject in before.subjects or () if subject not in taken]
        back = dataclasses.replace(before, subjects=kept or None)
        from_created = [
            src for src in wanted.sources or () if any(src.name == new.name for new in created)
        ]
        if from_created:
            back.sources = [*(before.sources or ()), *from_created]
        try:
            await js.update_stream(back)
        except NO_ANSWER as exc:  # the create's error is the one to raise
            log.error("stream_put_back_failed", stream=name, error=repr(exc))
            continue
        log.warning("stream_put_back", stream=name, subjects=kept)
