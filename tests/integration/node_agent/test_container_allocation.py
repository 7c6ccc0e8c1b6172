"""GPUs per container, as the kubelet asks for them: pods as users write them (a GPU in each of
two app containers; a native sidecar with a GPU beside the main container with one) admitted by
the test kubelet (``kubelet.NodeKubelet``) over the device-plugin gRPC on real unix sockets, one
Allocate per container with that container's count and the kubelet's device IDs, against the
node agent service as its shipped NATS user on the shipped-auth server, the pods and their
Bindings in the test API server, the slicer's placements published as the slicer publishes
them. A restart of the agent between a pod's two Allocates: the second container still gets the
other GPU of the pod's placement. GPUs in a regular init container (an engine build): refused
at admission, naming why. A pod whose admission the kubelet gave up part-way: the next pod
still gets its own GPU and starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from seedance.core import Bus
from seedance.events.jobs import pod_job_id
from seedance.events.slicing import GpuAssignment, Placement, PlacementKind
from seedance.testing.identities import as_user
from tests.conftest import serving
from tests.integration.node_agent.agent import agent_settings, merged, node_agent, slicer_bus
from tests.integration.node_agent.kubelet import NodeKubelet
from tests.integration.node_agent.test_allocation import (
    NODE,
    UUIDS,
    annotation,
    bound_pod,
    kube_api,
    placement,
    publish,
)
from tests.integration.node_agent.test_service import NodeNvml
from tests.unit.node_agent.test_containers import ENGINE_BUILD, GPU, SIDECAR, TWO_APPS, ctr

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def gpu_node(auth_url: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The slicer's bus, the API server with the node, and the node's test kubelet."""
    plugin_dir = tempfile.mkdtemp(prefix="pc-")  # a unix socket path must stay short
    try:
        async with slicer_bus(auth_url) as slicer, kube_api(tmp_path) as (api, api_client):
            kubelet = NodeKubelet(
                NODE, plugin_dir, os.path.join(plugin_dir, "pod-resources.sock"), api_client
            )
            await kubelet.serve()
            try:
                yield {"slicer": slicer, "api": api, "api_client": api_client, "kubelet": kubelet}
            finally:
                await kubelet.stop()
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


def agent_of(n: dict[str, Any], auth_url: str, tmp_path: Path) -> Any:
    kubelet: NodeKubelet = n["kubelet"]
    settings = agent_settings(kubelet.plugin_dir, tmp_path, kubelet.socket)
    agent, _runtime = node_agent(
        settings, as_user(auth_url, "node-agent"), kube_client=n["api_client"], nvml=NodeNvml()
    )
    return agent


async def placed_pod(
    n: dict[str, Any], auth_url: str, name: str, spec: dict[str, Any], indices: list[int]
) -> Placement:
    """A pod of ``spec`` bound to the node with the slicer's whole-GPU placement on GPUs
    ``indices`` (as many as the bridge asks for it), the placement in the stream the agent
    replays at its start."""
    held: dict[str, Placement] = {}

    def whole(uid: str) -> str:
        gpus = [GpuAssignment(index=i, uuid=UUIDS[i]) for i in indices]
        held["ev"] = placement(pod_job_id(uid), PlacementKind.WHOLE, gpus)
        return annotation(uid, held["ev"])

    await bound_pod(n["api"], n["api_client"], name, {}, whole, spec=spec)
    await publish(n["slicer"], held["ev"])
    admin = await Bus.connect(as_user(auth_url, "admin"))
    try:
        await merged(admin.js, held["ev"])
    finally:
        await admin.close()
    return held["ev"]


@pytest.mark.parametrize(
    ("spec", "indices", "expected"),
    [
        (TWO_APPS, [0, 1], {"trainer": [0], "eval": [1]}),
        (SIDECAR, [1, 3], {"proxy": [1], "main": [3]}),
    ],
    ids=["two-app-containers", "native-sidecar"],
)
async def test_each_container_gets_its_own_gpus_of_the_pods_placement(
    auth_url: str,
    tmp_path: Path,
    spec: dict[str, Any],
    indices: list[int],
    expected: dict[str, list[int]],
) -> None:
    async with gpu_node(auth_url, tmp_path) as n:
        await placed_pod(n, auth_url, "p", spec, indices)
        kubelet: NodeKubelet = n["kubelet"]
        async with serving(agent_of(n, auth_url, tmp_path)):
            assert await kubelet.run("team-a", "p") is None  # admitted, every container started
        envs = kubelet.pods[("team-a", "p")].envs
        assert {c: e["NVIDIA_VISIBLE_DEVICES"] for (c, _r), e in envs.items()} == {
            c: ",".join(UUIDS[i] for i in gpus) for c, gpus in expected.items()
        }


