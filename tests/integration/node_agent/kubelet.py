"""A test kubelet's device manager and pod-resources API, over real unix sockets.

What the real kubelet does with device plugins, in the order it does it (``pkg/kubelet/cm/
devicemanager``): at a pod's admission it picks free device IDs of each resource the container
asks for from the plugin's ListAndWatch list, calls the plugin's ``Allocate`` (which names no
pod), and only once that returns records the IDs as the container's (``podDevices.insert`` in
``allocateContainerResources``); a failed Allocate fails the pod's admission and records
nothing. Before each container start it calls ``PreStartContainer`` with the container's IDs
of each resource whose plugin asked for it, and does not start the container if that fails.
Its pod-resources ``List`` (``v1.PodResourcesLister``) reports the active pods it admitted
with the devices recorded for them, by namespace and name (v1 carries no pod UID).

Not covered (a real kubelet does): pods come from the tests' calls, not from watching the API
server, and are admitted one at a time in the order called; GetPreferredAllocation is not
asked; init containers and device reuse between containers of a pod; the checkpoint of
allocations across a kubelet restart; ``Get`` and ``GetAllocatableResources`` of
pod-resources (see ``test_podresources.FakeKubeletPodResources``); a container refused at its
start is not retried with backoff (the test calls ``start`` again).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import grpc

from seedance.node_agent.deviceplugin import api_pb2 as dp
from seedance.node_agent.deviceplugin import api_pb2_grpc as dp_grpc
from seedance.node_agent.podresources import api_pb2 as pr
from seedance.node_agent.podresources import api_pb2_grpc as pr_grpc

__all__ = ["Admitted", "DeviceManager"]


@dataclass
class Admitted:
    """A pod the test kubelet admitted: the device IDs recorded per (container, resource)."""

    namespace: str
    name: str
    devices: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: The env the plugins' Allocate answered, per (container, resource).
    envs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)


class DeviceManager(pr_grpc.PodResourcesListerServicer):
    """The kubelet's device manager for the plugins registered in ``plugin_dir`` and its
    pod-resources ``List`` on ``pod_resources_socket``."""

    def __init__(self, plugin_dir: str, pod_resources_socket: str) -> None:
        self.plugin_dir = plugin_dir
        self.socket = pod_resources_socket
        self.pods: dict[tuple[str, str], Admitted] = {}
        self._server: grpc.aio.Server | None = None

    # the pod-resources API ------------------------------------------------------------------
    async def List(
        self, request: pr.ListPodResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.ListPodResourcesResponse:
        out = pr.ListPodResourcesResponse()
        for pod in self.pods.values():
            containers: dict[str, list[pr.ContainerDevices]] = {}
            for (container, resource), ids in pod.devices.items():
                containers.setdefault(container, []).append(
                    pr.ContainerDevices(resource_name=resource, device_ids=ids)
                )
            out.pod_resources.append(
                pr.PodResources(
                    name=pod.name,
                    namespace=pod.namespace,
                    containers=[
                        pr.ContainerResources(name=c, devices=d) for c, d in containers.items()
                    ],
                )
            )
        return out

    async def serve(self) -> None:
        server = grpc.aio.server()
        pr_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)

    # the device manager ---------------------------------------------------------------------
    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix://{os.path.join(self.plugin_dir, endpoint)}")

    async def _free_ids(self, stub: dp_grpc.DevicePluginStub, resource: str) -> list[str]:
        stream = stub.ListAndWatch(dp.Empty())
        try:
            first = await stream.read()
        finally:
            stream.cancel()
        assert isinstance(first, dp.ListAndWatchResponse)
        held = {
            i
            for pod in self.pods.values()
            for (_c, r), ids in pod.devices.items()
            if r == resource
            for i in ids
        }
        return [d.ID for d in first.devices if d.health == "Healthy" and d.ID not in held]

    async def admit(
        self, namespace: str, name: str, endpoint: str, resource: str, count: int
    ) -> str | None:
        """Admit pod ``namespace/name`` whose container ``main`` asks for ``count`` of
        ``resource`` (served by the plugin at ``endpoint``): None, or why admission failed
        (the plugin's refusal; nothing recorded, the pod is not active)."""
        async with self._channel(endpoint) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            free = await self._free_ids(stub, resource)
            if len(free) < count:
                return f"Insufficient {resource}: requested {count}, available {len(free)}"
            ids = free[:count]
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
            )
            try:
                resp = await stub.Allocate(request, timeout=10.0)
            except grpc.aio.AioRpcError as exc:
                return str(exc.details())
        # Recorded only now, after Allocate returned (podDevices.insert).
        pod = self.pods.setdefault((namespace, name), Admitted(namespace, name))
        pod.devices[("main", resource)] = ids
        pod.envs[("main", resource)] = dict(resp.container_responses[0].envs)
        return None

    def remove(self, namespace: str, name: str) -> None:
        """The pod ended or was deleted: its devices are free, it is no longer listed."""
        self.pods.pop((namespace, name), None)

    async def start(self, namespace: str, name: str, endpoint: str, resource: str) -> str | None:
        """Start the pod's container ``main``: PreStartContainer with its recorded IDs of
        ``resource`` if the plugin asks for it; None, or why the container was not started."""
        ids = self.pods[(namespace, name)].devices[("main", resource)]
        async with self._channel(endpoint) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(dp.Empty(), timeout=10.0)
            if not options.pre_start_required:
                return None
            try:
                await stub.PreStartContainer(
                    dp.PreStartContainerRequest(devices_ids=ids), timeout=10.0
                )
            except grpc.aio.AioRpcError as exc:
                return str(exc.details())
        return None
