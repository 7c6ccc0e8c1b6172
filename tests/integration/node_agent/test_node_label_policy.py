"""The mig-manager component's admission policy (deploy/k8s/components/mig-manager/
admission.yaml) holds the node agents' `patch nodes` (one ServiceAccount on every node; RBAC
cannot say "its own node" nor "one label") to what the agent does: its own node's
`nvidia.com/mig.config` label. The test API server enforces the shipped policy as the real one
does (CEL by cel-python, the objects against the 1.33 schemas); the agent's own adapter
(``ThisNode.set_labels``) makes the allowed call, with a pod-bound token of the agent's
ServiceAccount on its node."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.node_agent.core.migparted import MIG_CONFIG_LABEL
from seedance.node_agent.kube import ThisNode
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.paths import REPO

pytestmark = pytest.mark.integration

POLICY = REPO / "deploy" / "k8s" / "components" / "mig-manager" / "admission.yaml"
MINE, OTHER = "gpu-1.example", "gpu-2.example"
MERGE = "application/merge-patch+json"


@contextlib.asynccontextmanager
async def api_client(api: KubeApiServer, path: Path, token: str) -> AsyncIterator[Any]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(api.kubeconfig(path, token=token)), client_configuration=cfg
    )
    async with client.ApiClient(configuration=cfg) as c:
        yield c


async def refused(call: Any) -> str:
    with pytest.raises(ApiException) as err:
        await call
    assert err.value.status == 403, err.value.body
    return str(err.value.body)


def labels_of(api: KubeApiServer, node: str) -> dict[str, str]:
    got = api.api.get(api.api.resolve("", "v1", "nodes"), "", node)
    return dict(got["metadata"]["labels"])


async def test_the_node_agent_may_patch_only_its_own_nodes_mig_config_label(
    tmp_path: Path,
) -> None:
    async with KubeApiServer(KubeApiSettings()) as api:
        for node in (MINE, OTHER):
            seed.node(api, node, gpus=4, labels={MIG_CONFIG_LABEL: "all-enabled", "zone": "a"})
        async with api_client(api, tmp_path / "admin", "seedance-test") as admin:
            admission = client.AdmissionregistrationV1Api(admin)
            policy, binding = yaml.safe_load_all(POLICY.read_text())
            await admission.create_validating_admission_policy(policy)
            await admission.create_validating_admission_policy_binding(binding)

        token = api.service_account_token("seedance-node", "node-agent", node=MINE)
        async with api_client(api, tmp_path / "agent", token) as agent:
            # What the agent does (mig_manager: the layout mig-manager is to apply).
            await ThisNode(agent, MINE).set_labels({MIG_CONFIG_LABEL: "seedance-0123abcd"})
            assert labels_of(api, MINE)[MIG_CONFIG_LABEL] == "seedance-0123abcd"

            # Another node: its layout, its labels.
            body = await refused(ThisNode(agent, OTHER).set_labels({MIG_CONFIG_LABEL: "x"}))
            assert "the node agent may update only its own node" in body
            assert OTHER in body
            assert labels_of(api, OTHER)[MIG_CONFIG_LABEL] == "all-enabled"

            core = client.CoreV1Api(agent)
            # Its own node, but anything else than that label.
            for patch in (
                {"metadata": {"labels": {"zone": "b"}}},  # changed
                {"metadata": {"labels": {"zone": None}}},  # removed
                {"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}},  # added
            ):
                body = await refused(core.patch_node(MINE, patch, _content_type=MERGE))
                assert "only its node's nvidia.com/mig.config label" in body
            for patch in (
                {"spec": {"unschedulable": True}},
                {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
                {"metadata": {"annotations": {"a": "b"}}},
            ):
                body = await refused(core.patch_node(MINE, patch, _content_type=MERGE))
                assert "not its annotations, finalizers, owner references or spec" in body
            node = api.api.get(api.api.resolve("", "v1", "nodes"), "", MINE)
            assert labels_of(api, MINE)["zone"] == "a"
            assert "unschedulable" not in node["spec"]
            assert "taints" not in node["spec"]

        # A token of the ServiceAccount bound to no pod (no node in its extra): no Node update.
        unbound = api.service_account_token("seedance-node", "node-agent")
        async with api_client(api, tmp_path / "unbound", unbound) as agent:
            body = await refused(ThisNode(agent, MINE).set_labels({MIG_CONFIG_LABEL: "y"}))
            assert "may update only its own node" in body

        # Nobody else is held by it: the bridge cordons and taints nodes (its RBAC).
        bridge = api.service_account_token("seedance-system", "k8s-bridge")
        async with api_client(api, tmp_path / "bridge", bridge) as other:
            await client.CoreV1Api(other).patch_node(
                OTHER, {"spec": {"unschedulable": True}}, _content_type=MERGE
            )
        assert api.api.get(api.api.resolve("", "v1", "nodes"), "", OTHER)["spec"]["unschedulable"]
