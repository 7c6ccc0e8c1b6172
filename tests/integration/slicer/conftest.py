"""The slicer's integration tests: a server of each test's own, running the shipped authorization.

The slicer under its shipped user binds the catalogue's durables (as deployed; the permissions
grant no per-test ``instance`` names), so tests cannot share a server without sharing them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from seedance.core import Bus
from tests.conftest import own_server_url
from tests.integration.slicer.test_slicer_service import Decisions, fast_forward


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_server_url(request)


@pytest.fixture
async def tenants(bus: Bus, unique: str) -> AsyncIterator[tuple[Bus, Decisions, str, str]]:
    """Two tenants of the test's own (acme, globex) and a reader of their decisions."""
    await fast_forward(bus, unique)
    acme, globex = f"acme{unique}", f"globex{unique}"
    decisions = await Decisions.open(bus, acme, globex)
    try:
        yield bus, decisions, acme, globex
    finally:
        await decisions.close()
