"""MIG beside NVIDIA's mig-manager: on a node whose labels show mig-manager owns MIG, the node
agent applies the slicer's plan through mig-manager's contract (a named layout in the
ConfigMap the mig-manager component installs, the node's ``nvidia.com/mig.config`` label), never
through NVML itself; Allocate then resolves the slicer's start slot to the instance mig-manager
created. Without the component's ConfigMap configured, plans on such a node are refused.

Real interfaces: the test API server over HTTP (labels, the ConfigMap, pods and Bindings), a
test mig-manager (``mig_manager.TestMigManager``) acting on the label as the real one does on a
constructed NVML backend, the shipped ConfigMap (deploy/k8s/components/mig-manager), the agent
under its shipped NATS user on the shipped-auth server, the plan and the placement published
by the slicer's shipped user, and the test kubelet (device-plugin gRPC over real sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from seedance.core import Bus
from seedance.core.clock import WallClock
from seedance.events.base import new_event_id
from seedance.events.slicing import (
    GpuAssignment,
    MigInstanceChange,
    MigLayoutPlan,
    PlacementKind,
)
from seedance.events.subjects import slicing
from seedance.node_agent.core.mig import MigInstance
from seedance.node_agent.core.placement import NodeDevices
from seedance.node_agent.core.shares import ProcessSample
from seedance.node_agent.kube import USER_AGENT, ThisNode, connect
from seedance.node_agent.mig import MigOutcome
from seedance.node_agent.mig_manager import MigManagerApplier
from seedance.node_agent.rbac import MIG_MANAGER_RULES, RULES
from seedance.testing.identities import as_user
from seedance.testing.kube_api import seed
from seedance.testing.paths import REPO
from seedance.testing.waits import eventually
from tests.conftest import serving
from tests.integration.node_agent.agent import agent_settings, node_agent, slicer_bus
from tests.integration.node_agent.kubelet import NodeKubelet
from tests.integration.node_agent.mig_manager import TestMigManager
from tests.integration.node_agent.test_allocation import (
    NODE,
    T0,
    TOKEN,
    UUIDS,
    annotation,
    bound_pod,
    kube_api,
    placement,
    publish,
)
from tests.unit.node_agent.nvml_mig import ConstructedNvmlMig

pytestmark = pytest.mark.integration

COMPONENT = REPO / "deploy" / "k8s" / "components" / "mig-manager"
MIG_RESOURCE = "nvidia.com/mig-1g.18gb"


class ReadOnlyMig:
    """The agent's MIG backend on this node: NVML's reads of the constructed GPUs; a create or
    destroy fails the test (mig-manager, not the agent, changes the layout here)."""

    def __init__(self, nvml: ConstructedNvmlMig) -> None:
        self.nvml = nvml

    def mig_enabled(self, gpu_index: int) -> bool:
        return self.nvml.mig_enabled(gpu_index)

    def gpu_instances(self, gpu_index: int) -> list[MigInstance]:
        return self.nvml.gpu_instances(gpu_index)

    def compute_processes(self, gpu_index: int) -> int:
        return self.nvml.compute_processes(gpu_index)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the agent called {name} beside mig-manager")


class MigNodeNvml:
    """The node's GPUs as NVML lists them: four GPUs, and each MIG instance the constructed
    backend holds (its UUID derived from the GPU, profile and real start slot)."""

    def __init__(self, nvml: ConstructedNvmlMig) -> None:
        self.nvml = nvml

    def devices(self) -> NodeDevices:
        mig = {
            (UUIDS[g], i.profile, i.start_slot): f"MIG-{g}-{i.profile}-{i.start_slot}"
            for g in range(len(self.nvml.gpus))
            for i in self.nvml.gpu_instances(g)
        }
        return NodeDevices(gpus=UUIDS, mig=mig)

    def process_samples(self, gpu_index: int, since_us: int = 0) -> list[ProcessSample]:
        return []

    def process_memory_mib(self, gpu_index: int) -> dict[int, float]:
        return {}


@contextlib.asynccontextmanager
async def operator_node(
    api: Any, api_client: client.ApiClient, nvml: ConstructedNvmlMig, **manager: Any
) -> AsyncIterator[tuple[TestMigManager, tuple[str, str]]]:
    """``NODE`` labelled as the GPU operator labels one where mig-manager runs (its layout
    ``all-enabled`` applied), the component's ConfigMap, and the test mig-manager acting on
    ``nvml`` (``manager``: its gate and hold); yields the manager and the ConfigMap's
    (namespace, name)."""
    core = client.CoreV1Api(api_client)
    await core.patch_node(
        NODE,
        {
            "metadata": {
                "labels": {
                    "nvidia.com/mig.capable": "true",
                    "nvidia.com/mig.config": "all-enabled",
                    "nvidia.com/mig.config.state": "success",
                }
            }
        },
        _content_type="application/merge-patch+json",
    )
    shipped_cm = yaml.safe_load((COMPONENT / "configmap.yaml").read_text())
    cm = (shipped_cm["metadata"]["namespace"], shipped_cm["metadata"]["name"])
    seed.namespace(api, cm[0])
    seed.create(api, "", "v1", "configmaps", shipped_cm, cm[0])
    mig_manager = TestMigManager(api_client, NODE, cm, nvml, **manager)
    await mig_manager.start()
    try:
        yield mig_manager, cm
    finally:
        await mig_manager.stop()


@contextlib.asynccontextmanager
async def mig_node(
    auth_url: str, tmp_path: Path, *, configured: bool
) -> AsyncIterator[dict[str, Any]]:
    """The operator's node (``operator_node``), the test kubelet and the agent; yields them by
    name."""
    plugin_dir = tempfile.mkdtemp(prefix="mm-")
    nvml = ConstructedNvmlMig(gpus=4)
    try:
        async with (
            slicer_bus(auth_url) as slicer,
            kube_api(tmp_path) as (api, api_client),
            operator_node(api, api_client, nvml) as (manager, cm),
        ):
            kubelet = NodeKubelet(
                NODE, plugin_dir, os.path.join(plugin_dir, "pod-resources.sock"), api_client
            )
            await kubelet.serve()
            settings = agent_settings(
                plugin_dir,
                tmp_path,
                kubelet.socket,
                resources=f"nvidia.com/gpu,{MIG_RESOURCE}",
                mig_manager_config=f"{cm[0]}/{cm[1]}" if configured else "",
                mig_manager_poll_s=0.05,
                # Below the tests' 30 s wait: a mig-manager that never answers is a plan
                # failed with that reason, not a test that times out.
                mig_manager_timeout_s=20.0,
            )
            # Each test's node is a fresh one: the plans an earlier test published for a node
            # of this name are not its own (the agent would read them back at its start).
            admin = await Bus.connect(as_user(auth_url, "admin"))
            try:
                await admin.js.purge_stream(slicing.PLAN_STREAM, subject=slicing.mig_plan(TOKEN))
            finally:
                await admin.close()
            # The agent's own client, as main() builds it (its user agent names its calls).
            agent_client = await connect(str(tmp_path / "kubeconfig"))
            agent, runtime = node_agent(
                settings,
                as_user(auth_url, "node-agent"),
                kube_client=agent_client,
                nvml=MigNodeNvml(nvml),
                mig=ReadOnlyMig(nvml),
            )
            try:
                async with serving(agent):
                    yield {
                        "api": api,
                        "api_client": api_client,
                        "core": client.CoreV1Api(api_client),
                        "slicer": slicer,
                        "nvml": nvml,
                        "manager": manager,
                        "kubelet": kubelet,
                        "runtime": runtime,
                        "cm": cm,
                    }
            finally:
                await agent_client.close()
                await kubelet.stop()
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


def plan_for_gpu_0() -> MigLayoutPlan:
    """The slicer's plan: a 3g.71gb at slot 0 and a 1g.18gb at slot 6 (its choice of slot)."""
    return MigLayoutPlan(
        id=new_event_id(),
        at=T0,
        node=TOKEN,
        gpu_index=0,
        create=[
            MigInstanceChange(profile="1g.18gb", start_slot=6),
            MigInstanceChange(profile="3g.71gb", start_slot=0),
        ],
    )


