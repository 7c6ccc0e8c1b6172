"""The node agent as a service: it registers its plugins with a kubelet of ours (real unix
sockets) once its placement feed has replayed the stream, and again when that kubelet restarts,
reads the slicer's placements from a real nats-server, answers Allocate through the test API
server, applies a MIG plan sent on its node's subject, and serves health and metrics (pod
shares mapped PID -> cgroup -> pod) over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from kubernetes_asyncio import client

from seedance.core.bus import BusSettings
from seedance.events.base import new_event_id
from seedance.events.codec import decode, encode
from seedance.events.slicing import GpuAssignment, MigInstanceChange, MigLayoutPlan, PlacementKind
from seedance.events.subjects import slicing, telemetry
from seedance.events.telemetry import PodShares
from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.core.shares import ProcessSample
from seedance.node_agent.deviceplugin import api_pb2, api_pb2_grpc
from seedance.node_agent.podresources import api_pb2 as pr_pb2
from seedance.testing.kube_api import KubeApiServer
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.node_agent.agent import agent_settings, merged, node_agent
from tests.integration.node_agent.test_allocation import (
    T0,
    TOKEN,
    UUIDS,
    annotation,
    bound_pod,
    kube_api,
    placement,
    publish,
)
from tests.integration.node_agent.test_deviceplugin import FakeKubelet
from tests.integration.node_agent.test_plan_feed import plan
from tests.integration.node_agent.test_podresources import FakeKubeletPodResources
from tests.integration.node_agent.test_podresources import serving as serving_pod_resources
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

pytestmark = pytest.mark.integration


class NodeNvml:
    """The node's NVML reads, constructed: four GPUs, and one process's samples on GPU 1."""

    def __init__(self) -> None:
        self.samples: list[ProcessSample] = []
        self._next: list[tuple[int, float, float]] = []
        #: GPU 1's processes' memory in use (MiB by pid).
        self.memory: dict[int, float] = {}
        #: A transient peak: answered (once) by the first memory read of a window, the
        #: process's samples then armed for that window, so the peak is never its last read.
        self.spike: tuple[dict[int, float], tuple[int, float, float]] | None = None
        self._first_read = True
        #: Reads of the devices to fail (NVML's error), and the reads so far.
        self.failing_reads = 0
        self.reads = 0

    def devices(self) -> NodeDevices:
        self.reads += 1
        if self.failing_reads:
            self.failing_reads -= 1
            raise RuntimeError("NVML: Unknown Error")
        return NodeDevices(gpus=UUIDS)

    def run(self, *slots: tuple[int, float, float]) -> None:
        """GPU 1's driver samples ``slots`` (pid, SM %, memory %) during the period the agent
        reads next: they are stamped at that read, one µs apart just after the period's start,
        as a driver stamps what it sampled since. Stamping them from the test's own clock
        instead raced the agent's periods: a period boundary between two stamps split them."""
        self._next = list(slots)

    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]:
        self._first_read = self._first_read or gpu_index == 1  # the window's reads are done
        if gpu_index == 1 and self._next:
            self.samples += [
                ProcessSample(pid, sm, mem, since_us + 1 + i)
                for i, (pid, sm, mem) in enumerate(self._next)
            ]
            self._next = []
        # As NVML: the samples newer than since_us (they stay in its buffer after a read).
        return [s for s in self.samples if s.timestamp_us > since_us] if gpu_index == 1 else []

    def process_memory_mib(self, gpu_index: int) -> dict[int, float | None]:
        # Read several times a window (MEMORY_SAMPLE_S), before the window's samples are.
        if gpu_index != 1:
            return {}
        first, self._first_read = self._first_read, False
        if first and self.spike is not None:
            (used, slot), self.spike = self.spike, None
            self.run(slot)
            return dict(used)
        return dict(self.memory)


@pytest.fixture
def plugin_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ns-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: str) -> AsyncIterator[FakeKubelet]:
    fake = FakeKubelet(plugin_dir)
    await fake.come_back()
    yield fake
    await fake.stop()


async def get(url: str) -> tuple[int, str]:
    """Over real HTTP, without blocking the loop the agent's endpoint runs on."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.text()


class Agent:
    """The agent under test and what it talks to."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    api: KubeApiServer
    api_client: client.ApiClient
    bus: Any
    nvml: NodeNvml
    mig: ConstructedNvmlMig
    proc: Path
    plugin_dir: str
    base: str


