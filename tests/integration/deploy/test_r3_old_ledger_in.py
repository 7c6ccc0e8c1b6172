"""Review-3 finding 4 (the reviewer's proof): a SEEDANCE_LEDGER_IN created by a build of
72244b73..570e0d8b (it sourced SEEDANCE_JOBS) read as a "planted copy" and every provisioning
service refused to start; it is drift now."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from seedance.core import Bus, BusSettings
from seedance.core.errors import StartRefused
from seedance.events.subjects import STREAMS, StreamSource, ledger
from seedance.testing.servers import shipped_auth_server
from tests.integration.conftest import shipped_password


@pytest.fixture
def fresh_url() -> Iterator[str]:
    # unprovisioned: the old release's streams are created here, as it created them
    with shipped_auth_server(shipped_password, provisioned=False) as server:
        yield server.url


async def _bus(url: str, user: str) -> Bus:
    return await Bus.connect(
        BusSettings(url=url, user=user, password=shipped_password(user), name=user)
    )


async def test_an_old_release_s_ledger_input_starts_the_fleet(fresh_url: str) -> None:
    old = []
    for spec in STREAMS:
        if spec.name == ledger.IN_STREAM:  # 72244b73's catalogue: tenants' jobs sourced too
            spec = spec.__class__(
                **{
                    **spec.__dict__,
                    "sources": (StreamSource("SEEDANCE_JOBS", "seedance.jobs.>"), *spec.sources),
                }
            )
        old.append(spec)
    admin = await _bus(fresh_url, "admin")
    try:
        await admin.ensure_streams(old)  # what that release's services created
    finally:  # a refusal too: a connection left to the GC fails the next test
        await admin.close()
    slicer = await _bus(fresh_url, "slicer")
    try:
        await slicer.ensure_streams()  # the upgraded slicer's start
    except StartRefused as exc:
        pytest.fail(f"legit older deployment refused: {exc}")
    finally:
        await slicer.close()