def outcomes(n: dict[str, Any]) -> dict[str, float]:
    """The plans the agent handled, by outcome (``seedance_node_agent_mig_plans_total``): a
    test waits for its plan to be handled, then says which outcome it wants (waiting for the
    one it wants, a plan failed at once would be a timeout that says nothing)."""
    return {
        s.labels["outcome"]: s.value
        for family in n["runtime"].registry.collect()
        for s in family.samples
        if s.name == "seedance_node_agent_mig_plans_total"
    }


async def test_a_plan_goes_through_mig_managers_layout_and_label_and_allocate_follows(
    auth_url: str, tmp_path: Path
) -> None:
    async with mig_node(auth_url, tmp_path, configured=True) as n:
        await n["slicer"].publish(slicing.mig_plan(TOKEN), plan_for_gpu_0())
        await eventually(lambda: outcomes(n), timeout_s=30, what="the plan handled")
        assert outcomes(n) == {"applied": 1.0}
        node = await n["core"].read_node(NODE)
        name = node.metadata.labels["nvidia.com/mig.config"]
        assert name.startswith("seedance-")
        assert node.metadata.labels["nvidia.com/mig.config.state"] == "success"
        assert n["manager"].applied == [name]
        cm = await n["core"].read_namespaced_config_map(n["cm"][1], n["cm"][0])
        layouts = yaml.safe_load(cm.data["config.yaml"])["mig-configs"]
        assert {"all-disabled", "all-enabled"} <= set(layouts)  # the operator's, untouched
        assert layouts[name] == [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 1, "3g.71gb": 1}},
            {"devices": [1, 2, 3], "mig-enabled": True, "mig-devices": {}},
        ]
        # mig-manager (the driver) placed the 1g.18gb at slot 4, not the slicer's 6.
        real = [(i.profile, i.start_slot) for i in n["nvml"].gpu_instances(0)]
        assert sorted(real) == [("1g.18gb", 4), ("3g.71gb", 0)]

        # A pod the slicer placed on its 1g.18gb at slot 6 gets the instance at slot 4.
        held: dict[str, Any] = {}

        def mig(uid: str) -> str:
            gpus = [GpuAssignment(index=0, uuid="", mig_profile="1g.18gb", mig_start_slot=6)]
            held["ev"] = placement(uid, PlacementKind.MIG, gpus)
            return annotation(uid, held["ev"])

        await bound_pod(n["api"], n["api_client"], "m", {MIG_RESOURCE: "1"}, mig)
        await publish(n["slicer"], held["ev"])
        kubelet: NodeKubelet = n["kubelet"]

        async def admitted() -> bool:
            endpoint = kubelet.plugins[MIG_RESOURCE].endpoint
            return await kubelet.admit("team-a", "m", endpoint, MIG_RESOURCE, 1) is None

        await eventually(admitted, timeout_s=15, what="the MIG pod admitted")
        envs = kubelet.pods[("team-a", "m")].envs[("main", MIG_RESOURCE)]
        assert envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-0-1g.18gb-4"}
        # Every call the agent made is one its RBAC declares (the manifests are made from it).
        declared = {
            (r.api_group, r.resource, v) for r in (*RULES, *MIG_MANAGER_RULES) for v in r.verbs
        }
        used = n["api"].verbs_used(user_agent=USER_AGENT)
        assert ("", "configmaps", "update") in used
        assert ("", "nodes", "patch") in used
        assert used <= declared


