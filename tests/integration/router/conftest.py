"""Fixtures: three real Triton servers for the whole session, a fresh gateway per test.

The servers are started in parallel once per session (each takes ~7–25 s on a busy machine);
`victim` is the one the failover test kills, so it is used by no other test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from seedance.core import VirtualClock
from seedance.core.kv import Lease
from seedance.router import plan_leader
from seedance.router.gateway import (
    GatewaySettings,
    LayoutConversion,
    ModelRoute,
    OipGateway,
    WarmupPolicy,
)
from seedance.testing.triton import TritonProcess

# Generous: three servers start at once on two shared cores.
START_TIMEOUT_S = 150.0


@pytest.fixture(scope="session")
def tritons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    log_dir: Path = tmp_path_factory.mktemp("triton-logs")
    servers = {name: TritonProcess(name, log_dir=log_dir) for name in ("a", "b", "victim")}
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_ready(START_TIMEOUT_S)
        yield servers
    finally:
        # Terminate all first so their shutdowns overlap.
        for server in servers.values():
            server.terminate()
        for server in servers.values():
            server.stop()


MODELS = (
    ModelRoute(name="echo"),
    ModelRoute(
        name="nchw_stats",
        input_layouts=(
            LayoutConversion(tensor="image", client_layout="NHWC", backend_layout="NCHW"),
        ),
        output_layouts=(
            LayoutConversion(tensor="image_out", client_layout="NHWC", backend_layout="NCHW"),
        ),
    ),
    ModelRoute(name="slow", warm_up=False),
)

# Small bounds keep each gateway's warm-up to ~10 requests per model.
TEST_WARMUP = WarmupPolicy(window=3, tolerance=0.5, min_requests=6, max_requests=30)


def make_gateway(replicas: dict[str, str], registry: CollectorRegistry) -> OipGateway:
    return OipGateway(
        GatewaySettings(
            replicas=replicas,
            models=MODELS,
            regions=("eu-west", "us-east"),
            warmup=TEST_WARMUP,
            probe_interval_s=0.2,
        ),
        registry=registry,
    )


@pytest.fixture
def gateway_factory() -> Any:
    """`make_gateway` for tests that pick their own replicas."""
    return make_gateway


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def gateway(
    tritons: dict[str, Any], registry: CollectorRegistry
) -> AsyncIterator[OipGateway]:
    gw = make_gateway({"a": tritons["a"].address, "b": tritons["b"].address}, registry)
    async with gw:
        await gw.wait_ready(timeout_s=60)
        yield gw


@pytest.fixture
def lease_held_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests that take the planner's lease by hand (`Lease.try_acquire`, no keeper running)
    and move a clock whose sleep moves it a planning bin (15 s) at a time: a lease is lost by
    its clock once its TTL (10 s) has passed since its last refresh, and a refresh's deadline
    is a sleep on that clock (`seedance.core.kv.Lease`). What these tests check is the
    planning and the handover by the key, not that deadline (tests/integration/bus/
    test_lease.py), so the lease gets a virtual clock of its own that nothing moves."""

    def by_hand(kv: Any, key: str, holder: str, clock: Any, ttl_s: float) -> Lease:
        return Lease(kv, key, holder, VirtualClock(), ttl_s)

    monkeypatch.setattr(plan_leader, "Lease", by_hand)
