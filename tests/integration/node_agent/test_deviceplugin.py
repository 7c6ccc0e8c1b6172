"""The device plugin holds the kubelet's side of the v1beta1 conversation over real unix sockets.

A fake kubelet serves `Registration` on kubelet.sock in a temporary device-plugin directory;
the plugin registers there, and the test then dials the plugin's socket (the endpoint it
registered, joined to that directory, as the kubelet does) and speaks `DevicePlugin` to it.
The fake kubelet also restarts as the real one does (every socket in the directory deleted,
kubelet.sock re-created): `KubeletWatch` must get the plugin served and registered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence

import grpc
import pytest

from seedance.node_agent.deviceplugin import (
    ENV_MPS_MEM_LIMIT,
    ENV_MPS_PIPE_DIRECTORY,
    ENV_MPS_THREAD_PCT,
    ENV_VISIBLE_DEVICES,
    AllocationError,
    ContainerAllocation,
    DeviceKind,
    DevicePluginServer,
    KubeletWatch,
    PluginDevice,
    Registration,
    api_pb2,
    api_pb2_grpc,
    container_allocation,
    socket_identity,
    thread_pct_for_priority,
)
from seedance.testing.waits import eventually

DEADLINE_S = 10.0


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """The kubelet's `Registration` on `kubelet.sock` in `plugin_dir`, over a real socket.

    `go_away()` is a kubelet that stopped and, starting again, deleted every socket in its
    directory (the plugins' included, as the real kubelet does at start); `come_back()` serves
    on a new `kubelet.sock` at the same path.
    """

    def __init__(self, plugin_dir: str) -> None:
        self.plugin_dir = plugin_dir
        self.socket = os.path.join(plugin_dir, "kubelet.sock")
        self.registered: asyncio.Queue[api_pb2.RegisterRequest] = asyncio.Queue()
        #: Every Register as it came: resource, endpoint, the endpoint socket's identity as the
        #: kubelet finds it when about to dial it, and whether it was accepted.
        self.attempts: list[tuple[str, str, object, bool]] = []
        #: Refuse this many Registers (UNAVAILABLE), as a kubelet still starting might.
        self.refuse = 0
        #: Called with each accepted request before Register answers.
        self.on_register: Callable[[api_pb2.RegisterRequest], Awaitable[None]] | None = None
        self._server: grpc.aio.Server | None = None

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        endpoint = socket_identity(os.path.join(self.plugin_dir, request.endpoint))
        accepted = self.refuse == 0
        self.attempts.append((request.resource_name, request.endpoint, endpoint, accepted))
        if not accepted:
            self.refuse -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet starting")
        if self.on_register is not None:
            await self.on_register(request)
        await self.registered.put(request)
        return api_pb2.Empty()

    @property
    def resources(self) -> list[str]:
        return [resource for resource, _, _, accepted in self.attempts if accepted]

    async def come_back(self) -> None:
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def go_away(self) -> None:
        await self.stop()
        for sock in glob.glob(os.path.join(self.plugin_dir, "*.sock")):
            os.unlink(sock)

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # Short path: a unix socket path must fit in 108 bytes, which pytest's tmp_path may not.
    path = tempfile.mkdtemp(prefix="dp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[tuple[FakeKubelet, str]]:
    fake = FakeKubelet(plugin_dir)
    await fake.come_back()
    yield fake, fake.socket
    await fake.stop()


def gpu(i: int, **kw: object) -> PluginDevice:
    uuid = f"GPU-0000000{i}-aaaa-bbbb-cccc-00000000000{i}"
    kw.setdefault("id", uuid)
    return PluginDevice(kind=DeviceKind.WHOLE_GPU, uuid=uuid, gpu_uuid=uuid, **kw)  # type: ignore[arg-type]


async def registered_plugin(
    kubelet: tuple[FakeKubelet, str], plugin_dir: str, server: DevicePluginServer
) -> tuple[api_pb2.RegisterRequest, grpc.aio.Channel]:
    fake, sock = kubelet
    await server.start()
    await server.register(sock)
    reg = await asyncio.wait_for(fake.registered.get(), DEADLINE_S)
    channel = grpc.aio.insecure_channel(f"unix://{os.path.join(plugin_dir, reg.endpoint)}")
    return reg, channel


async def test_whole_gpus_register_list_watch_prefer_allocate_prestart(
    kubelet: tuple[FakeKubelet, str], plugin_dir: str
) -> None:
    devices = [
        gpu(0, numa_node=0, nvlink_domain="a"),
        gpu(1, numa_node=0, nvlink_domain="b"),
        gpu(2, numa_node=1, nvlink_domain="a"),
        gpu(3, numa_node=1, nvlink_domain="b"),
    ]
    server = DevicePluginServer(
        resource_name="nvidia.com/gpu",
        socket_path=os.path.join(plugin_dir, "seedance-gpu.sock"),
        devices=devices,
    )
    try:
        reg, channel = await registered_plugin(kubelet, plugin_dir, server)
        assert reg.resource_name == "nvidia.com/gpu"
        assert reg.endpoint == "seedance-gpu.sock"
        assert reg.options.pre_start_required
        assert reg.options.get_preferred_allocation_available
        async with channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            opts = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=DEADLINE_S)
            assert opts == reg.options

            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), DEADLINE_S)
            assert [(d.ID, d.health) for d in first.devices] == [(d.id, "Healthy") for d in devices]
            assert [n.ID for n in first.devices[2].topology.nodes] == [1]

            await server.set_health(devices[1].id, False)
            update = await asyncio.wait_for(stream.read(), DEADLINE_S)
            health = {d.ID: d.health for d in update.devices}
            assert health[devices[1].id] == "Unhealthy"
            assert list(health.values()).count("Healthy") == 3

            pref = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[d.id for d in devices],
                            must_include_deviceIDs=[devices[3].id],
                            allocation_size=2,
                        )
                    ]
                ),
                timeout=DEADLINE_S,
            )
            # GPU 1 shares GPU 3's NVLink domain but is unhealthy; of the rest, GPU 2 shares
            # its NUMA node.
            assert list(pref.container_responses[0].deviceIDs) == [devices[3].id, devices[2].id]

            alloc = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(
                            devices_ids=[devices[0].id, devices[2].id]
                        ),
                        api_pb2.ContainerAllocateRequest(devices_ids=[devices[3].id]),
                    ]
                ),
                timeout=DEADLINE_S,
            )
            envs = [dict(r.envs) for r in alloc.container_responses]
            assert envs == [
                {ENV_VISIBLE_DEVICES: f"{devices[0].uuid},{devices[2].uuid}"},
                {ENV_VISIBLE_DEVICES: devices[3].uuid},
            ]

            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(devices_ids=[devices[1].id])
                        ]
                    ),
                    timeout=DEADLINE_S,
                )
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "unhealthy" in (bad.value.details() or "")

            await stub.PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=[devices[3].id]), timeout=DEADLINE_S
            )
            assert server.pre_started == [(devices[3].id,)]

            # Stopping the plugin ends the watch stream cleanly.
            await server.stop()
            tail = await asyncio.wait_for(stream.read(), DEADLINE_S)
            assert tail is grpc.aio.EOF
    finally:
        await server.stop()
    assert not os.path.exists(server.socket_path)  # noqa: ASYNC240 - a stat, after the I/O


async def test_mig_instances_and_shared_replicas_get_their_env(
    kubelet: tuple[FakeKubelet, str], plugin_dir: str
) -> None:
    parent = "GPU-11111111-2222-3333-4444-555555555555"
    mig = [
        PluginDevice(
            id=f"MIG-3g.40gb-{i}",
            kind=DeviceKind.MIG,
            uuid=f"MIG-aaaaaaaa-bbbb-cccc-dddd-00000000000{i}",
            gpu_uuid=parent,
        )
        for i in range(2)
    ]
    mig_server = DevicePluginServer(
        resource_name="nvidia.com/mig-3g.40gb",
        socket_path=os.path.join(plugin_dir, "mig.sock"),
        devices=mig,
        pre_start_required=False,
    )
    shared = [
        PluginDevice(
            id=f"{g}-r{r}",
            kind=DeviceKind.SHARED,
            uuid=f"GPU-{g}",
            gpu_uuid=f"GPU-{g}",
            active_thread_pct=25,
            mem_limit_mib=20480,
        )
        for g in ("g0", "g1")
        for r in range(4)
    ]
    shared_server = DevicePluginServer(
        resource_name="seedance.io/gpu-shared",
        socket_path=os.path.join(plugin_dir, "shared.sock"),
        devices=shared,
        mps_pipe_directory="/run/nvidia/mps",
    )
    try:
        reg, channel = await registered_plugin(kubelet, plugin_dir, mig_server)
        assert not reg.options.pre_start_required
        async with channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            alloc = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[mig[1].id])]
                ),
                timeout=DEADLINE_S,
            )
            assert dict(alloc.container_responses[0].envs) == {ENV_VISIBLE_DEVICES: mig[1].uuid}

        reg, channel = await registered_plugin(kubelet, plugin_dir, shared_server)
        assert reg.resource_name == "seedance.io/gpu-shared"
        async with channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            # Two replicas: the preferred pair stays on one GPU.
            pref = await stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=["g0-r0", "g1-r0", "g1-r1", "g0-r3"],
                            must_include_deviceIDs=["g1-r1"],
                            allocation_size=2,
                        )
                    ]
                ),
                timeout=DEADLINE_S,
            )
            assert list(pref.container_responses[0].deviceIDs) == ["g1-r1", "g1-r0"]

            alloc = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=["g1-r1", "g1-r0"])
                    ]
                ),
                timeout=DEADLINE_S,
            )
            resp = alloc.container_responses[0]
            assert dict(resp.envs) == {
                ENV_VISIBLE_DEVICES: "GPU-g1",
                ENV_MPS_THREAD_PCT: "50",
                ENV_MPS_MEM_LIMIT: "0=40960M",
                ENV_MPS_PIPE_DIRECTORY: "/run/nvidia/mps",
            }
            assert [(m.container_path, m.host_path) for m in resp.mounts] == [
                ("/run/nvidia/mps", "/run/nvidia/mps")
            ]
            with pytest.raises(grpc.aio.AioRpcError) as span:
                await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(devices_ids=["g0-r0", "g1-r0"])
                        ]
                    ),
                    timeout=DEADLINE_S,
                )
            assert "span GPUs" in (span.value.details() or "")
    finally:
        await mig_server.stop()
        await shared_server.stop()


def test_priority_becomes_an_mps_thread_percentage_and_bad_devices_are_refused() -> None:
    assert [thread_pct_for_priority(p) for p in (0, 1, 50, 100)] == [1, 1, 50, 100]
    with pytest.raises(ValueError, match=r"0\.\.100"):
        thread_pct_for_priority(101)
    with pytest.raises(ValueError, match=r"active_thread_pct 0 not 1\.\.100"):
        PluginDevice(id="s", kind=DeviceKind.SHARED, uuid="GPU-x", gpu_uuid="GPU-x",
                     active_thread_pct=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"1\.\.63 characters"):
        gpu(0, id="x" * 64)
    replicas = [
        PluginDevice(id=f"r{i}", kind=DeviceKind.SHARED, uuid="GPU-x", gpu_uuid="GPU-x",
                     active_thread_pct=60)
        for i in range(2)
    ]  # fmt: skip
    # Percentages add up but are capped; no memory limit is set unless every replica has one.
    assert container_allocation(replicas).envs == {
        ENV_VISIBLE_DEVICES: "GPU-x",
        ENV_MPS_THREAD_PCT: "100",
    }
    with pytest.raises(AllocationError, match="cannot be mixed"):
        container_allocation([replicas[0], gpu(1)])
    with pytest.raises(AllocationError, match="no devices"):
        container_allocation([])


class OneGrantEach:
    """An allocate callback with state, as the node agent's is: a device is granted once."""

    def __init__(self) -> None:
        self.granted: set[str] = set()

    async def __call__(self, resource: str, ids: Sequence[str]) -> ContainerAllocation:
        taken = sorted(self.granted.intersection(ids))
        if taken:
            raise AllocationError(f"{taken} already granted")
        self.granted.update(ids)
        return ContainerAllocation({ENV_VISIBLE_DEVICES: ",".join(ids)})


async def allocate(stub: api_pb2_grpc.DevicePluginStub, *ids: str) -> dict[str, str]:
    resp = await stub.Allocate(
        api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=list(ids))]
        ),
        timeout=DEADLINE_S,
    )
    return dict(resp.container_responses[0].envs)


