"""Test-session fixtures shared by every tier.

The tier of a test is its directory: ``pytest_collection_modifyitems`` marks everything under
``tests/integration/`` ``integration`` and under ``tests/e2e/`` ``e2e`` (so ``-m "not e2e"``
cannot miss a file that forgot its ``pytestmark``); other marks stay in the modules.

Integration tests talk to a real nats-server: by default the pinned binary in the project's
virtual environment, started once per session on a random port with a temporary store, running
the shipped authorization (``deploy/auth/nats-auth.conf``) with test passwords; with
``--nats-url`` they run against an external server instead, which must run the same block with
the same passwords (``seedance.testing.identities.password``: ``NATS_PASSWORD_<USER>`` when set,
else ``test-<user>-secret``).

Every connection of the session goes through ``identities.connect_policy``: a service started
in-process connects as its own generated user (any other is refused), test code that names no
user as the operator. Services started as processes connect as their own users too
(``ServiceProcesses``); after each test, the connections to the servers started here are
checked: one named ``seedance-<service>`` authorised as another user fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

import seedance.core.logs
from seedance.core.bus import set_connect_policy
from seedance.testing import identities
from seedance.testing.servers import NatsServer, shipped_auth_server

# Entry points called in-process configure logging; with cached loggers, a test's capture_logs
# would then see nothing from a logger some earlier test used (seedance.core.logs).
seedance.core.logs.CACHE_LOGGERS = False

TESTS = Path(__file__).resolve().parent
#: Directory under tests/ -> the mark every test in it carries.
TIERS = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


def tier_marks(path: Path) -> list[pytest.MarkDecorator]:
    """The marks a test module at ``path`` gets from its directory."""
    rel = path.resolve().relative_to(TESTS)
    return [TIERS[rel.parts[0]]] if len(rel.parts) > 1 and rel.parts[0] in TIERS else []


@pytest.fixture(autouse=True)
def logging_as_it_was() -> Iterator[None]:
    """Each test ends with logging configured as it began. An entry point called in-process
    (the CLI's ``main``) configures structlog and the root logger for the whole process: the
    level it sets (CRITICAL, for the CLI) silenced every later test's ``capture_logs``."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in tier_marks(item.path):
            item.add_marker(mark)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nats-url", default=None, help="use this nats-server, not a new one")


#: The servers started here that are running now, each with the connections already checked.
_RUNNING: list[tuple[NatsServer, set[int]]] = []


def shipped_test_server() -> NatsServer:
    """The pinned nats-server running the shipped authorization, with each user's test
    password, monitored (``check_identities``)."""
    return shipped_auth_server(identities.password, monitor=True)


def check_identities(server: NatsServer, seen: set[int], state: str = "all") -> None:
    """Fail if a connection to ``server`` (in ``state``: ``open``, ``all``) not in ``seen``
    ran a service as another user than its own."""
    conns = [c for c in server.connections(state) if c.get("cid") not in seen]
    seen.update(int(c["cid"]) for c in conns)
    foreign = identities.foreign_connections(conns)
    assert not foreign, "services connected as other users than their own: " + "; ".join(foreign)


def nats_server_url(external: str | None) -> Iterator[str]:
    """``external`` if given, else a fresh pinned nats-server's URL (``shipped_test_server``),
    stopped afterwards, once every connection it saw is checked (``check_identities``)."""
    if external:
        yield external
        return
    server = shipped_test_server()
    running: tuple[NatsServer, set[int]] = (server, set())
    _RUNNING.append(running)
    try:
        yield server.url
    finally:
        _RUNNING.remove(running)
        try:
            check_identities(*running)
        finally:
            server.stop()


def started_server(url: str) -> NatsServer | None:
    """The running server started here at ``url`` (None for an external one)."""
    return next((server for server, _ in _RUNNING if server.url == url), None)


@pytest.fixture(scope="session", autouse=True)
def connect_as_deployed() -> Iterator[None]:
    """Every connection of the session as ``identities.connect_policy`` says."""
    previous = set_connect_policy(identities.connect_policy)
    yield
    set_connect_policy(previous)


@pytest.fixture(autouse=True)
def services_as_themselves() -> Iterator[None]:
    """After each test, the connections still open to the running test servers (the closed
    ones are checked when a server stops: a full listing per test would cost too much)."""
    yield
    for server, seen in _RUNNING:
        check_identities(server, seen, state="open")


def own_server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """For a module or directory whose services bind the catalogue's own durables (as deployed,
    not per-test ``instance`` names, which the shipped permissions do not grant): its ``nats_url``
    fixture yields from this, a fresh server per test (or ``--nats-url``'s)."""
    yield from nats_server_url(request.config.getoption("--nats-url"))


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    yield from nats_server_url(
        request.config.getoption("--nats-url") or os.environ.get("SEEDANCE_TEST_NATS_URL")
    )


@contextlib.asynccontextmanager
async def serving(service: Any, stop_timeout_s: float | None = 15.0) -> AsyncIterator[Any]:
    """``service`` (a Lifecycle) started and running for the block; then stopped, its run
    awaited (bounded by ``stop_timeout_s``) and closed."""
    await service.start()
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        await service.stop()
        try:
            await asyncio.wait_for(task, timeout=stop_timeout_s)
        finally:
            await service.close()  # also after a run that would not end: no leak into the next test


@pytest.fixture
def unique() -> str:
    """A short unique token for per-test names."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[object]:
    from seedance.core import Bus, BusSettings

    b = await Bus.connect(BusSettings(url=nats_url, name="test"))
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close()
