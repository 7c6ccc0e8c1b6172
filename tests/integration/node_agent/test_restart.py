"""The node agent's grants across its own restart: a stopped agent's successor rebuilds them,
before its plugins register, from the pods the test API server shows running on the node and
those the test kubelet's pod-resources List (a real unix socket) reports holding devices, each
checked against the slicer's placements replayed from a real nats-server; Allocate then goes
over the plugin's real unix socket as in the service tests."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from seedance.events.slicing import GpuAssignment, PlacementKind
from seedance.node_agent.podresources import api_pb2
from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.waits import eventually
from tests.integration.node_agent import test_service
from tests.integration.node_agent.test_allocation import (
    UUIDS,
    annotation,
    bound_pod,
    placement,
    publish,
)
from tests.integration.node_agent.test_deviceplugin import FakeKubelet
from tests.integration.node_agent.test_podresources import FakeKubeletPodResources, serving
from tests.integration.node_agent.test_service import (
    agent_on,
    allocate_whole,
    kube_api,
    metric_line,
    whole_gpu_pod,
)

pytestmark = pytest.mark.integration

# The service tests' fixtures: a plugin directory and a test kubelet serving in it.
plugin_dir = test_service.plugin_dir
kubelet = test_service.kubelet

RESTORED = 'seedance_node_agent_restored_grants_total{outcome="%s",resource="nvidia.com/gpu"}'
UNREACHABLE = 'seedance_node_agent_pod_resources_failures_total{use="restore"}'


@pytest.fixture
def pod_resources_socket() -> Iterator[str]:
    # Its own directory, as the kubelet's: not the plugin directory a kubelet restart empties.
    path = tempfile.mkdtemp(prefix="prs-")
    yield os.path.join(path, "kubelet.sock")
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def pod_resources(pod_resources_socket: str) -> AsyncIterator[FakeKubeletPodResources]:
    """The test kubelet's pod-resources List over a real unix socket; it reports no pod until
    a test says which."""
    fake = FakeKubeletPodResources()
    fake.pods = []
    async with serving(fake, pod_resources_socket):
        yield fake


def _kubelet_status(api: KubeApiServer, name: str, phase: str, state: dict[str, Any]) -> None:
    """Write the pod's status as the kubelet would: ``phase`` and its one container's state."""
    current = api.api.get(api.api.resolve("", "v1", "pods"), "team-a", name)
    container = {
        "name": "main",
        "ready": "running" in state,
        "restartCount": 0,
        "image": "registry.example/job:1",
        "imageID": "",
        "started": "running" in state,
        "state": state,
    }
    status = {**current["status"], "phase": phase, "containerStatuses": [container]}
    seed.set_status(api, "", "v1", "pods", "team-a", name, status)


def kubelet_pulling(api: KubeApiServer, name: str) -> None:
    """The pod's status as the kubelet reports it once admitted (its devices allocated) while
    its image is pulled: Pending, its container waiting."""
    _kubelet_status(api, name, "Pending", {"waiting": {"reason": "ContainerCreating"}})


def kubelet_assigned(name: str, resource: str, *device_ids: str) -> api_pb2.PodResources:
    """A pod as the kubelet's pod-resources List reports it: its container's devices."""
    devices = api_pb2.ContainerDevices(resource_name=resource, device_ids=list(device_ids))
    return api_pb2.PodResources(
        name=name,
        namespace="team-a",
        containers=[api_pb2.ContainerResources(name="main", devices=[devices])],
    )


def kubelet_started(api: KubeApiServer, name: str) -> None:
    """The pod's status as the kubelet reports it once its container runs."""
    _kubelet_status(api, name, "Running", {"running": {"startedAt": "2026-12-02T01:00:05Z"}})


async def wait_granted(plugin_dir: str, gpu: int, pod: str) -> None:
    """The next pending pod's Allocate of one GPU answers exactly GPU ``gpu``'s UUID."""

    async def granted() -> bool:
        return await allocate_whole(plugin_dir) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[gpu]}

    await eventually(granted, what=f"pod {pod} granted GPU {gpu}")


def first_allocate_answers(kubelet: FakeKubelet, plugin_dir: str) -> list[dict[str, str] | str]:
    """What one Allocate of a GPU answers when the kubelet sends it the moment the plugin
    registers (the grants must be rebuilt by then); filled as the registration happens."""
    answers: list[dict[str, str] | str] = []

    async def allocate_at_once(request: Any) -> None:
        if request.resource_name == "nvidia.com/gpu":
            answers.append(await allocate_whole(plugin_dir))

    kubelet.on_register = allocate_at_once
    return answers