async def test_without_the_layouts_configmap_a_plan_on_a_mig_manager_node_is_refused(
    auth_url: str, tmp_path: Path
) -> None:
    async with mig_node(auth_url, tmp_path, configured=False) as n:
        before = await n["core"].read_namespaced_config_map(n["cm"][1], n["cm"][0])
        await n["slicer"].publish(slicing.mig_plan(TOKEN), plan_for_gpu_0())
        await eventually(lambda: outcomes(n), what="the plan handled")
        assert outcomes(n) == {"refused": 1.0}
        node = await n["core"].read_node(NODE)
        assert node.metadata.labels["nvidia.com/mig.config"] == "all-enabled"
        after = await n["core"].read_namespaced_config_map(n["cm"][1], n["cm"][0])
        assert after.data == before.data
        assert n["nvml"].gpu_instances(0) == []
        assert n["manager"].applied == []


class AnsweredBeforePending(ThisNode):
    """The agent's reads of its Node, where the first read after the agent's label is answered
    before mig-manager acts and reaches the agent after mig-manager set ``pending`` and created
    the plan's instances: it says ``success``, left from the earlier layout."""

    def __init__(self, api_client: client.ApiClient, manager: TestMigManager) -> None:
        super().__init__(api_client, NODE)
        self.manager = manager
        self.reads_after = 0

    async def get(self) -> dict[str, Any]:
        body = await super().get()
        labels = body["metadata"]["labels"]
        if self.manager.gate is None or self.manager.gate.is_set():
            self.reads_after += 1
        elif labels["nvidia.com/mig.config"].startswith("seedance-"):
            assert labels["nvidia.com/mig.config.state"] == "success"  # the earlier layout's
            self.manager.gate.set()
            await eventually(lambda: self.manager.applied, what="mig-manager's instances")
        return body


