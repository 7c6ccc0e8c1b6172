"""The slicer's integration tests: a server of each test's own, running the shipped authorization.

The slicer under its shipped user binds the catalogue's durables (as deployed; the permissions
grant no per-test ``instance`` names), so tests cannot share a server without sharing them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import own_server_url


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_server_url(request)
