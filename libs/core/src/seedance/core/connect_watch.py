"""nats-py's connection callbacks as structured log lines, and the refusals a caller awaits.

Owns ``ConnectWatch`` (what `Bus.connect` hands nats-py as its error, disconnect and reconnect
callbacks: the first connection's failure said once and plainly, one line a minute while a
lost connection retries, giving a lost connection up after ``BusSettings.reconnect_for_s``
(a command line's client; services retry for ever), and the publish refusals
`Bus.create_or_await` listens for) and the wording of a connection's identity. It must not
connect, publish or know the catalogue.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import nats.errors

from seedance.core.clock import Clock
from seedance.core.errors import BusUnavailable
from seedance.core.logs import get_logger

if TYPE_CHECKING:
    from seedance.core.bus import BusSettings

__all__ = ["ConnectWatch", "describe", "who"]

log = get_logger(__name__)

#: While the connection is lost, at most one error line per this many seconds.
_ERROR_LINE_EVERY_S = 60.0
#: How nats-server names a refused publish (nats-py hands it to the error callback, lower-cased).
_DENIED = re.compile(r'permissions violation for publish to "([^"]+)"', re.IGNORECASE)


def who(settings: BusSettings) -> str:
    if settings.creds:
        return f"the credentials in {settings.creds} (NATS_CREDS)"
    if settings.user:
        return f"user {settings.user!r} (NATS_USER / NATS_PASSWORD)"
    return "no user (NATS_USER and NATS_CREDS unset)"


def _is_auth_error(exc: BaseException) -> bool:
    return isinstance(exc, nats.errors.AuthorizationError) or (
        "authorization violation" in str(exc).lower()
    )


class ConnectWatch:
    """nats-py's callbacks as structured log lines (its defaults log multi-line tracebacks).

    During the first connection it remembers the last error, logs the first failure once and
    stops the attempts at an authorization violation (retrying a wrong password cannot help).
    """

    def __init__(self, settings: BusSettings, clock: Clock) -> None:
        self.settings = settings
        self._clock = clock
        self.connected = False
        self.closing = False  # our own close: its disconnect is not news
        self.last_error: BaseException | None = None
        self.refused = asyncio.Event()
        #: Publish subjects a caller waits to hear refused (`Bus.create_or_await`).
        self.denials: list[tuple[str, asyncio.Event]] = []
        self._failures = 0
        self._failing_since_log = 0  # errors since the last line, once connected
        self._last_line = 0.0
        #: Set once a lost connection is given up (not back within ``reconnect_for_s``, or
        #: closed by nats-py itself): what a reader waiting for a message ends on.
        self.gave_up = asyncio.Event()
        #: Closes the connection (`Bus.connect` hands nats-py's ``close``): the give-up.
        self.close_connection: Callable[[], Awaitable[None]] | None = None
        self._back = asyncio.Event()
        self._giving_up: asyncio.Task[None] | None = None

    async def error(self, exc: Exception) -> None:
        denied = _DENIED.search(str(exc))
        # Both sides lower-cased: nats-py lower-cases the server's text today; a release that
        # kept its case must not turn the refusal into a 5 s timeout and a crash loop.
        refused = denied.group(1).lower() if denied else None
        awaited = [e for s, e in self.denials if refused == s.lower()]
        for event in awaited:
            event.set()
        if awaited:  # expected, and its waiter says what it means (stream_not_provisioned)
            return
        if not self.connected:
            self.last_error = exc
            self._failures += 1
            if _is_auth_error(exc):
                self.refused.set()
            elif self._failures == 1:
                log.warning(
                    "nats_connect_retrying",
                    url=self.settings.url,
                    error=describe(exc),
                    within_s=self.settings.connect_timeout_s,
                )
            return
        # A reconnect loop fails every reconnect_time_wait (2 s): one line, then one a minute
        # with the count, not hundreds.
        self._failing_since_log += 1
        now = self._clock.monotonic()
        if not self._last_line or now - self._last_line >= _ERROR_LINE_EVERY_S:
            log.warning(
                "nats_error",
                url=self.settings.url,
                error=describe(exc),
                errors_since_last_line=self._failing_since_log,
            )
            self._failing_since_log = 0
            self._last_line = now

    async def disconnected(self) -> None:
        if not self.connected or self.closing or self.gave_up.is_set():
            return
        log.warning("nats_disconnected", url=self.settings.url)
        limit_s = self.settings.reconnect_for_s
        if limit_s is not None and self._giving_up is None:
            self._back.clear()
            self._giving_up = asyncio.create_task(self._give_up_after(limit_s))

    async def _give_up_after(self, limit_s: float) -> None:
        # nats-py's own bound counts attempts per server, and a finite one also ends the first
        # connection with NoServersError before connect_timeout_s: a time bound is what a user
        # can be told, so the reconnect loop runs for ever and is closed from here.
        try:
            await asyncio.wait_for(self._back.wait(), limit_s)
        except TimeoutError:
            if self.closing:  # closed by us meanwhile (`stop_giving_up` came too late)
                return
            self._giving_up = None  # closing now: not to be cancelled (`stop_giving_up`)
            log.warning("nats_reconnect_given_up", url=self.settings.url, after_s=limit_s)
            if self.close_connection is not None:
                with contextlib.suppress(Exception):
                    await self.close_connection()
            self.gave_up.set()

    def stop_giving_up(self) -> None:
        """Our own close: a give-up still waiting is cancelled (it would log, close and set
        ``gave_up`` for a connection that was closed on purpose)."""
        if self._giving_up is not None:
            self._giving_up.cancel()
            self._giving_up = None

    async def reconnected(self) -> None:
        self._failing_since_log = 0
        self._last_line = 0.0
        self._back.set()  # the give-up waiting on it ends; a later loss starts its own
        self._giving_up = None
        log.info("nats_reconnected", url=self.settings.url)

    async def closed(self) -> None:
        """nats-py closed the connection: not our own close, it will not come back."""
        if self.connected and not self.closing:
            self.gave_up.set()

    def lost(self) -> BusUnavailable:
        """What a command that failed while its connection was down (or given up) is told."""
        s = self.settings
        if self.gave_up.is_set():
            bound = f" for {s.reconnect_for_s:g} s" if s.reconnect_for_s is not None else ""
            why = f"no reconnection{bound}, gave up"
        else:
            why = "reconnecting when the command failed"
        return BusUnavailable(
            f"connection to NATS at {s.url} lost ({why}). Check that the nats-server there "
            "runs; SEEDANCE_CONNECT_TIMEOUT_S sets how long a lost connection is retried.",
            refused=False,
        )

    def failure(self) -> BusUnavailable:
        s = self.settings
        exc = self.last_error
        if self.refused.is_set():  # sticky: nats-py may report the closed socket after it
            return BusUnavailable(
                f"NATS at {s.url} refused {who(s)}: authorization violation. Check the user "
                "and password (or credentials file) against the server's authorization "
                "(deploy/auth/users.yaml for Seedance's own servers).",
                refused=True,
            )
        why = describe(exc) if exc is not None else "no answer"
        return BusUnavailable(
            f"could not connect to NATS at {s.url} within {s.connect_timeout_s:g} s ({why}). "
            "Check that a nats-server runs there and that NATS_URL names it (host and port); "
            "SEEDANCE_CONNECT_TIMEOUT_S sets how long to try.",
            refused=False,
        )


def describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.replace("\n", " ")