Prepare = Callable[[KubeApiServer, client.ApiClient], Awaitable[None]]


@contextlib.asynccontextmanager
async def agent_on(
    api: KubeApiServer,
    api_client: client.ApiClient,
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
    pod_resources_socket: str | None = None,
    bus_settings: BusSettings | None = None,
    mig: ConstructedNvmlMig | None = None,
) -> AsyncIterator[Agent]:
    """An agent started against ``api`` and running; stopped and closed after the block. The
    kubelet's pod-resources socket is absent unless ``pod_resources_socket`` names one; the
    agent connects to ``nats_url`` without a user unless ``bus_settings`` say otherwise. Its
    GPUs' MIG state is ``mig`` (a fresh four-GPU one unless given: a restarted agent's GPUs
    keep theirs)."""
    settings = agent_settings(
        plugin_dir,
        tmp_path,
        pod_resources_socket or os.path.join(plugin_dir, "absent.sock"),
        shares_interval_s=0.1,
        memory_sample_s=0.025,  # four memory reads a window
        labels_interval_s=0.5,
    )
    nvml, mig = NodeNvml(), mig or ConstructedNvmlMig(gpus=4)
    service, runtime = node_agent(
        settings,
        bus_settings or BusSettings(url=nats_url),
        kube_client=api_client,
        nvml=nvml,
        mig=mig,
    )
    registered = len(kubelet.resources)
    async with serving(service):
        assert sorted(kubelet.resources[registered:]) == [
            "nvidia.com/gpu",
            "seedance.io/gpu-milli",
        ]
        yield Agent(
            api=api,
            api_client=api_client,
            bus=bus,
            nvml=nvml,
            mig=mig,
            proc=tmp_path / "proc",
            plugin_dir=plugin_dir,
            base=f"http://127.0.0.1:{runtime.http_port}",
        )


