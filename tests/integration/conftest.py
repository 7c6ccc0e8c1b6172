"""Fixtures shared by the integration tests that run the shipped NATS authorisation."""

from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from seedance.core import Bus, BusSettings
from seedance.testing.identities import ADMIN, password
from seedance.testing.servers import shipped_auth_server


def shipped_password(user: str) -> str:
    """The password each shipped user gets in these tests (``identities.password``)."""
    return password(user)


@pytest.fixture(scope="module")
def auth_url() -> Iterator[str]:
    """A server running the shipped deploy/auth/nats-auth.conf, one per test module."""
    server = shipped_auth_server(shipped_password)
    try:
        yield server.url
    finally:
        server.stop()


@pytest_asyncio.fixture
async def admin(auth_url: str) -> AsyncIterator[Bus]:
    """The operator (``admin``: unrestricted) on the module's shipped-auth server, to set up
    and inspect what the users under test may not; every catalogue stream is there when it is
    handed out (made again where an earlier test of the module deleted one)."""
    bus = await Bus.connect(
        BusSettings(url=auth_url, user=ADMIN, password=shipped_password(ADMIN), name=ADMIN)
    )
    try:
        await bus.ensure_streams()
        yield bus
    finally:
        await bus.close()
