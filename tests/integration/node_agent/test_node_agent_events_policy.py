"""The base's admission policy on the node agents' Events (deploy/k8s/base/admission/
node-agent-events.yaml): their `create events` (one ServiceAccount on every node, any
namespace) is held to what the agent posts, a Warning on a pod naming its own node as the
source. The test API server enforces the shipped policy (CEL by cel-python); the agent's own
adapter (``NodePods.warn``) posts the allowed Event with a pod-bound token on its node."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.node_agent.kube import NodePods
from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.kube_api.selectors import Selector
from seedance.testing.paths import REPO
from tests.integration.node_agent.test_node_label_policy import api_client, refused

pytestmark = pytest.mark.integration

POLICY = REPO / "deploy" / "k8s" / "base" / "admission" / "node-agent-events.yaml"
MINE, OTHER = "gpu-1.example", "gpu-2.example"
AT = datetime(2026, 12, 7, 16, 0, tzinfo=UTC)


def event(name: str, *, kind: str = "Pod", type_: str = "Warning", host: str = MINE) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "team-b"},
        "involvedObject": {"kind": kind, "namespace": "team-b", "name": "p"},
        "reason": "SeedanceDevicesRefused",
        "message": "m",
        "type": type_,
        "source": {"component": "seedance-node-agent", "host": host},
        "reportingComponent": "seedance-node-agent",
        "reportingInstance": host,
    }


async def test_the_node_agent_posts_only_warnings_on_pods_from_its_own_node(
    tmp_path: Path,
) -> None:
    async with KubeApiServer(KubeApiSettings()) as api:
        seed.namespace(api, "team-b")
        async with api_client(api, tmp_path / "admin", "seedance-test") as admin:
            admission = client.AdmissionregistrationV1Api(admin)
            policy, binding = yaml.safe_load_all(POLICY.read_text())
            await admission.create_validating_admission_policy(policy)
            await admission.create_validating_admission_policy_binding(binding)

        token = api.service_account_token("seedance-node", "node-agent", node=MINE)
        async with api_client(api, tmp_path / "agent", token) as agent:
            # What the agent posts (a container start it refused).
            await NodePods(agent, MINE).warn("team-b", "p", "SeedanceDevicesRefused", "why", AT)
            core = client.CoreV1Api(agent)
            for body, says in (
                (event("on-a-node", kind="Node"), "only Warning Events on pods"),
                (event("normal", type_="Normal"), "only Warning Events on pods"),
                (event("as-another-node", host=OTHER), "name its own node"),
            ):
                assert says in await refused(core.create_namespaced_event("team-b", body))
            forged = event("instance-differs")
            forged["reportingInstance"] = OTHER
            assert "name its own node" in await refused(
                core.create_namespaced_event("team-b", forged)
            )

        unbound = api.service_account_token("seedance-node", "node-agent")
        async with api_client(api, tmp_path / "unbound", unbound) as agent:
            assert "name its own node" in await refused(
                client.CoreV1Api(agent).create_namespaced_event("team-b", event("unbound"))
            )

        # The bridge's Events (Scheduled, FailedScheduling, ...) are not the policy's.
        bridge = api.service_account_token("seedance-system", "k8s-bridge")
        async with api_client(api, tmp_path / "bridge", bridge) as other:
            await client.CoreV1Api(other).create_namespaced_event(
                "team-b", event("bridge", type_="Normal", host="")
            )
        events = api.api.select(api.api.resolve("", "v1", "events"), "team-b", Selector())
        reasons = sorted(e["metadata"]["name"].split(".")[0] for e in events)
        assert reasons == ["bridge", "p"]


async def test_an_api_refusal_is_raised_to_the_caller_not_swallowed(tmp_path: Path) -> None:
    """The agent's caller logs a refused Event and goes on (allocator); NodePods raises it."""
    async with KubeApiServer(KubeApiSettings()) as api:
        seed.namespace(api, "team-b")
        async with api_client(api, tmp_path / "admin", "seedance-test") as admin:
            admission = client.AdmissionregistrationV1Api(admin)
            policy, binding = yaml.safe_load_all(POLICY.read_text())
            await admission.create_validating_admission_policy(policy)
            await admission.create_validating_admission_policy_binding(binding)
        unbound = api.service_account_token("seedance-node", "node-agent")
        async with api_client(api, tmp_path / "agent", unbound) as agent:
            with pytest.raises(ApiException) as err:
                await NodePods(agent, MINE).warn("team-b", "p", "R", "why", AT)
            assert err.value.status == 403