@contextlib.asynccontextmanager
async def running_agent(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
    prepare: Prepare | None = None,
) -> AsyncIterator[Agent]:
    """The agent started and running; ``prepare`` runs first, with the API server up."""
    async with kube_api(tmp_path) as (api, api_client):
        if prepare is not None:
            await prepare(api, api_client)
        async with agent_on(api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
            yield a


@pytest.fixture
async def agent(
    nats_url: str, bus: Any, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> AsyncIterator[Agent]:
    async with running_agent(nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
        yield a


@contextlib.asynccontextmanager
async def pod_resources_at(
    sock: str, pods: list[pr_pb2.PodResources] | None = None
) -> AsyncIterator[FakeKubeletPodResources]:
    """The kubelet's pod-resources List at ``sock`` for the block, naming ``pods`` (none)."""
    fake = FakeKubeletPodResources()
    fake.pods = pods or []
    async with serving_pod_resources(fake, sock):
        yield fake


@contextlib.asynccontextmanager
async def short_dir() -> AsyncIterator[str]:
    path = tempfile.mkdtemp(prefix="prs-")  # a unix socket's path must stay short
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def answering_kubelet() -> AsyncIterator[str]:
    """The socket of a kubelet whose pod-resources List answers (no pod holds a device): the
    agent reads MIG plans only once it has (a plan may touch only a GPU no pod holds)."""
    async with short_dir() as path:
        sock = os.path.join(path, "kubelet.sock")
        async with pod_resources_at(sock):
            yield sock


@pytest.fixture
async def plan_agent(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
    answering_kubelet: str,
) -> AsyncIterator[Agent]:
    async with (
        kube_api(tmp_path) as (api, api_client),
        agent_on(
            api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path, answering_kubelet
        ) as a,
    ):
        yield a


async def metric_line(a: Agent, line: str) -> bool:
    return line in (await get(a.base + "/metrics"))[1]


async def allocate_shared(a: Agent) -> tuple[str, dict[str, str]]:
    held: dict[str, Any] = {}

    def shared(uid: str) -> str:
        gpus = [GpuAssignment(index=1, uuid=UUIDS[1], milli=500)]
        held["ev"] = placement(uid, PlacementKind.SHARED, gpus)
        return annotation(uid, held["ev"])

    res = {"seedance.io/gpu-milli": "500"}
    uid = await bound_pod(a.api, a.api_client, "sh", res, shared)
    await publish(a.bus, held["ev"])
    sock = os.path.join(a.plugin_dir, "seedance-seedance-io_gpu-milli.sock")
    ids = [f"{UUIDS[0]}::{k}" for k in range(500)]
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )
    async with grpc.aio.insecure_channel(f"unix://{sock}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)

        async def granted() -> bool:
            try:
                resp = await stub.Allocate(request)
            except grpc.aio.AioRpcError:
                return False  # the placement not read from the bus yet
            held["envs"] = dict(resp.container_responses[0].envs)
            return True

        await eventually(granted, what="allocation granted")
    return uid, held["envs"]


async def test_allocate_through_the_service_and_the_shares_it_measures(agent: Agent) -> None:
    a = agent

    async def ready() -> bool:
        return (await get(a.base + "/readyz"))[0] == 200

    await eventually(ready, what="ready")
    uid, envs = await allocate_shared(a)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert await metric_line(
        a,
        'seedance_node_agent_allocations_total{outcome="granted",resource="seedance.io/gpu-milli"}'
        " 1.0",
    )
    # The pod's shares also go to the bus, one gpu.pod_share.v1 per window on the node's subject.
    got: list[PodShares] = []

    async def on_share(msg: Any) -> None:
        event = decode(msg.data, PodShares)
        if event.shares:
            got.append(event)

    sub = await a.bus.subscribe(telemetry.pod_share(TOKEN), on_share)  # held when it returns
    # The pod's process runs on GPU 1: its host PID's cgroup names the pod.
    (a.proc / "4242").mkdir(parents=True)
    (a.proc / "4242" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{'c' * 64}.scope\n"
    )
    # Another pod's process holds memory but has no utilisation samples of its own (as an MPS
    # client, whose utilisation NVML gives to the MPS server): it must not read as idle.
    (a.proc / "4343").mkdir(parents=True)
    (a.proc / "4343" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{'1' * 8}_{'2' * 4}_{'3' * 4}_{'4' * 4}_{'5' * 12}.slice/"
        f"cri-containerd-{'d' * 64}.scope\n"
    )
    # Two driver slots of it, in the period the agent reads next; it holds 1.5 GiB in two
    # allocations NVML counts per process, and a process outside any pod holds more.
    a.nvml.memory = {4242: 1536.0, 77: 4096.0, 4343: 2048.0}
    a.nvml.run((4242, 40.0, 10.0), (4242, 60.0, 30.0))
    share = (
        f'seedance_node_agent_pod_sm_share_ratio{{UUID="{UUIDS[1]}",container="",'
        'namespace="team-a",pod="sh"} 0.5'
    )
    await eventually(lambda: metric_line(a, share), what="the pod's measured share")
    await eventually(lambda: bool(got), what="the pod's share on the bus")
    await sub.unsubscribe()
    event = got[0]
    assert event.node == TOKEN
    assert event.window_start < event.at
    (measured,) = event.shares  # not the pod of 4343, which NVML did not sample
    assert (measured.gpu_index, measured.gpu_uuid, measured.pod_uid) == (1, UUIDS[1], uid)
    assert (measured.namespace, measured.pod) == ("team-a", "sh")
    # (tenant, job) are the slicer's placement the pod was granted against
    assert (measured.tenant, measured.job_id) == ("acme", uid)
    assert (measured.sm_share, measured.mem_share, measured.periods) == (0.5, 0.2, 2)
    assert measured.mem_used_mib == 1536.0  # its memory in use; pid 77 is no pod's

    # A transient peak at the first of a window's four memory reads only (back to 1.5 GiB by
    # the window's end): the window reports the peak, which a read at its end never saw.
    peaks: list[float | None] = []

    async def on_peak(msg: Any) -> None:
        event = decode(msg.data, PodShares)
        peaks.extend(s.mem_used_mib for s in event.shares if s.pod_uid == uid)

    sub = await a.bus.subscribe(telemetry.pod_share(TOKEN), on_peak)  # held: the peak is one-shot
    try:
        a.nvml.spike = ({4242: 6144.0, 77: 4096.0}, (4242, 50.0, 10.0))
        await eventually(lambda: bool(peaks), what="the window of the peak")
    finally:
        await sub.unsubscribe()
    assert peaks[0] == 6144.0


@pytest.fixture
async def plans_purged(bus: Any) -> AsyncIterator[None]:
    """The node's plans purged after the test: an agent of a later test would read them back."""
    yield
    await bus.js.purge_stream(slicing.PLAN_STREAM, subject=slicing.mig_plan("gpu-1:example"))


@pytest.mark.usefixtures("plans_purged")
async def test_a_mig_plan_on_the_nodes_subject_is_applied_once(plan_agent: Agent) -> None:
    a = plan_agent
    plan = MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node="gpu-1:example",
        gpu_index=2,
        create=[MigInstanceChange(profile="3g.71gb", start_slot=0)],
    )
    await a.bus.publish(slicing.mig_plan("gpu-1:example"), plan)
    await mig_wait(a, lambda: len(a.mig.gpu_instances(2)) == 1, "MIG plan applied")
    # A re-send after the stream's duplicate window (stored again: another Nats-Msg-Id).
    await a.bus.js.publish(
        slicing.mig_plan("gpu-1:example"), encode(plan), headers={"Nats-Msg-Id": "re-send"}
    )
    replayed = 'seedance_node_agent_mig_plans_total{outcome="already_applied"} 1.0'
    await mig_wait(a, lambda: metric_line(a, replayed), "the re-send counted, not re-done")
    assert [c[0] for c in a.mig.calls] == ["create_gi", "create_ci"]


@pytest.mark.usefixtures("plans_purged")
async def test_a_stored_message_that_is_no_plan_is_not_applied(plan_agent: Agent) -> None:
    """The plans' stream stores what a tenant's push consumer delivers onto a plan subject
    while something subscribes there (an operator's ``nats sub``): its idle heartbeats under
    the plan subject with an empty body. The agent reads them and refuses them undecoded; the
    plan after them is applied. Before, such deliveries reached the agent's own subscription."""
    a = plan_agent
    subject = slicing.mig_plan("gpu-1:example")
    await a.bus.js.publish(subject, b"")  # a heartbeat's copy: no body, no Status header
    plan = MigLayoutPlan(
        id=new_event_id(), at=T0, node="gpu-1:example", gpu_index=3,
        create=[MigInstanceChange(profile="3g.71gb", start_slot=0)],
    )  # fmt: skip
    await a.bus.publish(subject, plan)
    await mig_wait(a, lambda: len(a.mig.gpu_instances(3)) == 1, "the plan after it applied")
    refused = 'seedance_node_agent_mig_plans_total{outcome="not_published"} 1.0'
    await mig_wait(a, lambda: metric_line(a, refused), "the copy refused as no stored plan")


@pytest.mark.usefixtures("plans_purged")
async def test_a_plan_for_a_gpu_the_node_lacks_fails_alone(plan_agent: Agent) -> None:
    """GPU 9 on a four-GPU node: NVML raises. The plan is counted failed, the next one is
    applied, and the agent runs on. Before, the error ended the agent (and every start after,
    while the stream kept the plan)."""
    a = plan_agent
    await a.bus.publish(slicing.mig_plan(TOKEN), plan(TOKEN, 9))
    await a.bus.publish(slicing.mig_plan(TOKEN), plan(TOKEN, 2))
    await mig_wait(a, lambda: len(a.mig.gpu_instances(2)) == 1, "the plan after it applied")
    failed = 'seedance_node_agent_mig_plans_total{outcome="failed"} 1.0'
    await mig_wait(a, lambda: metric_line(a, failed), "the bad plan counted as failed")
    assert (await get(a.base + "/readyz"))[0] == 200


@pytest.mark.usefixtures("plans_purged")
async def test_a_failed_read_of_the_devices_after_a_plan_is_its_own_and_tried_again(
    plan_agent: Agent,
) -> None:
    """NVML fails the read of the devices after a plan is applied: the plan is counted once,
    applied; the read's failure is counted apart and the labels loop reads again. Before, the
    plan was counted applied and failed, and the devices were not read again."""
    a = plan_agent
    a.nvml.failing_reads = 1
    reads = a.nvml.reads
    await a.bus.publish(slicing.mig_plan(TOKEN), plan(TOKEN, 1))
    failed = "seedance_node_agent_device_refresh_failures_total 1.0"
    await mig_wait(a, lambda: metric_line(a, failed), "the read's failure counted")
    await eventually(lambda: a.nvml.reads >= reads + 2, what="the devices read again")
    metrics = (await get(a.base + "/metrics"))[1].splitlines()
    outcomes = [m for m in metrics if m.startswith("seedance_node_agent_mig_plans_total")]
    assert outcomes == ['seedance_node_agent_mig_plans_total{outcome="applied"} 1.0']


@pytest.mark.usefixtures("plans_purged")
async def test_plans_wait_until_the_kubelet_says_which_pods_hold_each_gpu(
    nats_url: str, bus: Any, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> None:
    """A plan stored while the agent was down, for GPU 2, which a pod holds; the agent starts
    while the kubelet's pod-resources List does not answer. No plan is read until it does,
    and then the plan is refused: GPU 2 is not drained. Before, the agent went on without the
    kubelet's word and cut the GPU under the pod."""
    await bus.publish(slicing.mig_plan(TOKEN), plan(TOKEN, 2))
    holder = pr_pb2.PodResources(
        name="holder",
        namespace="team-a",
        containers=[
            pr_pb2.ContainerResources(
                name="main",
                devices=[
                    pr_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[UUIDS[2]])
                ],
            )
        ],
    )
    async with short_dir() as path, kube_api(tmp_path) as (api, api_client):
        sock = os.path.join(path, "kubelet.sock")  # nothing serves it yet
        async with agent_on(
            api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path, sock
        ) as a:
            unanswered = 'seedance_node_agent_pod_resources_failures_total{use="labels"}'
            await eventually(lambda: metric_line(a, unanswered), what="the kubelet asked")
            async with pod_resources_at(sock, [holder]):
                refused = 'seedance_node_agent_mig_plans_total{outcome="refused"} 1.0'
                await mig_wait(a, lambda: metric_line(a, refused), "the plan refused")
            assert a.mig.gpu_instances(2) == []
            assert a.mig.calls == []


async def mig_wait(a: Agent, check: Callable[[], Any], what: str) -> None:
    """``eventually``; a timeout also says what the agent did with the plans it got (this
    test failed twice, once, with nothing else to go on)."""
    try:
        await eventually(check, what=what)
    except TimeoutError as exc:
        metrics = (await get(a.base + "/metrics"))[1].splitlines()
        outcomes = [m for m in metrics if m.startswith("seedance_node_agent_mig_plans_total")]
        raise TimeoutError(f"{exc}; plans handled: {outcomes}; NVML calls: {a.mig.calls}") from None


GPU_SOCKET = "seedance-nvidia-com_gpu.sock"


def whole_gpu_request(device_id: str = UUIDS[0]) -> api_pb2.AllocateRequest:
    """One whole GPU, as the kubelet asks: one advertised ID (only a count to the agent)."""
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device_id])]
    )


