"""Fixtures for the k8s tier: the test API server in-process and a kubernetes_asyncio client
configured from the kubeconfig it writes (the way the bridge will be configured)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config

from seedance.testing.kube_api import KubeApiServer, KubeApiSettings


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
