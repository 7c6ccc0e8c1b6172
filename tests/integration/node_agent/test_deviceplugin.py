"""The device plugin holds the kubelet's side of the v1beta1 conversation over real unix sockets.

A fake kubelet serves `Registration` on kubelet.sock in a temporary device-plugin directory;
the plugin registers there, and the test then dials the plugin's socket (the endpoint it
registered, joined to that directory, as the kubelet does) and speaks `DevicePlugin` to it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from seedance.node_agent.deviceplugin import (
    ENV_MPS_MEM_LIMIT,
    ENV_MPS_PIPE_DIRECTORY,
    ENV_MPS_THREAD_PCT,
    ENV_VISIBLE_DEVICES,
    AllocationError,
    DeviceKind,
    DevicePluginServer,
    PluginDevice,
    api_pb2,
    api_pb2_grpc,
    container_allocation,
    thread_pct_for_priority,
)

DEADLINE_S = 10.0


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.registered: asyncio.Queue[api_pb2.RegisterRequest] = asyncio.Queue()

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        await self.registered.put(request)
        return api_pb2.Empty()


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    # Short path: a unix socket path must fit in 108 bytes, which pytest's tmp_path may not.
    path = tempfile.mkdtemp(prefix="dp-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[tuple[FakeKubelet, str]]:
    fake = FakeKubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(fake, server)
    sock = os.path.join(plugin_dir, "kubelet.sock")
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    yield fake, sock
    await server.stop(grace=None)


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