async def allocate_whole(plugin_dir: str, device_id: str = UUIDS[0]) -> dict[str, str] | str:
    """One Allocate on the GPU plugin's socket: the env granted, or the refusal's reason. The
    kubelet's ``device_id`` is one it has not recorded for another container (the same ID
    again means it dropped the earlier answer)."""
    async with grpc.aio.insecure_channel(f"unix://{os.path.join(plugin_dir, GPU_SOCKET)}") as ch:
        try:
            resp = await api_pb2_grpc.DevicePluginStub(ch).Allocate(
                whole_gpu_request(device_id), timeout=10.0
            )
        except grpc.aio.AioRpcError as exc:
            return str(exc.details())
    return dict(resp.container_responses[0].envs)


async def whole_gpu_pod(
    bus: Any, api: KubeApiServer, api_client: Any, name: str, index: int
) -> str:
    """A pod bound to the node with the slicer's placement of one whole GPU, published and in
    the stream the agent reads (``merged``: so a placement published before the agent starts
    is in its replay)."""
    held: dict[str, Any] = {}

    def whole(uid: str) -> str:
        held["ev"] = placement(
            uid, PlacementKind.WHOLE, [GpuAssignment(index=index, uuid=UUIDS[index])]
        )
        return annotation(uid, held["ev"])

    uid = await bound_pod(api, api_client, name, {"nvidia.com/gpu": "1"}, whole)
    await publish(bus, held["ev"])
    await merged(bus.js, held["ev"])
    return uid


