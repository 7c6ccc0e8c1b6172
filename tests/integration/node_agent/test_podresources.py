"""Pod labels from the kubelet's pod-resources API: a server of ours speaks the kubelet's side
(v1.PodResourcesLister) over a real unix socket; the agent's client lists, gets and reads the
allocatable devices, and the metrics it exports carry dcgm-exporter's Kubernetes-mode labels."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from seedance.node_agent.core.labels import Owner
from seedance.node_agent.metrics import NodeAgentMetrics
from seedance.node_agent.podlabels import PodLabeller
from seedance.node_agent.podresources import PodResourcesClient, api_pb2, api_pb2_grpc

GPU = [f"GPU-{i:08d}-aaaa-bbbb-cccc-000000000000" for i in range(3)]


class FakeKubeletPodResources(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's side: what it would report for the pods it admitted."""

    def __init__(self) -> None:
        def dev(res: str, *ids: str) -> api_pb2.ContainerDevices:
            return api_pb2.ContainerDevices(resource_name=res, device_ids=list(ids))

        self.pods = [
            api_pb2.PodResources(
                name="train-0",
                namespace="team-a",
                containers=[
                    api_pb2.ContainerResources(
                        name="main", devices=[dev("nvidia.com/gpu", GPU[0], GPU[1])]
                    ),
                    api_pb2.ContainerResources(name="sidecar"),
                ],
            ),
            # Two pods on one shared GPU: the kubelet's IDs are replicas, not UUIDs.
            api_pb2.PodResources(
                name="infer-a",
                namespace="team-b",
                containers=[
                    api_pb2.ContainerResources(
                        name="server", devices=[dev("seedance.io/gpu-milli", "r1", "r2")]
                    ),
                ],
            ),
            api_pb2.PodResources(
                name="infer-b",
                namespace="team-b",
                containers=[
                    api_pb2.ContainerResources(
                        name="server", devices=[dev("seedance.io/gpu-milli", "r3")]
                    ),
                ],
            ),
        ]

    async def List(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> api_pb2.ListPodResourcesResponse:
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    async def Get(
        self, request: api_pb2.GetPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.GetPodResourcesResponse:
        for p in self.pods:
            if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                return api_pb2.GetPodResourcesResponse(pod_resources=p)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")
        raise AssertionError  # abort raises

    async def GetAllocatableResources(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse(
            devices=[
                api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=GPU[:2]),
                api_pb2.ContainerDevices(
                    resource_name="seedance.io/gpu-milli", device_ids=["r1", "r2", "r3"]
                ),
            ]
        )


@pytest.fixture
def sock() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="pr-")
    yield os.path.join(path, "kubelet.sock")
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(fake: FakeKubeletPodResources, sock: str) -> AsyncIterator[None]:
    """``fake`` as the kubelet's pod-resources API over a real unix socket at ``sock``."""
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def kubelet(sock: str) -> AsyncIterator[FakeKubeletPodResources]:
    fake = FakeKubeletPodResources()
    async with serving(fake, sock):
        yield fake


async def test_list_get_allocatable_over_the_socket(
    kubelet: FakeKubeletPodResources, sock: str
) -> None:
    client = PodResourcesClient(sock)
    try:
        rows = await client.list_pods()
        assert [(r.pod, r.container, r.device_ids) for r in rows] == [
            ("train-0", "main", (GPU[0], GPU[1])),
            ("infer-a", "server", ("r1", "r2")),
            ("infer-b", "server", ("r3",)),
        ]
        (got,) = await client.get("team-b", "infer-b")
        assert (got.namespace, got.resource, got.device_ids) == (
            "team-b",
            "seedance.io/gpu-milli",
            ("r3",),
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get("team-b", "gone")
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert await client.allocatable() == {
            "nvidia.com/gpu": (GPU[0], GPU[1]),
            "seedance.io/gpu-milli": ("r1", "r2", "r3"),
        }
    finally:
        await client.close()


async def test_metrics_carry_dcgm_exporters_pod_labels(
    kubelet: FakeKubeletPodResources, sock: str
) -> None:
    registry = CollectorRegistry()
    metrics = NodeAgentMetrics(registry)
    client = PodResourcesClient(sock)
    # The shared GPU's replicas mean GPU 2: the agent granted both pods that GPU.
    granted = {("team-b", "infer-a"): (GPU[2],), ("team-b", "infer-b"): (GPU[2],)}
    labeller = PodLabeller(client, metrics, known_uuids=lambda: GPU, granted=lambda: granted)
    try:
        owners = await labeller.refresh()
        assert owners == {
            GPU[0]: [Owner("train-0", "team-a", "main")],
            GPU[1]: [Owner("train-0", "team-a", "main")],
            GPU[2]: [Owner("infer-a", "team-b", "server"), Owner("infer-b", "team-b", "server")],
        }
        text = generate_latest(registry).decode()
        assert (
            f'seedance_node_agent_gpu_pod_info{{UUID="{GPU[2]}",container="server",'
            'namespace="team-b",pod="infer-b"} 1.0'
        ) in text
        # The pod ends: the kubelet stops reporting it and its series goes.
        del kubelet.pods[0]
        await labeller.refresh()
        assert 'pod="train-0"' not in generate_latest(registry).decode()
    finally:
        await client.close()