async def test_a_success_left_from_the_earlier_layout_is_not_taken_for_the_plans(
    tmp_path: Path,
) -> None:
    """The applier, alone (no bus, no agent around it): its plan is applied only once
    mig-manager says ``success`` after it, though the GPU's instances were there before."""
    nvml = ConstructedNvmlMig(gpus=4)
    gate, hold = asyncio.Event(), asyncio.Event()
    async with (
        kube_api(tmp_path) as (api, api_client),
        operator_node(api, api_client, nvml, gate=gate, hold=hold) as (manager, cm),
    ):
        node = AnsweredBeforePending(api_client, manager)
        applier = MigManagerApplier(
            ReadOnlyMig(nvml),
            api_client,
            node,
            cm,
            gpus=lambda: [0, 1, 2, 3],
            allocated=lambda _gpu: [],
            clock=WallClock(),
            timeout_s=20.0,
            poll_s=0.01,
        )
        applying = asyncio.create_task(applier.apply(plan_for_gpu_0()))
        try:
            # One read after mig-manager created the instances (state "pending", "success"
            # held back): the plan must still be waiting.
            await eventually(lambda: applying.done() or node.reads_after > 0, what="a read")
            assert not applying.done(), f"{applying.result()} before mig-manager's success"
            hold.set()
            result = await asyncio.wait_for(applying, timeout=15)
        finally:
            applying.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await applying
        assert result.outcome is MigOutcome.APPLIED
        labels = (await node.get())["metadata"]["labels"]
        assert labels["nvidia.com/mig.config.state"] == "success"


async def test_a_plan_the_api_server_refuses_to_label_is_failed_with_the_reason(
    auth_url: str, tmp_path: Path
) -> None:
    async with mig_node(auth_url, tmp_path, configured=True) as n:
        n["api"].fail_next("PATCH", rf"^/api/v1/nodes/{NODE}$", 503)
        with capture_logs() as logs:
            await n["slicer"].publish(slicing.mig_plan(TOKEN), plan_for_gpu_0())
            await eventually(lambda: outcomes(n), what="the plan handled")
        assert outcomes(n) == {"failed": 1.0}
        (failed,) = [e for e in logs if e["event"] == "mig_plan_failed"]
        assert "503" in failed["error"]
        node = await n["core"].read_node(NODE)
        assert node.metadata.labels["nvidia.com/mig.config"] == "all-enabled"
        assert n["manager"].applied == []
