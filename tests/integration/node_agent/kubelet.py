"""A test kubelet's device manager and pod-resources API, over real unix sockets.

What the real kubelet does with device plugins, in the order it does it (``pkg/kubelet/cm/
devicemanager``): at a pod's admission it picks free device IDs of each resource the container
asks for from the plugin's ListAndWatch list, calls the plugin's ``Allocate`` (which names no
pod), and only once that returns records the IDs as the container's (``podDevices.insert`` in
``allocateContainerResources``); a failed Allocate fails the pod's admission and records
nothing. Before each container start it calls ``PreStartContainer`` with the container's IDs
of each resource whose plugin asked for it, and does not start the container if that fails.
One Allocate per container that asks for the resource, with that container's own count: init
containers first, in order, then the app containers (``ManagerImpl.Allocate``); a container
takes the pod's reusable IDs first (a done init container's, ``devicesToReuse``), then free
ones; a regular init container's IDs become reusable after it, a sidecar's (``restartPolicy:
Always``) and an app container's do not. Its pod-resources ``List`` (``v1.PodResourcesLister``)
reports the active pods it admitted with the devices recorded for their app containers and
sidecars (not regular init containers), by namespace and name (v1 carries no pod UID).

``NodeKubelet`` adds the kubelet's side of registration and of the node, over the same real
sockets and the API server's real HTTP: the ``Registration`` service on ``kubelet.sock``; at a
plugin's ``Register`` it dials the plugin's endpoint, reads ``GetDevicePluginOptions`` and keeps
a ``ListAndWatch`` stream, holding the plugin's devices under its resource (one plugin per
resource: a later ``Register`` for it replaces the earlier plugin); when that stream ends (the
plugin went away) every device of the resource is unhealthy (``PluginDisconnected``), still
listed. pod-resources ``GetAllocatableResources`` lists every device held, whatever its
health; the Node's ``status.capacity`` / ``status.allocatable`` in the API server are kept
to all devices / the healthy ones per resource (a PATCH of ``nodes/<node>/status``, as the
kubelet's status update). ``register_node`` creates the Node as a kubelet registers it (Ready,
its CPU and memory). ``run`` admits a pod bound to the node as the kubelet does (each
container's extended-resource limits, the plugin serving each), starts its containers
(PreStartContainer, init containers first) and writes the pod's status Running; a refused
Allocate fails the pod (``UnexpectedAdmissionError``, as the kubelet's admission does);
``finish`` writes it Succeeded. ``start_syncing`` runs every pod bound to the node as it
appears (a watch, as the kubelet's pod source), so pods bound by the bridge run without a
test's call.

Not covered (a real kubelet does): pods come from the tests' calls, not from watching the API
server, and are admitted one at a time in the order called; GetPreferredAllocation is not
asked; init containers do not run before the app containers start (all start at once; an
init container's devices stay recorded while the pod is active, as the kubelet's do; the node
agent refuses GPUs in a regular init container, so with it only sidecars and app containers
get any); a pod whose admission fails part-way has its devices freed at once (the kubelet frees
them at its next admission, ``UpdateAllocatedDevices``: either way before the next Allocate)
and is not written Failed (the kubelet writes it; the API server shows it Pending a while
either way); ``List`` names only pods with recorded devices (the kubelet names every pod it
holds, a container without devices with none); the checkpoint of allocations across a kubelet
restart; ``Get`` of pod-resources (see
``test_podresources.FakeKubeletPodResources``); a container refused at its start is not retried
with backoff (the test calls ``start`` again); the grace period after which a gone plugin's
devices leave the capacity (5 min); the node-status update's own period (written at once);
containers do not run (``run`` only writes their status), cgroups and ``/proc`` stay the test's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from kubernetes_asyncio import client, watch

from seedance.node_agent.deviceplugin import api_pb2 as dp
from seedance.node_agent.deviceplugin import api_pb2_grpc as dp_grpc
from seedance.node_agent.podresources import api_pb2 as pr
from seedance.node_agent.podresources import api_pb2_grpc as pr_grpc

__all__ = ["Admitted", "DeviceManager", "NodeKubelet"]


@dataclass
class Admitted:
    """A pod the test kubelet admitted: the device IDs recorded per (container, resource)."""

    namespace: str
    name: str
    devices: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    #: The env the plugins' Allocate answered, per (container, resource).
    envs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    #: Its regular init containers (their devices are held, but List does not report them).
    init_containers: set[str] = field(default_factory=set)


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
                if container in pod.init_containers:
                    continue
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
        self,
        namespace: str,
        name: str,
        endpoint: str,
        resource: str,
        count: int,
        *,
        container: str = "main",
        reusable: Sequence[str] = (),
    ) -> str | None:
        """Allocate for container ``container`` of pod ``namespace/name``, which asks for
        ``count`` of ``resource`` (served by the plugin at ``endpoint``), taking the pod's
        ``reusable`` IDs first: None, or why admission failed (the plugin's refusal; nothing
        recorded for the container)."""
        async with self._channel(endpoint) as channel:
            stub = dp_grpc.DevicePluginStub(channel)
            ids = list(reusable[:count])
            free = await self._free_ids(stub, resource)
            if len(free) < count - len(ids):
                return f"Insufficient {resource}: requested {count}, available {len(free)}"
            ids += free[: count - len(ids)]
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=ids)]
            )
            try:
                resp = await stub.Allocate(request, timeout=10.0)
            except grpc.aio.AioRpcError as exc:
                return str(exc.details())
        # Recorded only now, after Allocate returned (podDevices.insert).
        pod = self.pods.setdefault((namespace, name), Admitted(namespace, name))
        pod.devices[(container, resource)] = ids
        pod.envs[(container, resource)] = dict(resp.container_responses[0].envs)
        return None

    def remove(self, namespace: str, name: str) -> None:
        """The pod ended or was deleted: its devices are free, it is no longer listed."""
        self.pods.pop((namespace, name), None)

    async def start(
        self, namespace: str, name: str, endpoint: str, resource: str, container: str = "main"
    ) -> str | None:
        """Start the pod's container ``container``: PreStartContainer with its recorded IDs of
        ``resource`` if the plugin asks for it; None, or why the container was not started."""
        ids = self.pods[(namespace, name)].devices[(container, resource)]
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


@dataclass
class _Plugin:
    """A registered plugin as the kubelet holds it: its endpoint, and its devices' health."""

    endpoint: str
    devices: dict[str, str] = field(default_factory=dict)  # ID -> Healthy / Unhealthy
    stream: asyncio.Task[None] | None = None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeKubelet(DeviceManager, dp_grpc.RegistrationServicer):
    """The test kubelet of node ``node``: registration, the device manager, pod-resources, and
    the Node's and its pods' statuses in the API server (``api_client``, real HTTP)."""

    def __init__(
        self, node: str, plugin_dir: str, pod_resources_socket: str, api_client: client.ApiClient
    ) -> None:
        super().__init__(plugin_dir, pod_resources_socket)
        self.node = node
        self.core = client.CoreV1Api(api_client)
        self.plugins: dict[str, _Plugin] = {}
        #: Every accepted Register, in order: (resource, endpoint).
        self.registrations: list[tuple[str, str]] = []
        self._registration: grpc.aio.Server | None = None
        self._changed = asyncio.Event()
        # One node-status write at a time, each computed when its turn comes: the plugins'
        # streams sync concurrently, and two PATCHes in flight could land in the other order,
        # leaving an older count on the Node for good.
        self._node_status = asyncio.Lock()
        self._sync: asyncio.Task[None] | None = None
        #: Each pod run by ``start_syncing``: None (started, or being admitted) or why not.
        self.outcomes: dict[tuple[str, str], str | None] = {}

    # registration ------------------------------------------------------------------------
    async def Register(
        self, request: dp.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> dp.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        old = self.plugins.get(request.resource_name)
        if old is not None and old.stream is not None:
            old.stream.cancel()  # one plugin per resource: the new one replaces it
        plugin = _Plugin(request.endpoint)
        self.plugins[request.resource_name] = plugin
        self.registrations.append((request.resource_name, request.endpoint))
        plugin.stream = asyncio.create_task(self._list_and_watch(request.resource_name, plugin))
        return dp.Empty()

    async def _list_and_watch(self, resource: str, plugin: _Plugin) -> None:
        try:
            async with self._channel(plugin.endpoint) as channel:
                stub = dp_grpc.DevicePluginStub(channel)
                await stub.GetDevicePluginOptions(dp.Empty(), timeout=10.0)
                async for resp in stub.ListAndWatch(dp.Empty()):
                    plugin.devices = {d.ID: d.health for d in resp.devices}
                    await self._sync_node()
        except grpc.aio.AioRpcError:
            pass  # the plugin went away
        except asyncio.CancelledError:
            return  # replaced by a newer plugin of the resource: its devices are the new one's
        # PluginDisconnected: the devices stay listed, unhealthy.
        plugin.devices = dict.fromkeys(plugin.devices, "Unhealthy")
        await self._sync_node()

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest, context: grpc.aio.ServicerContext
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(
            devices=[
                pr.ContainerDevices(resource_name=resource, device_ids=sorted(p.devices))
                for resource, p in sorted(self.plugins.items())
                if p.devices
            ]
        )

    async def _sync_node(self) -> None:
        """The Node's capacity (every device) and allocatable (the healthy ones) per resource."""
        async with self._node_status:
            capacity = {r: str(len(p.devices)) for r, p in self.plugins.items()}
            healthy = {
                r: str(sum(h == "Healthy" for h in p.devices.values()))
                for r, p in self.plugins.items()
            }
            await self.core.patch_node_status(
                self.node,
                {"status": {"capacity": capacity, "allocatable": healthy}},
                _content_type="application/merge-patch+json",
            )
        self._changed.set()

    async def register_node(self, cpu: str = "8", memory: str = "32Gi") -> None:
        """Create the Node, then write its status: Ready, with its CPU, memory and pods."""
        await self.core.create_node(
            {"metadata": {"name": self.node, "labels": {"kubernetes.io/hostname": self.node}}}
        )
        resources = {"cpu": cpu, "memory": memory, "pods": "110"}
        await self.core.patch_node_status(
            self.node,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                }
            },
            _content_type="application/merge-patch+json",
        )

    def start_syncing(self) -> None:
        """Run each pod bound to the node as it appears (``outcomes`` says how each went)."""
        self._sync = asyncio.create_task(self._sync_pods())

    async def _sync_pods(self) -> None:
        # Level-triggered like the kubelet's pod source: list, act, watch from the list's
        # version, list again when the watch ends; BOOKMARK/ERROR events carry no pod.
        while True:
            pods = await self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}"
            )
            for pod in pods.items:
                await self._sync_pod(pod)
            w = watch.Watch()
            async with w.stream(
                self.core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={self.node}",
                resource_version=pods.metadata.resource_version,
                timeout_seconds=60,
            ) as events:
                async for event in events:
                    if event["type"] in ("ADDED", "MODIFIED"):
                        await self._sync_pod(event["object"])
                    elif event["type"] == "DELETED":
                        meta = event["object"].metadata
                        self.remove(meta.namespace, meta.name)

    async def _sync_pod(self, pod: Any) -> None:
        key = (pod.metadata.namespace, pod.metadata.name)
        if key in self.outcomes or (pod.status and pod.status.phase) != "Pending":
            return
        self.outcomes[key] = None  # being admitted: once, as the kubelet admits a pod once
        refused = await self.run(*key)
        self.outcomes[key] = refused
        if refused is not None and key not in self.pods:  # admission failed: the pod fails
            await self.core.patch_namespaced_pod_status(
                key[1],
                key[0],
                {
                    "status": {
                        "phase": "Failed",
                        "reason": "UnexpectedAdmissionError",
                        "message": f"Allocate failed due to {refused}, which is unexpected",
                    }
                },
                _content_type="application/merge-patch+json",
            )

    def allocatable(self, resource: str) -> int:
        p = self.plugins.get(resource)
        return 0 if p is None else sum(h == "Healthy" for h in p.devices.values())

    async def serve(self) -> None:
        await super().serve()
        server = grpc.aio.server()
        dp_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{os.path.join(self.plugin_dir, 'kubelet.sock')}")
        await server.start()
        self._registration = server

    async def stop(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sync
        for p in self.plugins.values():
            if p.stream is not None:
                p.stream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await p.stream
        if self._registration is not None:
            server, self._registration = self._registration, None
            await server.stop(grace=None)
        await super().stop()

    # pods ----------------------------------------------------------------------------------
    async def run(self, namespace: str, name: str) -> str | None:
        """Admit the pod (bound to this node: one Allocate per container and extended resource
        it asks for, init containers first, reusing a done init container's IDs), start its
        containers (PreStartContainer) and write it Running; None, or why it did not start
        (nothing written then; a failed admission records nothing for the pod)."""
        pod = await self.core.read_namespaced_pod(name, namespace)
        assert pod.spec.node_name == self.node, f"{namespace}/{name} is not bound to {self.node}"
        order = [(c, "init") for c in pod.spec.init_containers or []]
        order += [(c, "app") for c in pod.spec.containers]
        reusable: dict[str, list[str]] = {}
        asked: list[tuple[str, str]] = []
        for c, role in order:
            if role == "init" and c.restart_policy == "Always":
                role = "sidecar"
            limits = (c.resources.limits if c.resources else None) or {}
            wants = {r: int(q) for r, q in limits.items() if "/" in r}
            for resource, count in sorted(wants.items()):
                plugin = self.plugins.get(resource)
                refused = (
                    f"no device plugin serves {resource} on {self.node}"
                    if plugin is None
                    else await self.admit(
                        namespace,
                        name,
                        plugin.endpoint,
                        resource,
                        count,
                        container=c.name,
                        reusable=reusable.get(resource, []),
                    )
                )
                if refused is not None:
                    self.remove(namespace, name)  # the pod fails: its devices are free again
                    return refused
                admitted = self.pods[(namespace, name)]
                ids = admitted.devices[(c.name, resource)]
                kept = reusable.get(resource, [])
                if role == "init":
                    admitted.init_containers.add(c.name)
                    reusable[resource] = kept + [i for i in ids if i not in kept]
                else:
                    reusable[resource] = [i for i in kept if i not in ids]
                asked.append((c.name, resource))
        for container, resource in asked:
            endpoint = self.plugins[resource].endpoint
            refused = await self.start(namespace, name, endpoint, resource, container)
            if refused is not None:
                return refused
        await self._status(
            namespace,
            name,
            "Running",
            {"running": {"startedAt": _now()}},
            [c.name for c in pod.spec.containers],
        )
        return None

    async def finish(self, namespace: str, name: str) -> None:
        """The pod's container exited 0: Succeeded, its devices free."""
        pod = await self.core.read_namespaced_pod(name, namespace)
        state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": _now()}}
        await self._status(
            namespace, name, "Succeeded", state, [c.name for c in pod.spec.containers]
        )
        self.remove(namespace, name)

    async def _status(
        self, namespace: str, name: str, phase: str, state: dict[str, Any], containers: list[str]
    ) -> None:
        running = "running" in state
        await self.core.patch_namespaced_pod_status(
            name,
            namespace,
            {
                "status": {
                    "phase": phase,
                    "containerStatuses": [
                        {
                            "name": container,
                            "ready": running,
                            "restartCount": 0,
                            "image": "registry.example/job:1",
                            "imageID": "",
                            "state": state,
                        }
                        for container in containers
                    ],
                }
            },
            _content_type="application/merge-patch+json",
        )
