"""The dev overlay runs a pod: placed, bound, allocated and billed on a simulated GPU of a real
node (``dev_cluster``: the test API server with the overlay applied by the pinned kubectl, one
node and its test kubelet, the slicer, cost-ledger, k8s-bridge and node agent as processes with
the overlay's settings, each as its shipped NATS user with the overlay's password).

What a user does: apply the overlay, a TenantQuota and a pod as users write them (the examples);
what the test reads: the pod Running on the node, the GPU the kubelet's Allocate got (a
simulated GPU's UUID, the slicer's choice), and tenant acme's cost stream, read with acme's own
credentials: cost lines for the pod's job, priced as the simulated model (not the fallback),
then the job's report once the pod ended.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from seedance.events.cost import CostEntry, JobCostReport
from seedance.events.jobs import pod_job_id
from seedance.k8s_bridge.kube import USER_AGENT as BRIDGE_UA
from seedance.k8s_bridge.rbac import RULES as BRIDGE_RULES
from seedance.node_agent.core.simulated import simulated_uuid
from seedance.node_agent.kube import USER_AGENT as AGENT_UA
from seedance.node_agent.rbac import RULES as AGENT_RULES
from seedance.sdk import SeedanceClient
from seedance.testing.paths import REPO
from tests.e2e.dev_cluster import NODE, DevCluster, dev_cluster, tenant_credentials
from tests.integration.k8s.test_kubectl import kubectl

pytestmark = pytest.mark.timeout(300)

K8S = REPO / "deploy" / "k8s"


async def apply(c: DevCluster, tmp_path: Path, *args: str) -> None:
    code, out = await kubectl(c.kube, tmp_path, "apply", *args)
    assert code == 0, out


async def quota_then_pod(c: DevCluster, tmp_path: Path) -> None:
    """TenantQuota acme, then (once the bridge has bound its namespace to acme) the pod: the
    bridge refuses for good a pod it sees in a namespace no TenantQuota binds yet, so the
    README's walkthrough applies them in that order too."""
    await apply(c, tmp_path, "-f", str(K8S / "examples" / "tenantquota-acme.yaml"))
    crs = client.CustomObjectsApi(c.api_client)

    async def in_force() -> bool:
        tq = await crs.get_cluster_custom_object("seedance.io", "v1alpha1", "tenantquotas", "acme")
        conditions = (tq.get("status") or {}).get("conditions") or []
        return any(x["type"] == "Ready" and x["status"] == "True" for x in conditions)

    await c.until(in_force, timeout_s=60, what="TenantQuota acme in force")
    await apply(c, tmp_path, "-f", str(K8S / "examples" / "pods" / "gpu-pod.yaml"))


async def billed(c: DevCluster, job: str) -> None:
    """Tenant acme's cost stream, read with its own credentials: the job's lines, priced as the
    simulated model, then its report once the pod ended."""
    entries: list[CostEntry] = []
    reports: list[JobCostReport] = []
    async with await SeedanceClient.connect(
        c.nats_url, **tenant_credentials(c.passwords, "acme")
    ) as sdk:

        async def read() -> None:
            async for event in sdk.costs("acme"):
                if isinstance(event, CostEntry) and event.job_id == job:
                    entries.append(event)
                elif isinstance(event, JobCostReport) and event.job_id == job:
                    reports.append(event)

        reader = asyncio.create_task(read())
        try:
            await c.until(lambda: bool(entries), timeout_s=60, what="a cost line")
            line = entries[0]
            assert (line.tenant, line.node, line.kind.value) == ("acme", NODE, "compute")
            assert line.gpu_model == "A100-SXM4-80GB"  # the simulated model's identity
            assert (line.price_fallback, line.price_assumed) == (False, False)
            assert line.cost_micro_usd > 0
            await c.kubelet.finish("acme", "train-1")
            await c.until(lambda: bool(reports), timeout_s=60, what="the job's report")
            assert reports[0].cost_micro_usd > 0
        finally:
            reader.cancel()


async def test_a_pod_is_placed_bound_allocated_and_billed_on_a_simulated_gpu_of_a_real_node(
    tmp_path: Path,
) -> None:
    async with dev_cluster(tmp_path) as c:
        # No KEDA, no Prometheus operator in this cluster: the overlay applies all the same.
        await apply(c, tmp_path, "-k", str(K8S / "overlays" / "dev"))
        await c.start()
        await quota_then_pod(c, tmp_path)
        core = client.CoreV1Api(c.api_client)

        async def running() -> bool:
            pod = await core.read_namespaced_pod("train-1", "acme")
            return pod.status.phase == "Running"

        await c.until(running, timeout_s=90, what="train-1 running")
        pod = await core.read_namespaced_pod("train-1", "acme")
        assert pod.spec.node_name == NODE
        claim = json.loads(pod.metadata.annotations["seedance.io/placement"])
        (gpu,) = claim["gpus"]
        assert (claim["tenant"], claim["node"]) == ("acme", NODE)
        # The container got the simulated GPU the slicer chose, by its NVML-form UUID.
        envs = c.kubelet.pods[("acme", "train-1")].envs[("train", "nvidia.com/gpu")]
        assert envs == {"NVIDIA_VISIBLE_DEVICES": simulated_uuid(NODE, gpu["index"])}
        await billed(c, pod_job_id(pod.metadata.uid))
        # Every API call the bridge and the node agent made is one their RBAC grants.
        for agent, rules in ((BRIDGE_UA, BRIDGE_RULES.values()), (AGENT_UA, AGENT_RULES)):
            declared = {(r.api_group, r.resource, v) for r in rules for v in r.verbs}
            used = c.kube.verbs_used(user_agent=agent)
            assert used, agent
            assert used <= declared, (agent, used - declared)