async def test_a_restarted_agent_keeps_a_running_pods_grant_and_refuses_its_gpu_to_another(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
) -> None:
    async with kube_api(tmp_path) as (api, api_client):
        async with agent_on(api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
            holder = await whole_gpu_pod(bus, api, api_client, "a", 1)

            await wait_granted(a.plugin_dir, 1, "a")
        kubelet_started(api, "a")  # its container runs while no agent does
        # Pod b's claim of GPU 1 passes every check but exclusivity: the slicer's book holds a
        # placement of b on GPU 1 as well (a double booking, or a claim copied from one).
        # Without the rebuilt grant the new agent would hand b pod a's GPU.
        await whole_gpu_pod(bus, api, api_client, "b", 1)
        answers = first_allocate_answers(kubelet, plugin_dir)
        async with agent_on(api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
            (answer,) = answers
            assert (
                f"team-a/b: devices ['{UUIDS[1]}'] are already allocated to pod(s) ['{holder}']"
                in answer
            )
            assert await metric_line(a, RESTORED % "restored" + " 1.0")
            assert not await metric_line(a, RESTORED % "refused")
            # No pod-resources socket here: the kubelet's view was missed, and counted.
            assert await metric_line(a, UNREACHABLE + " 1.0")
            # The rebuilt grant keeps pod a's name: its measured share is labelled with it.
            (a.proc / "4343").mkdir(parents=True)
            (a.proc / "4343" / "cgroup").write_text(
                "0::/kubepods.slice/kubepods-pod"
                f"{holder.replace('-', '_')}.slice/cri-containerd-{'d' * 64}.scope\n"
            )
            a.nvml.run((4343, 40.0, 10.0))
            share = (
                f'seedance_node_agent_pod_sm_share_ratio{{UUID="{UUIDS[1]}",container="",'
                'namespace="team-a",pod="a"} 0.4'
            )
            await eventually(lambda: metric_line(a, share), what="pod a's share, by its name")


async def test_a_running_pod_without_the_slicers_placement_is_not_granted_at_start(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
) -> None:
    async with kube_api(tmp_path) as (api, api_client):
        # Pod n claims GPU 3 under a placement the slicer never made.
        def never_placed(uid: str) -> str:
            ev = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=3, uuid=UUIDS[3])])
            return annotation(uid, ev)

        await bound_pod(api, api_client, "n", {"nvidia.com/gpu": "1"}, never_placed)
        # Pod s claims GPU 3 under its job's placement that the slicer has since replaced.
        held: dict[str, Any] = {}

        def stale(uid: str) -> str:
            held["old"] = placement(
                uid, PlacementKind.WHOLE, [GpuAssignment(index=3, uuid=UUIDS[3])]
            )
            return annotation(uid, held["old"])

        s = await bound_pod(api, api_client, "s", {"nvidia.com/gpu": "1"}, stale)
        await publish(bus, held["old"])
        await publish(
            bus, placement(s, PlacementKind.WHOLE, [GpuAssignment(index=0, uuid=UUIDS[0])])
        )
        kubelet_started(api, "n")
        kubelet_started(api, "s")

        async with agent_on(api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
            assert await metric_line(a, RESTORED % "refused" + " 2.0")
            assert not await metric_line(a, RESTORED % "restored")
            # Neither holds GPU 3: a pod the slicer placed there is granted it.
            await whole_gpu_pod(bus, api, api_client, "t", 3)

            await wait_granted(a.plugin_dir, 3, "t")


async def test_a_pod_the_kubelet_allocated_whose_container_waits_keeps_its_grant(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
    pod_resources: FakeKubeletPodResources,
    pod_resources_socket: str,
) -> None:
    async with kube_api(tmp_path) as (api, api_client):
        async with agent_on(api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path) as a:
            holder = await whole_gpu_pod(bus, api, api_client, "a", 1)

            await wait_granted(a.plugin_dir, 1, "a")
        # Pod a's image is still pulling while no agent runs: the API server shows it Pending
        # with its container waiting (as a pod not yet allocated is); only the kubelet's
        # pod-resources List says it holds a GPU.
        kubelet_pulling(api, "a")
        pod_resources.pods = [kubelet_assigned("a", "nvidia.com/gpu", UUIDS[1])]
        # Pod b claims GPU 1 too (a double booking in the slicer's book). Without pod a's
        # grant rebuilt, the next Allocate of one GPU takes pod a again (the older pending
        # pod) and hands out GPU 1 as if it were free.
        await whole_gpu_pod(bus, api, api_client, "b", 1)
        answers = first_allocate_answers(kubelet, plugin_dir)
        async with agent_on(
            api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path, pod_resources_socket
        ) as a:
            (answer,) = answers
            assert (
                f"team-a/b: devices ['{UUIDS[1]}'] are already allocated to pod(s) ['{holder}']"
                in answer
            )
            assert await metric_line(a, RESTORED % "restored" + " 1.0")
            assert not await metric_line(a, UNREACHABLE)


async def test_a_kubelet_reported_pod_is_checked_and_only_for_served_resources(
    nats_url: str,
    bus: Any,
    kubelet: FakeKubelet,
    plugin_dir: str,
    tmp_path: Path,
    pod_resources: FakeKubeletPodResources,
    pod_resources_socket: str,
) -> None:
    async with kube_api(tmp_path) as (api, api_client):
        # Pod n claims GPU 2 under a placement the slicer never made; the kubelet reports it
        # holding a GPU (it may: Allocate is what refuses it) while its container waits.
        def never_placed(uid: str) -> str:
            ev = placement(uid, PlacementKind.WHOLE, [GpuAssignment(index=2, uuid=UUIDS[2])])
            return annotation(uid, ev)

        await bound_pod(api, api_client, "n", {"nvidia.com/gpu": "1"}, never_placed)
        # Pod m has the slicer's placement of GPU 0, but the kubelet reports it holding only
        # a resource this agent does not serve: not past this agent's Allocate.
        await whole_gpu_pod(bus, api, api_client, "m", 0)
        for name in ("n", "m"):
            kubelet_pulling(api, name)
        pod_resources.pods = [
            kubelet_assigned("n", "nvidia.com/gpu", UUIDS[2]),
            kubelet_assigned("m", "example.com/rdma", "mlx5_0"),
            # One the API server does not have on this node: nothing to look for.
            kubelet_assigned("elsewhere", "nvidia.com/gpu", UUIDS[3]),
        ]
        async with agent_on(
            api, api_client, nats_url, bus, kubelet, plugin_dir, tmp_path, pod_resources_socket
        ) as a:
            # n's claim is checked against the slicer's book, not taken from its annotation.
            assert await metric_line(a, RESTORED % "refused" + " 1.0")
            assert not await metric_line(a, RESTORED % "restored")
            assert not await metric_line(a, UNREACHABLE)
