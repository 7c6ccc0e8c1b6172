"""Fixtures of the deploy tests that run the auth callout against the shipped config: the
callout's issuer key, its curve key (the server seals each request to it) and a server on the
shipped auth block that trusts both, one per module."""

from __future__ import annotations

from collections.abc import Iterator

import nkeys
import pytest

from seedance.core.auth_callout import new_issuer
from seedance.core.xkeys import CurveKeyPair, new_curve_keys
from seedance.testing.servers import NatsServer, shipped_auth_server
from tests.integration.conftest import shipped_password


@pytest.fixture(scope="module")
def issuer() -> nkeys.KeyPair:
    return new_issuer()


@pytest.fixture(scope="module")
def xkey() -> CurveKeyPair:
    return new_curve_keys()


@pytest.fixture(scope="module")
def server(issuer: nkeys.KeyPair, xkey: CurveKeyPair) -> Iterator[NatsServer]:
    with shipped_auth_server(shipped_password, issuer=issuer, xkey=xkey) as s:
        yield s
