"""Fixtures of the ledger's integration tests: a server of each test's own, and a bus on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from seedance.core import Bus, BusSettings
from seedance.testing.servers import NatsServer
from tests.conftest import check_identities, shipped_test_server


@pytest.fixture
def server() -> Iterator[NatsServer]:
    """A server of the test's own (replicas replay the merged stream from its start), running
    the shipped authorization like the session's."""
    s = shipped_test_server()
    try:
        yield s
        check_identities(s, set())
    finally:
        s.stop()


@pytest.fixture
async def bus(server: NatsServer) -> AsyncIterator[Bus]:
    b = await Bus.connect(BusSettings(url=server.url, name="test"))
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()
