"""Raw probes of the shipped NATS users: a request the server answers, or refuses by name.

Shared by the grant tests (leases, the ledger's input): each probe is a raw request on a
connection as one user of deploy/auth; the server's refusal arrives on the error callback
("Permissions Violation for Publish to <subject>"), not as a reply.
"""

from __future__ import annotations

import contextlib
from typing import Any

import nats
import nats.errors

from seedance.testing.waits import eventually
from tests.integration.conftest import shipped_password


class ShippedUser:
    """A raw connection as one shipped user that records the server's refusals."""

    def __init__(self, nc: Any, errors: list[str]) -> None:
        self.nc, self.errors = nc, errors

    async def refused(self, subject: str, body: bytes = b"") -> bool:
        """Request `subject`: True when the server refuses it by name, False when answered."""
        try:
            await self.nc.request(subject, body, timeout=2)
        except nats.errors.TimeoutError:
            pass
        else:
            return False

        def named() -> bool:  # the refusal comes by callback
            return any(subject.lower() in e.lower() for e in self.errors)

        with contextlib.suppress(TimeoutError):
            await eventually(named, 3.0)
        return named()


async def connect_shipped(url: str, user: str, *, inbox_prefix: str = "_INBOX") -> ShippedUser:
    """``inbox_prefix``: the user's own where it may not subscribe to ``_INBOX.>`` (a tenant's,
    the provisioner's), else its replies never arrive and every probe reads as a time-out."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    nc = await nats.connect(
        url,
        user=user,
        password=shipped_password(user),
        error_cb=on_error,
        name=user,
        inbox_prefix=inbox_prefix,
    )
    return ShippedUser(nc, errors)
