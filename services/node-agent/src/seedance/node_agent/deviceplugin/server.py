"""The kubelet device-plugin gRPC server (API v1beta1) on a unix socket, with grpc.aio.

This module owns the plugin's side of the kubelet conversation: serving `DevicePlugin` on its
socket, registering with the kubelet's `Registration` service, streaming the device list on
every change, and answering Allocate / GetPreferredAllocation / PreStartContainer from the pure
rules in `devices`, or, given an `allocate` callback, from the node agent's
placement-honouring allocator (the kubelet's device IDs are then only a count), and, given a
`pre_start` callback, letting a container start only once that allocator confirms whose it
is. It must not discover GPUs or decide placement: the node agent gives it the inventory
(`set_devices`, `set_health`).

One plugin serves one extended resource (the kubelet's rule): run one per resource name, e.g.
`nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`, `seedance.io/gpu-shared`, each on its own socket in
the kubelet's device-plugin directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

import grpc
import structlog

from seedance.node_agent.deviceplugin import api_pb2, api_pb2_grpc
from seedance.node_agent.deviceplugin.devices import (
    AllocationError,
    ContainerAllocation,
    PluginDevice,
    container_allocation,
    preferred_allocation,
)

__all__ = ["API_VERSION", "DevicePluginServer", "register_with_kubelet"]

API_VERSION = "v1beta1"
KUBELET_SOCKET = "/var/lib/kubelet/device-plugins/kubelet.sock"

_log = structlog.get_logger(__name__)


async def register_with_kubelet(
    kubelet_socket: str,
    *,
    endpoint: str,
    resource_name: str,
    options: api_pb2.DevicePluginOptions,
    timeout_s: float = 5.0,
) -> None:
    """Call the kubelet's Registration.Register; raises grpc.aio.AioRpcError if refused.

    `endpoint` is the plugin socket's file name relative to the kubelet's directory (the
    kubelet joins it with the directory of its own socket).
    """
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(
            api_pb2.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource_name,
                options=options,
            ),
            timeout=timeout_s,
            wait_for_ready=True,
        )


class DevicePluginServer(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource's devices on `socket_path` and registers them with the kubelet.

    Use with `async with`, or `start()` / `register()` / `stop()` (stop is idempotent).
    """

    def __init__(
        self,
        *,
        resource_name: str,
        socket_path: str,
        devices: Iterable[PluginDevice] = (),
        mps_pipe_directory: str | None = None,
        pre_start_required: bool = True,
        allocate: Callable[[str, Sequence[str]], Awaitable[ContainerAllocation]] | None = None,
        pre_start: Callable[[str, Sequence[str]], Awaitable[None]] | None = None,
    ) -> None:
        self._resource_name = resource_name
        self._socket_path = socket_path
        self._devices: dict[str, PluginDevice] = {d.id: d for d in devices}
        self._mps_pipe_directory = mps_pipe_directory
        self._allocate = allocate
        self._pre_start = pre_start
        self._options = api_pb2.DevicePluginOptions(
            pre_start_required=pre_start_required,
            get_preferred_allocation_available=True,
        )
        self._changed = asyncio.Condition()
        self._version = 0
        self._stopping = False
        self._server: grpc.aio.Server | None = None
        self.pre_started: list[tuple[str, ...]] = []

    @property
    def resource_name(self) -> str:
        return self._resource_name

    @property
    def socket_path(self) -> str:
        return self._socket_path

    @property
    def options(self) -> api_pb2.DevicePluginOptions:
        return self._options

    async def start(self) -> None:
        if self._server is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._socket_path)  # a stale socket from a previous run
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self._socket_path}")
        await server.start()
        self._server = server
        self._stopping = False
        _log.info("device_plugin_started", resource=self._resource_name, socket=self._socket_path)

    async def register(
        self, kubelet_socket: str = KUBELET_SOCKET, *, timeout_s: float = 5.0
    ) -> None:
        """Register with the kubelet; the plugin socket must sit in the kubelet's directory."""
        await register_with_kubelet(
            kubelet_socket,
            endpoint=os.path.basename(self._socket_path),
            resource_name=self._resource_name,
            options=self._options,
            timeout_s=timeout_s,
        )
        _log.info("device_plugin_registered", resource=self._resource_name)

    async def restart(self) -> None:
        """Serve again on a fresh socket at the same path (the kubelet deleted the old one, or
        restarted and holds no connection to it). The devices, their health and the allocate
        callback (with whatever it granted) are this object's and stay; the old ListAndWatch
        streams end, as the kubelet that read them is gone."""
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        if self._server is None:
            return
        self._stopping = True
        async with self._changed:
            self._changed.notify_all()  # end the ListAndWatch streams
        server, self._server = self._server, None
        await server.stop(grace=1.0)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._socket_path)
        _log.info("device_plugin_stopped", resource=self._resource_name)

    async def __aenter__(self) -> DevicePluginServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # The inventory, fed by the node agent.

    async def set_devices(self, devices: Iterable[PluginDevice]) -> None:
        async with self._changed:
            self._devices = {d.id: d for d in devices}
            self._version += 1
            self._changed.notify_all()

    async def set_health(self, device_id: str, healthy: bool) -> None:
        async with self._changed:
            dev = self._devices[device_id]
            if dev.healthy == healthy:
                return
            self._devices[device_id] = dataclasses.replace(dev, healthy=healthy)
            self._version += 1
            self._changed.notify_all()

    # The DevicePlugin service (method names are the protocol's).

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return self._options

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while not self._stopping:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._moved_past, sent))
                if self._stopping:
                    return
                sent = self._version
                response = self._list()
            yield response

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        out = api_pb2.PreferredAllocationResponse()
        for creq in request.container_requests:
            available = [self._devices[i] for i in creq.available_deviceIDs if i in self._devices]
            ids = preferred_allocation(available, creq.must_include_deviceIDs, creq.allocation_size)
            out.container_responses.add(deviceIDs=ids)
        return out

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        out = api_pb2.AllocateResponse()
        for creq in request.container_requests:
            unknown = [i for i in creq.devices_ids if i not in self._devices]
            if unknown:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            try:
                alloc = await self._allocation(list(creq.devices_ids))
            except AllocationError as exc:
                # The kubelet fails the container with this message: the reason reaches the pod.
                code = (
                    grpc.StatusCode.FAILED_PRECONDITION
                    if self._allocate is not None
                    else grpc.StatusCode.INVALID_ARGUMENT
                )
                await context.abort(code, str(exc))
            resp = out.container_responses.add()
            resp.envs.update(alloc.envs)
            for container_path, host_path, read_only in alloc.mounts:
                resp.mounts.add(
                    container_path=container_path, host_path=host_path, read_only=read_only
                )
        return out

    async def _allocation(self, ids: list[str]) -> ContainerAllocation:
        if self._allocate is not None:
            return await self._allocate(self._resource_name, ids)
        return container_allocation(
            [self._devices[i] for i in ids], mps_pipe_directory=self._mps_pipe_directory
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        # Nothing to reset for GPUs and MIG instances; refuse a device gone unhealthy since
        # Allocate, so the container does not start on it.
        bad = [i for i in request.devices_ids if not self._devices.get(i, _MISSING).healthy]
        if bad:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"devices {bad} unhealthy")
        if self._pre_start is not None:
            # The node agent's check that the pod the kubelet gave these devices to is the one
            # they were granted for (Allocate names no pod); its refusal reaches the pod.
            try:
                await self._pre_start(self._resource_name, list(request.devices_ids))
            except AllocationError as exc:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        self.pre_started.append(tuple(request.devices_ids))
        return api_pb2.PreStartContainerResponse()

    def _moved_past(self, sent: int) -> bool:
        """ListAndWatch's wake-up: the device list changed since ``sent``, or the plugin stops."""
        return self._version != sent or self._stopping

    def _list(self) -> api_pb2.ListAndWatchResponse:
        resp = api_pb2.ListAndWatchResponse()
        for dev in self._devices.values():
            d = resp.devices.add(ID=dev.id, health=dev.health)
            if dev.numa_node is not None:
                d.topology.nodes.add(ID=dev.numa_node)
        return resp


class _Missing:
    healthy = False


_MISSING = _Missing()