async def test_the_first_allocate_after_registration_sees_the_replayed_placements(
    nats_url: str, bus: Any, kubelet: FakeKubelet, plugin_dir: str, tmp_path: Path
) -> None:
    async def prepare(api: KubeApiServer, api_client: client.ApiClient) -> None:
        await whole_gpu_pod(bus, api, api_client, "w", 2)  # on the bus before the agent starts

    answers: list[dict[str, str] | str] = []

    async def allocate_at_once(request: api_pb2.RegisterRequest) -> None:
        # As the kubelet may: an Allocate the moment the plugin registers; before Register has
        # answered, so before the agent's start has returned and its loops run.
        if request.resource_name == "nvidia.com/gpu":
            answers.append(await allocate_whole(plugin_dir))

    kubelet.on_register = allocate_at_once
    async with running_agent(nats_url, bus, kubelet, plugin_dir, tmp_path, prepare):
        assert answers == [{"NVIDIA_VISIBLE_DEVICES": UUIDS[2]}]


async def test_a_kubelet_restart_registers_every_plugin_again_and_keeps_the_grants(
    agent: Agent, kubelet: FakeKubelet
) -> None:
    a = agent
    w = await whole_gpu_pod(a.bus, a.api, a.api_client, "w", 2)

    async def granted() -> bool:
        return await allocate_whole(a.plugin_dir) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2]}

    await eventually(granted, what="pod w granted GPU 2")

    await kubelet.go_away()  # its socket and the plugins' deleted, as a restarting kubelet does
    await kubelet.come_back()
    for resource in ("nvidia.com/gpu", "seedance.io/gpu-milli"):
        line = (
            'seedance_node_agent_plugin_registrations_total{reason="kubelet_restarted",'
            f'resource="{resource}"}} 1.0'
        )
        await eventually(lambda line=line: metric_line(a, line), what=f"{resource} re-registered")
    assert sorted(kubelet.resources) == sorted(["nvidia.com/gpu", "seedance.io/gpu-milli"] * 2)
    assert [e for _r, e, _i, _ok in kubelet.attempts[2:]] == [
        e for _r, e, _i, _ok in kubelet.attempts[:2]
    ]

    # Pod x holds a placement of GPU 2 as well: the grant to w, made before the restart, is
    # still held, so the Allocate through the new socket is refused for it.
    await whole_gpu_pod(a.bus, a.api, a.api_client, "x", 2)

    async def refused_as_taken() -> bool:
        answer = await allocate_whole(a.plugin_dir, UUIDS[1])
        return f"already allocated to pod(s) ['{w}']" in str(answer)

    await eventually(refused_as_taken, what="pod x refused: GPU 2 still granted to w")
    a.api.api.delete(a.api.api.resolve("", "v1", "pods"), "team-a", "x")
    await whole_gpu_pod(a.bus, a.api, a.api_client, "y", 3)

    async def y_granted() -> bool:
        got = await allocate_whole(a.plugin_dir, UUIDS[2])
        return got == {"NVIDIA_VISIBLE_DEVICES": UUIDS[3]}

    await eventually(y_granted, what="pod y granted GPU 3 after the restart")


async def test_an_allocate_that_comes_before_the_placement_waits_for_it(agent: Agent) -> None:
    """The bridge binds a pod once the slicer placed it, but the agent reads the placement from
    another stream: the kubelet may admit the pod first. Its Allocate waits for the feed rather
    than failing the pod for good."""
    a = agent
    held: dict[str, Any] = {}

    def whole(uid: str) -> str:
        held["ev"] = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=3, uuid=UUIDS[3])])
        return annotation(uid, held["ev"])

    await bound_pod(a.api, a.api_client, "early", {"nvidia.com/gpu": "1"}, whole)
    answer = asyncio.create_task(allocate_whole(a.plugin_dir))  # before the placement exists
    waiting = 'seedance_node_agent_allocation_waits_total{resource="nvidia.com/gpu"} 1.0'

    async def waits() -> bool:
        return answer.done() or await metric_line(a, waiting)

    await eventually(waits, what="the Allocate waiting for the placement")
    assert not answer.done()
    await publish(a.bus, held["ev"])
    assert await asyncio.wait_for(answer, 10) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[3]}
