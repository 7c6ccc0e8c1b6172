"""Fixtures of the deploy tests that run the auth callout against the shipped config: the
callout's issuer key and a server on the shipped auth block that trusts it, one per module."""

from __future__ import annotations

from collections.abc import Iterator

import nkeys
import pytest

from seedance.core.auth_callout import new_issuer
from seedance.testing.servers import NatsServer, shipped_auth_server
from tests.integration.conftest import shipped_password


@pytest.fixture(scope="module")
def issuer() -> nkeys.KeyPair:
    return new_issuer()


@pytest.fixture(scope="module")
def server(issuer: nkeys.KeyPair) -> Iterator[NatsServer]:
    with shipped_auth_server(shipped_password, issuer=issuer) as s:
        yield s
