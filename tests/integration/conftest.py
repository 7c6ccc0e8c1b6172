"""Fixtures shared by the integration tests that run the shipped NATS authorisation."""

from collections.abc import Iterator

import pytest

from seedance.testing.identities import password
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
