"""Fixtures for the graph-compiler service tests: a compiler on the session's nats-server, a
client, a unique tenant, and a real HTTP server for URL fetches."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from seedance.core import BusSettings, ServiceRuntime
from seedance.graph_compiler.service import GraphCompilerService
from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.sdk.client import SeedanceClient
from tests.conftest import serving
from tests.integration.graph.model_server import ModelServer, serve_models

StartCompiler = Callable[..., Awaitable[GraphCompilerService]]


@pytest.fixture
async def start_compiler(nats_url: str) -> AsyncIterator[StartCompiler]:
    async with contextlib.AsyncExitStack() as running:

        async def start(**settings: Any) -> GraphCompilerService:
            rt = ServiceRuntime("graph-compiler", BusSettings(url=nats_url, name="gc-test"))
            svc = GraphCompilerService(rt, GraphCompilerSettings(**settings))
            return await running.enter_async_context(serving(svc))

        yield start


@pytest.fixture
async def client(nats_url: str) -> AsyncIterator[SeedanceClient]:
    async with await SeedanceClient.connect(nats_url) as c:
        yield c


@pytest.fixture
def tenant(unique: str) -> str:
    return f"t{unique}"


@pytest.fixture
def model_server() -> Iterator[ModelServer]:
    yield from serve_models()
