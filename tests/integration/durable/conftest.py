"""The durable runtimes' integration tests: a server of each test's own (they bind the
catalogue's own durables and replay whole streams, as deployed), running the shipped
authorization."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import own_server_url


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from own_server_url(request)
