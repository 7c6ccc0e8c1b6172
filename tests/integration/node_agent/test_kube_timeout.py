"""An API server that accepts the connection and never answers must not hang the node agent:
its pod lists are bounded, and an Allocate then fails with the reason.

The peer is a real TCP server that reads the request and says nothing (what a wedged API
server or a black-holed proxy does); the client is kubernetes_asyncio, as in the product.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client

from seedance.node_agent.allocator import PlacementAllocator
from seedance.node_agent.core.placement import NodeDevices, PlacementBook
from seedance.node_agent.deviceplugin.devices import AllocationError
from seedance.node_agent.kube import NodePods


@pytest.fixture
async def silent_api() -> AsyncIterator[client.ApiClient]:
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65536)  # the request arrives; no answer ever leaves

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    api = client.ApiClient(configuration)
    try:
        yield api
    finally:
        await api.close()
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_silent_api_server_fails_the_list_within_its_bound(
    silent_api: client.ApiClient,
) -> None:
    pods = NodePods(silent_api, "node-a", timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pods.holding(), 10.0)  # unbounded, this one fires at 10 s
    assert time.monotonic() - started < 5.0


async def test_an_allocate_against_a_silent_api_server_fails_with_the_reason(
    silent_api: client.ApiClient,
) -> None:
    allocator = PlacementAllocator(
        node="node-a",
        book=PlacementBook("node-a"),
        pending=NodePods(silent_api, "node-a", timeout_s=0.5).pending,
        devices=lambda: NodeDevices(gpus={}),
    )
    with pytest.raises(AllocationError, match="did not list this node's pending pods"):
        await asyncio.wait_for(allocator.allocate("nvidia.com/gpu", ["d0"]), 10.0)
