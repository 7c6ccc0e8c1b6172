"""Raw probes of the shipped NATS users: a request the server answers, or refuses by name.

Shared by the grant tests (leases, the ledger's input, streams, the provisioner): each probe is
a raw request on a connection as one user of deploy/auth; the server's refusal arrives on the
error callback ("Permissions Violation for Publish to "<subject>""), not as a reply.

A probe races the answer against the refusal and ends at the first: a refused publish is
dropped (no answer ever comes), and one that went through is never refused. A request that is
neither refused nor answered within the bound raises rather than passing for either. (Before,
each refusal cost the request's 2 s time-out, then a look for "any error naming it". Nor can a
PING after the publish prove "not refused" sooner: nats-py writes the PING straight to the
socket, ahead of publishes still queued for its flusher, so its PONG can come back first.)

Each refusal is handed to one probe, the oldest waiting on exactly that subject, so an earlier
probe's refusal (or another subject's that contains this one, CONSUMER.CREATE.S.c.f after
CONSUMER.CREATE.S.c) is never read as a later probe's.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from typing import Any

import nats
import nats.errors
from nats.js.api import Header

from tests.integration.conftest import shipped_password

#: How nats-py reports the server's refusal of a publish (it lower-cases the server's line).
_PUBLISH_REFUSED = re.compile(r'permissions violation for publish to "(?P<subject>[^"]+)"')

#: The bound on one probe: the old request time-out (2 s) and wait for the named refusal (3 s).
PROBE_TIMEOUT_S = 5.0


class ShippedUser:
    """A raw connection as one shipped user that records the server's refusals (``errors``,
    every one, in order) and hands each publish refusal to the probe that caused it."""

    def __init__(self) -> None:
        self.nc: Any = None
        self.errors: list[str] = []
        self._probes: dict[str, deque[asyncio.Future[None]]] = {}
        self._cased: dict[str, str] = {}  # each lower-cased key's subject as probed

    async def heard(self, e: Exception) -> None:
        """The connection's error callback."""
        said = str(e)
        self.errors.append(said)
        named = _PUBLISH_REFUSED.search(said)
        waiting = self._probes.get(named["subject"]) if named else None
        if waiting:
            probe = waiting.popleft()
            if not probe.done():  # else one that gave up waiting: the refusal was still its
                probe.set_result(None)

    async def refused(self, subject: str, body: bytes = b"") -> bool:
        """Request ``subject``: True as soon as the server refuses it by name, False as soon as
        it is answered (see ``answer``)."""
        return await self.answer(subject, body) is None

    async def answer(self, subject: str, body: bytes = b"") -> Any | None:
        """Request ``subject``: its answer, or None as soon as the server refuses it by name;
        ``TimeoutError`` naming it when neither within ``PROBE_TIMEOUT_S``, and nats-py's
        ``NoRespondersError`` when it went through to no one."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Any] = loop.create_future()

        async def on_answer(msg: Any) -> None:
            if not answered.done():
                answered.set_result(msg)

        answers = await self.nc.subscribe(self.nc.new_inbox(), cb=on_answer)
        mine: asyncio.Future[None] = loop.create_future()
        waiting = self._probes.setdefault(subject.lower(), deque())  # as nats-py reports it
        if waiting and self._cased.get(subject.lower()) != subject:
            raise ValueError(
                f"{subject}: another probe waits on a subject differing only in case, and "
                "nats-py lower-cases the server's refusal: the two cannot be told apart"
            )
        self._cased[subject.lower()] = subject
        try:
            # No await between queueing this probe and queueing its publish: the server
            # refuses one subject's publishes in the order they were sent, so each probe
            # takes its own refusal.
            waiting.append(mine)
            try:
                await self.nc.publish(subject, body, reply=answers.subject)
            except BaseException:  # never sent: no refusal will come for it
                waiting.remove(mine)
                raise
            first = asyncio.FIRST_COMPLETED
            await asyncio.wait({mine, answered}, timeout=PROBE_TIMEOUT_S, return_when=first)
            if mine.done():
                return None
            if not answered.done():
                mine.cancel()  # left queued: a refusal that comes late is still its own
                raise TimeoutError(
                    f"{subject}: neither refused nor answered within {PROBE_TIMEOUT_S} s"
                )
            waiting.remove(mine)  # it went through: no refusal will come for it
            if (answered.result().headers or {}).get(Header.STATUS) == "503":  # as a request
                raise nats.errors.NoRespondersError
            return answered.result()
        finally:
            with contextlib.suppress(nats.errors.ConnectionClosedError):  # a test that failed
                await answers.unsubscribe()


async def connect_as(
    url: str, user: str, password: str, *, inbox_prefix: str = "_INBOX", **options: Any
) -> ShippedUser:
    """A ``ShippedUser`` for ``user`` with ``password``. ``inbox_prefix``: the user's own where
    it may not subscribe to ``_INBOX.>`` (a tenant's, the provisioner's), else its replies never
    arrive and every probe that is not refused times out. ``options``: nats.connect's others."""
    shipped = ShippedUser()
    shipped.nc = await nats.connect(
        url,
        user=user,
        password=password,
        error_cb=shipped.heard,
        name=user,
        inbox_prefix=inbox_prefix,
        **options,
    )
    return shipped


async def connect_shipped(url: str, user: str, *, inbox_prefix: str = "_INBOX") -> ShippedUser:
    """``connect_as`` with the password deploy/auth ships for ``user``."""
    return await connect_as(url, user, shipped_password(user), inbox_prefix=inbox_prefix)
