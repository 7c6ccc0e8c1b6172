"""A client of the kubelet's ``v1.PodResourcesLister`` over its unix socket (grpc.aio).

Owns the three calls (List, Get, GetAllocatableResources) and their translation into the pure
``core.labels.ContainerDevices`` rows. It must not decide labels: ``core.labels`` does.
"""

from __future__ import annotations

import grpc

from seedance.node_agent.core.labels import ContainerDevices
from seedance.node_agent.podresources import api_pb2, api_pb2_grpc

__all__ = ["POD_RESOURCES_SOCKET", "PodResourcesClient", "container_devices"]

#: The kubelet's socket (mount its directory, not the socket: a kubelet restart replaces it).
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def container_devices(pod: api_pb2.PodResources) -> list[ContainerDevices]:
    return [
        ContainerDevices(
            namespace=pod.namespace,
            pod=pod.name,
            container=c.name,
            resource=d.resource_name,
            device_ids=tuple(d.device_ids),
        )
        for c in pod.containers
        for d in c.devices
    ]


class PodResourcesClient:
    def __init__(self, socket_path: str = POD_RESOURCES_SOCKET, *, timeout_s: float = 5.0) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{socket_path}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        self._timeout_s = timeout_s

    async def list_pods(self) -> list[ContainerDevices]:
        resp = await self._stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout_s)
        return [row for pod in resp.pod_resources for row in container_devices(pod)]

    async def get(self, namespace: str, pod: str) -> list[ContainerDevices]:
        resp = await self._stub.Get(
            api_pb2.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace),
            timeout=self._timeout_s,
        )
        return container_devices(resp.pod_resources)

    async def allocatable(self) -> dict[str, tuple[str, ...]]:
        """Device IDs the kubelet can allocate, by resource name."""
        resp = await self._stub.GetAllocatableResources(
            api_pb2.AllocatableResourcesRequest(), timeout=self._timeout_s
        )
        out: dict[str, list[str]] = {}
        for d in resp.devices:
            out.setdefault(d.resource_name, []).extend(d.device_ids)
        return {k: tuple(v) for k, v in out.items()}

    async def close(self) -> None:
        await self._channel.close()