@contextlib.asynccontextmanager
async def watching(watch: KubeletWatch) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(watch.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def dial(plugin_dir: str, endpoint: str) -> grpc.aio.Channel:
    """As the kubelet dials a plugin: its endpoint joined to the kubelet's directory."""
    return grpc.aio.insecure_channel(f"unix://{os.path.join(plugin_dir, endpoint)}")


async def test_a_restarted_kubelet_gets_the_plugin_served_and_registered_again(
    kubelet: tuple[FakeKubelet, str], plugin_dir: str
) -> None:
    fake, sock = kubelet
    devices = [gpu(0), gpu(1)]
    grants = OneGrantEach()
    server = DevicePluginServer(
        resource_name="nvidia.com/gpu",
        socket_path=os.path.join(plugin_dir, "seedance-gpu.sock"),
        devices=devices,
        allocate=grants,
    )
    why: list[tuple[str, Registration]] = []
    watch = KubeletWatch(
        [server], sock, poll_interval_s=0.02, on_registered=lambda r, w: why.append((r, w))
    )
    await server.start()
    try:
        async with watching(watch) as task:
            first = await asyncio.wait_for(fake.registered.get(), DEADLINE_S)
            assert (first.resource_name, first.endpoint) == ("nvidia.com/gpu", "seedance-gpu.sock")
            served = socket_identity(server.socket_path)
            async with dial(plugin_dir, first.endpoint) as before:
                stub = api_pb2_grpc.DevicePluginStub(before)
                stream = stub.ListAndWatch(api_pb2.Empty())
                listed = await asyncio.wait_for(stream.read(), DEADLINE_S)
                assert [d.ID for d in listed.devices] == [d.id for d in devices]
                assert await allocate(stub, devices[0].id) == {ENV_VISIBLE_DEVICES: devices[0].id}

                # The kubelet goes: its socket and the plugin's are deleted. The watch waits
                # (it does not end, nor register with nothing).
                await fake.go_away()
                await eventually(lambda: not watch.kubelet_present, what="the kubelet seen gone")
                assert not task.done()
                assert not os.path.exists(server.socket_path)  # noqa: ASYNC240

                # It comes back on a new socket at the same path.
                await fake.come_back()
                again = await asyncio.wait_for(fake.registered.get(), DEADLINE_S)
                assert (again.resource_name, again.endpoint) == (
                    first.resource_name,
                    first.endpoint,
                )
                assert again.options == first.options
                # The stream the old kubelet read has ended: the server was restarted.
                assert await asyncio.wait_for(stream.read(), DEADLINE_S) is grpc.aio.EOF
            fresh = socket_identity(server.socket_path)
            assert fresh is not None
            assert fresh != served
            # Registered while its new socket was there to dial.
            assert fake.attempts[-1] == ("nvidia.com/gpu", "seedance-gpu.sock", fresh, True)
            # The kubelet has the request before the plugin has its answer.
            await eventually(lambda: len(why) == 2, what="the second registration answered")
            assert why == [
                ("nvidia.com/gpu", Registration.START),
                ("nvidia.com/gpu", Registration.KUBELET_RESTARTED),
            ]

            async with dial(plugin_dir, again.endpoint) as after:
                stub = api_pb2_grpc.DevicePluginStub(after)
                listed = await asyncio.wait_for(
                    stub.ListAndWatch(api_pb2.Empty()).read(), DEADLINE_S
                )
                assert [(d.ID, d.health) for d in listed.devices] == [
                    (d.id, "Healthy") for d in devices
                ]
                # Allocate answers as before, with what was granted before the restart kept.
                with pytest.raises(grpc.aio.AioRpcError) as taken:
                    await allocate(stub, devices[0].id)
                assert taken.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "already granted" in (taken.value.details() or "")
                assert await allocate(stub, devices[1].id) == {ENV_VISIBLE_DEVICES: devices[1].id}
        assert fake.registered.empty()  # once per kubelet, no more
    finally:
        await server.stop()


async def test_a_deleted_plugin_socket_is_served_again_and_a_refusal_retried(
    kubelet: tuple[FakeKubelet, str], plugin_dir: str
) -> None:
    fake, sock = kubelet
    server = DevicePluginServer(
        resource_name="nvidia.com/gpu",
        socket_path=os.path.join(plugin_dir, "seedance-gpu.sock"),
        devices=[gpu(0)],
    )
    why: list[Registration] = []
    failed: list[str] = []
    watch = KubeletWatch(
        [server],
        sock,
        poll_interval_s=0.02,
        on_registered=lambda _r, w: why.append(w),
        on_failed=failed.append,
    )
    await server.start()
    try:
        await watch.check()  # the first look registers at once, as the node agent's start does
        assert why == [Registration.START]
        await asyncio.wait_for(fake.registered.get(), DEADLINE_S)
        async with watching(watch):
            # The kubelet stays; the plugin's socket alone is deleted, and the kubelet refuses
            # the next two registrations.
            fake.refuse = 2
            os.unlink(server.socket_path)
            again = await asyncio.wait_for(fake.registered.get(), DEADLINE_S)
            await eventually(lambda: len(why) == 2, what="the second registration answered")
        assert again.endpoint == "seedance-gpu.sock"
        assert why == [Registration.START, Registration.SOCKET_REMOVED]
        assert failed == ["nvidia.com/gpu", "nvidia.com/gpu"]
        # Served once on a fresh socket; the retries after a refusal kept it (not re-made).
        retried = [ident for _r, _e, ident, _ok in fake.attempts[1:]]
        assert [ok for *_, ok in fake.attempts] == [True, False, False, True]
        assert retried[0] is not None
        assert retried == [socket_identity(server.socket_path)] * 3
        async with dial(plugin_dir, again.endpoint) as channel:
            listed = await asyncio.wait_for(
                api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty()).read(),
                DEADLINE_S,
            )
            assert [d.ID for d in listed.devices] == [gpu(0).id]
    finally:
        await server.stop()
