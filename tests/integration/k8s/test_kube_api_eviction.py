"""The test API server's eviction subresource over HTTP, through kubernetes_asyncio as a
client sees it: a PodDisruptionBudget (created and validated through policy/v1) refuses with
the real server's 429 Status and its DisruptionBudget cause; a uid precondition that does not
match is a 409; once the budget allows it the pod goes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.testing.kube_api import KubeApiServer, seed

NS = "evict"


def eviction(name: str, uid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": NS},
    }
    if uid is not None:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


async def running(core: client.CoreV1Api, name: str) -> None:
    body = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    await core.patch_namespaced_pod_status(name, NS, body)


async def test_a_pdb_refuses_an_eviction_with_the_real_servers_status(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    core, policy = client.CoreV1Api(k8s), client.PolicyV1Api(k8s)
    for name in ("web-0", "web-1"):
        seed.pod(kube_api, NS, name, labels={"app": "web"})
        await running(core, name)
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "web"}}},
    }
    await policy.create_namespaced_pod_disruption_budget(NS, pdb)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod_eviction("web-0", NS, eviction("web-0"))
    status = json.loads(refused.value.body)
    assert refused.value.status == 429
    assert (status["kind"], status["reason"]) == ("Status", "TooManyRequests")
    assert status["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    (cause,) = status["details"]["causes"]
    assert cause == {
        "reason": "DisruptionBudget",
        "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
        "field": "",
    }
    assert {p.metadata.name for p in (await core.list_namespaced_pod(NS)).items} == {
        "web-0",
        "web-1",
    }
    # A stale uid is refused before any budget is read.
    with pytest.raises(ApiException) as stale:
        await core.create_namespaced_pod_eviction("web-0", NS, eviction("web-0", uid="not-it"))
    assert stale.value.status == 409
    # The budget allows one: the pod goes.
    await policy.patch_namespaced_pod_disruption_budget("web", NS, {"spec": {"maxUnavailable": 1}})
    uid = (await core.read_namespaced_pod("web-0", NS)).metadata.uid
    await core.create_namespaced_pod_eviction("web-0", NS, eviction("web-0", uid=uid))
    assert [p.metadata.name for p in (await core.list_namespaced_pod(NS)).items] == ["web-1"]


async def test_an_invalid_budget_is_refused_by_its_schema(
    kube_api: KubeApiServer, k8s: client.ApiClient
) -> None:
    seed.namespace(kube_api, NS)
    policy = client.PolicyV1Api(k8s)
    bad = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "bad"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": "app=web"}},
    }
    with pytest.raises(ApiException) as invalid:
        await policy.create_namespaced_pod_disruption_budget(NS, bad)
    assert invalid.value.status in (400, 422)