async def test_an_agent_restarted_between_a_pods_allocates_keeps_what_it_granted(
    auth_url: str, tmp_path: Path
) -> None:
    async with gpu_node(auth_url, tmp_path) as n:
        await placed_pod(n, auth_url, "p", SIDECAR, [1, 3])
        kubelet: NodeKubelet = n["kubelet"]
        async with serving(agent_of(n, auth_url, tmp_path)):
            endpoint = kubelet.plugins[GPU].endpoint
            # The kubelet allocates the sidecar; then the agent restarts.
            assert await kubelet.admit("team-a", "p", endpoint, GPU, 1, container="proxy") is None
        async with serving(agent_of(n, auth_url, tmp_path)):
            endpoint = kubelet.plugins[GPU].endpoint
            assert await kubelet.admit("team-a", "p", endpoint, GPU, 1, container="main") is None
            for container in ("proxy", "main"):
                assert await kubelet.start("team-a", "p", endpoint, GPU, container) is None
        envs = kubelet.pods[("team-a", "p")].envs
        assert envs[("proxy", GPU)] == {"NVIDIA_VISIBLE_DEVICES": UUIDS[1]}
        assert envs[("main", GPU)] == {"NVIDIA_VISIBLE_DEVICES": UUIDS[3]}


async def test_gpus_in_a_regular_init_container_fail_the_pods_admission_naming_why(
    auth_url: str, tmp_path: Path
) -> None:
    # Review p1/p5: the old agent answered the init container's Allocate and let its start
    # through unconfirmed (the kubelet never lists one): crossed between two such pods, two
    # tenants shared a GPU. Now the admission fails with the reason; nothing is held.
    async with gpu_node(auth_url, tmp_path) as n:
        await placed_pod(n, auth_url, "p", ENGINE_BUILD, [2])
        kubelet: NodeKubelet = n["kubelet"]
        async with serving(agent_of(n, auth_url, tmp_path)):
            refused = await kubelet.run("team-a", "p")
        assert refused is not None
        assert "regular init container(s) ['build-engine'] ask for nvidia.com/gpu" in refused
        assert "never lists regular init containers" in refused
        assert ("team-a", "p") not in kubelet.pods


async def test_a_pod_abandoned_part_way_leaves_the_next_pod_its_own_gpu(
    auth_url: str, tmp_path: Path
) -> None:
    # Review p2: the kubelet allocates a's trainer, then fails a's admission at its eval
    # container (a resource no plugin on the node serves) and frees a's IDs; b, asking for as
    # many GPUs as a's eval, is admitted next. The old agent gave b's Allocate to a (part-way
    # first): b got a's GPU and was refused at its start.
    spec_a = {
        "containers": [
            ctr("trainer", "1"),
            ctr("eval", resources={"limits": {GPU: "1", "example.com/fpga": "1"}}),
        ]
    }
    async with gpu_node(auth_url, tmp_path) as n:
        await placed_pod(n, auth_url, "a", spec_a, [0, 1])
        kubelet: NodeKubelet = n["kubelet"]
        async with serving(agent_of(n, auth_url, tmp_path)):
            refused = await kubelet.run("team-a", "a")  # a stays Pending in the API server
            assert refused == f"no device plugin serves example.com/fpga on {NODE}"
            await placed_pod(n, auth_url, "b", {"containers": [ctr("main", "1")]}, [3])
            assert await kubelet.run("team-a", "b") is None  # admitted and started
        envs = kubelet.pods[("team-a", "b")].envs
        assert envs[("main", GPU)] == {"NVIDIA_VISIBLE_DEVICES": UUIDS[3]}
