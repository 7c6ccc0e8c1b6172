"""The server's permission refusals, raised as ``PermissionRefused`` naming the subject.

Owns hearing a refusal on the connection's error callback (nats-py reports it asynchronously,
in lower case) and raising it in the call that caused it, so a refused publish or subscription
is never mistaken for a time-out. Must not decide what a tenant may do: the server does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from seedance.core.errors import SeedanceError
from seedance.core.tasks import cancel_until_done_shielded

__all__ = ["TENANT_GRANTS", "PermissionRefused", "Violations"]

#: What a tenant's user may do, said with a refusal of a call that named its subject.
TENANT_GRANTS = (
    "a tenant's user may publish only its own seedance.jobs.<tenant>.<kind>, "
    "seedance.graph.<tenant>.request and seedance.models.<tenant>.upload.*.*, ask "
    "only its own seedance.api.<tenant>.allocation, and read only its own "
    "seedance.slicing.<tenant>.*, seedance.costs.<tenant>.*, "
    "seedance.graph.<tenant>.result and seedance.models.<tenant>.artifact.*.*"
)

_T = TypeVar("_T")


class PermissionRefused(SeedanceError):
    """The server refused this user a publish or subscribe; ``subject`` names what."""

    def __init__(self, message: str, subject: str, server_text: str = "") -> None:
        super().__init__(message)
        self.subject = subject
        #: The server's own words (in lower case: nats-py lowers them).
        self.server_text = server_text


class Violations:
    """The server's permission refusals heard on the connection, for `_guarded` to raise."""

    def __init__(self, inbox_prefix: str = "_INBOX") -> None:
        self._waiters: list[asyncio.Future[PermissionRefused]] = []
        #: nats-py lowers the server's text; an inbox subject gets its prefix's case back.
        self._inbox_prefix = inbox_prefix

    async def heard(self, exc: Exception) -> None:
        text = str(exc)
        if "permissions violation" not in text.lower():
            return
        match = re.search(r'(?:publish|subscription) to "([^"]+)"', text, re.IGNORECASE)
        subject = match.group(1) if match else "?"
        server_text = text.removeprefix("nats: ")
        prefix = self._inbox_prefix
        if subject.startswith(prefix.lower()):
            real = prefix + subject[len(prefix) :]
            server_text = server_text.replace(subject, real)
            subject = real
        hint = (
            " (a tenant's user subscribes only under its own inbox prefix: "
            "seedance.events.subjects.inbox_prefix(tenant), the CLI's --inbox-prefix)"
            if "subscription" in server_text
            else ""
        )
        refused = PermissionRefused(
            f"the server refused this user: {server_text}{hint}", subject, server_text
        )
        for w in self._waiters:
            if not w.done():
                w.set_result(refused)
        self._waiters.clear()

    async def next(self) -> PermissionRefused:
        fut: asyncio.Future[PermissionRefused] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return await fut

    async def guard(
        self, op: Awaitable[_T], *, discard: Callable[[_T], Awaitable[object]] | None = None
    ) -> _T:
        """``op``'s result, or the PermissionRefused the server sends while it runs. A cancel of
        the caller (the CLI's Ctrl-C) is raised whenever it comes, even once ``op`` is done;
        ``discard`` is then awaited with the result it drops (a connection to close)."""
        task = asyncio.ensure_future(op)
        refused = asyncio.ensure_future(self.next())
        try:
            try:
                done, _ = await asyncio.wait({task, refused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Not ``cancel(); await`` under a suppressed CancelledError: a cancel of the
                # caller landing in that await is handed to the task awaited (Task.cancel passes
                # it on) and swallowed with the task's own; the caller ran on (a Ctrl-C at the
                # end of a connect left `seedance costs watch` following for ever).
                try:
                    await cancel_until_done_shielded((task, refused))
                finally:
                    for f in (task, refused):
                        if f.done() and not f.cancelled():
                            f.exception()  # a late error of the one cancelled is not news
        except asyncio.CancelledError:
            if discard is not None and not task.cancelled() and task.exception() is None:
                await discard(task.result())
            raise
        if task in done:
            return task.result()
        raise refused.result()
