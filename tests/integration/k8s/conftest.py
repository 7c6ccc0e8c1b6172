"""Fixtures for the k8s tier: the test API server in-process, a kubernetes_asyncio client
configured from the kubeconfig it writes (the way the bridge will be configured), and a bridge
test's `Env` (its tenant, namespace, bus and trail)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from seedance.core import Bus
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings
from tests.conftest import own_server_url
from tests.integration.k8s.bridge import Env, environment


@pytest.fixture
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server of each test's own: the slicer and the bridge bind the catalogue's durables."""
    yield from own_server_url(request)


@pytest.fixture
async def kube_api() -> AsyncIterator[KubeApiServer]:
    async with KubeApiServer(KubeApiSettings(bookmark_interval_s=0.5)) as api:
        yield api


@pytest.fixture
async def k8s(kube_api: KubeApiServer, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(kube_api.kubeconfig(tmp_path / "kubeconfig")), client_configuration=cfg
    )
    async with client.ApiClient(configuration=cfg) as api_client:
        yield api_client


@pytest.fixture
async def env(
    kube_api: KubeApiServer, bus: Bus, unique: str, tmp_path: Path, nats_url: str
) -> AsyncIterator[Env]:
    async with environment(kube_api, bus, unique, tmp_path, nats_url) as e:
        yield e
