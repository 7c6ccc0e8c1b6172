"""Beside NVIDIA's GPU operator: the node agent never registers a second plugin for a resource
another plugin serves on its node.

The kubelet side is the test kubelet (``kubelet.NodeKubelet``): its ``Registration`` service on
a real ``kubelet.sock``, a ``ListAndWatch`` kept with each registered plugin, pod-resources
``GetAllocatableResources`` over a real unix socket, and the Node's capacity and allocatable
written to the test API server over HTTP as the kubelet's status update. NVIDIA's device
plugin is played by a device-plugin server of ours registering ``nvidia.com/gpu`` from the
socket NVIDIA's uses (``nvidia-gpu.sock``) with NVML-style UUIDs: the kubelet sees the same
wire protocol. The agent runs as its shipped NATS user on the shipped-auth server.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client
from prometheus_client import generate_latest

from seedance.core import ServiceRuntime
from seedance.core.errors import StartRefused
from seedance.node_agent.deviceplugin import DeviceKind, DevicePluginServer, PluginDevice
from seedance.node_agent.kube import allocatable_counts
from seedance.node_agent.service import NodeAgentService
from seedance.testing.identities import as_user
from seedance.testing.kube_api import KubeApiServer
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.node_agent.agent import agent_settings, node_agent
from tests.integration.node_agent.kubelet import NodeKubelet
from tests.integration.node_agent.test_allocation import NODE, UUIDS, kube_api
from tests.integration.node_agent.test_service import NodeNvml

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
NVIDIA_SOCKET = "nvidia-gpu.sock"


@contextlib.asynccontextmanager
async def node(
    tmp_path: Path,
) -> AsyncIterator[tuple[KubeApiServer, client.ApiClient, NodeKubelet]]:
    """The API server with the node, and the node's test kubelet serving its sockets."""
    plugin_dir = tempfile.mkdtemp(prefix="co-")  # a unix socket path must stay short
    try:
        async with kube_api(tmp_path) as (api, api_client):
            kubelet = NodeKubelet(
                NODE, plugin_dir, os.path.join(plugin_dir, "pod-resources.sock"), api_client
            )
            await kubelet.serve()
            try:
                yield api, api_client, kubelet
            finally:
                await kubelet.stop()
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def nvidia_device_plugin(kubelet: NodeKubelet) -> AsyncIterator[DevicePluginServer]:
    """NVIDIA's device plugin as the kubelet meets it: nvidia.com/gpu, one device per GPU by
    UUID, registered from nvidia-gpu.sock; stopped (its socket removed) after the block."""
    devices = [
        PluginDevice(id=u, kind=DeviceKind.WHOLE_GPU, uuid=u, gpu_uuid=u) for u in UUIDS.values()
    ]
    server = DevicePluginServer(
        resource_name=GPU,
        socket_path=os.path.join(kubelet.plugin_dir, NVIDIA_SOCKET),
        devices=devices,
        pre_start_required=False,
    )
    await server.start()
    try:
        await server.register(os.path.join(kubelet.plugin_dir, "kubelet.sock"))
        yield server
    finally:
        await server.stop()


async def node_allocatable(api_client: client.ApiClient) -> dict[str, int]:
    resp = await client.CoreV1Api(api_client).read_node(NODE, _preload_content=False)
    try:
        return allocatable_counts(await resp.json())
    finally:
        resp.release()


def agent(
    api_client: client.ApiClient, kubelet: NodeKubelet, auth_url: str, tmp_path: Path
) -> tuple[NodeAgentService, ServiceRuntime]:
    settings = agent_settings(
        kubelet.plugin_dir,
        tmp_path,
        kubelet.socket,
        # NVIDIA's plugin stays registered throughout the refusal below: the outcome does not
        # depend on how long the agent looks again, only that it does.
        plugin_conflict_wait_s=0.3,
    )
    bus = as_user(auth_url, "node-agent")
    return node_agent(settings, bus, kube_client=api_client, nvml=NodeNvml())


async def test_the_agent_refuses_to_register_beside_nvidias_plugin_and_says_what_to_switch_off(
    auth_url: str, tmp_path: Path
) -> None:
    async with node(tmp_path) as (_api, api_client, kubelet):
        async with nvidia_device_plugin(kubelet):
            await eventually(
                lambda: _counts_gpus(api_client, 4), what="the Node counts NVIDIA's 4 GPUs"
            )
            refused, runtime = agent(api_client, kubelet, auth_url, tmp_path)
            with pytest.raises(StartRefused) as caught:
                await refused.start()
            await refused.close()
            message = str(caught.value)
            assert f"{GPU} is already served on node {NODE} by another device plugin" in message
            assert "the Node's allocatable counts 4" in message
            assert f"the kubelet lists 4 device(s) for it ({UUIDS[0]}" in message
            assert NVIDIA_SOCKET in message
            assert "label the node nvidia.com/gpu.deploy.device-plugin=false" in message
            # Nothing of the agent's registered: NVIDIA's plugin still serves the resource.
            assert kubelet.registrations == [(GPU, NVIDIA_SOCKET)]
            assert kubelet.plugins[GPU].endpoint == NVIDIA_SOCKET
            text = generate_latest(runtime.registry).decode()
            assert f'seedance_node_agent_plugin_conflicts_total{{resource="{GPU}"}} 1.0' in text

        # The operator switches NVIDIA's plugin off on the node: the kubelet still lists its
        # devices (pod-resources keeps a gone plugin's), unhealthy, and the Node counts none.
        await eventually(lambda: _counts_gpus(api_client, 0), what="NVIDIA's devices unhealthy")
        assert sorted(kubelet.plugins[GPU].devices) == sorted(UUIDS.values())
        started, _ = agent(api_client, kubelet, auth_url, tmp_path)
        async with serving(started):
            assert kubelet.plugins[GPU].endpoint == "seedance-nvidia-com_gpu.sock"
            assert [r for r, _ in kubelet.registrations] == [
                GPU,
                GPU,
                "seedance.io/gpu-milli",
            ]
            # Now the Node counts the agent's GPUs.
            await eventually(lambda: _counts_gpus(api_client, 4), what="the agent's 4 GPUs")


async def _counts_gpus(api_client: client.ApiClient, n: int) -> bool:
    return (await node_allocatable(api_client)).get(GPU, 0) == n
