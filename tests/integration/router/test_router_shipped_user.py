"""The router's start-up reads of its model store under its shipped NATS user (deploy/auth).

Found by `make compose-check`: nats-py's object store ``list`` looks its stream up by subject
(``$JS.API.STREAM.NAMES``), which the router's declared permissions did not grant, so its
first read of the forecast models timed out and the router restarted for ever in compose.
"""

from __future__ import annotations

from seedance.core import Bus, BusSettings
from seedance.router.forecast_store import ModelStore
from tests.integration.conftest import shipped_password


async def test_the_router_lists_its_models_as_its_shipped_user(auth_url: str) -> None:
    settings = BusSettings(
        url=auth_url, user="router", password=shipped_password("router"), name="router"
    )
    bus = await Bus.connect(settings)
    try:
        store = await ModelStore.open(bus, "default")
        assert await store.names() == []  # an empty store, read without a refusal
        assert await store.latest() is None
    finally:
        await bus.close()
