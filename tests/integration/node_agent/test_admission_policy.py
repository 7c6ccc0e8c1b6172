"""The admission policy shipped with the manifests (deploy/k8s/base/admission) refuses a pod
created with spec.nodeName preset that asks for the GPU resources Seedance serves, before it
reaches a kubelet, unless the bridge's service account creates it. The test API server
enforces the shipped ValidatingAdmissionPolicy and its binding as the real one does (their
CEL by cel-python, the objects checked against the Kubernetes 1.33 schemas), and each request
goes over HTTP as a user its bearer token names."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from seedance.testing.kube_api import KubeApiServer, KubeApiSettings, seed
from seedance.testing.paths import REPO

pytestmark = pytest.mark.integration

POLICY = REPO / "deploy" / "k8s" / "base" / "admission" / "pods-bound-by-seedance.yaml"
NODE = "gpu-1.example"


@contextlib.asynccontextmanager
async def as_user(api: KubeApiServer, path: Path, token: str) -> AsyncIterator[client.CoreV1Api]:
    cfg = client.Configuration()
    await config.load_kube_config(
        config_file=str(api.kubeconfig(path, token=token)), client_configuration=cfg
    )
    async with client.ApiClient(configuration=cfg) as api_client:
        yield client.CoreV1Api(api_client)


def gpu_pod(name: str, resources: dict[str, str], *, node: str | None, init: bool = False) -> Any:
    container = {
        "name": "main",
        "image": "registry.example/job:1",
        "resources": {"limits": resources, "requests": resources},
    }
    spec: dict[str, Any] = {"schedulerName": "seedance", "containers": [container]}
    if init:
        plain = {"name": "main", "image": "registry.example/job:1"}
        spec = {**spec, "containers": [plain], "initContainers": [container]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def refusal(core: client.CoreV1Api, ns: str, body: Any) -> ApiException:
    with pytest.raises(ApiException) as err:
        await core.create_namespaced_pod(ns, body)
    return err.value


async def test_the_shipped_policy_refuses_a_gpu_pod_with_its_node_preset(tmp_path: Path) -> None:
    async with KubeApiServer(KubeApiSettings()) as api:
        seed.namespace(api, "team-b")
        seed.node(api, NODE, gpus=4)
        async with as_user(api, tmp_path / "admin", "seedance-test") as admin:
            admission = client.AdmissionregistrationV1Api(admin.api_client)
            policy, binding = yaml.safe_load_all(POLICY.read_text())
            # The objects are checked against the real schemas: a misspelt field is refused.
            bad = {**binding, "metadata": {"name": "typo"}, "spec": {**binding["spec"]}}
            bad["spec"]["validationAction"] = bad["spec"].pop("validationActions")
            with pytest.raises(ApiException) as typo:
                await admission.create_validating_admission_policy_binding(bad)
            assert typo.value.status == 422
            assert "spec.validationAction" in str(typo.value.body)
            await admission.create_validating_admission_policy(policy)
            await admission.create_validating_admission_policy_binding(binding)

        tenant = api.service_account_token("team-b", "default")
        async with as_user(api, tmp_path / "tenant", tenant) as core:
            for name, resources, init in (
                ("r", {"nvidia.com/gpu": "1"}, False),
                ("m", {"nvidia.com/mig-3g.71gb": "1"}, False),
                ("s", {"seedance.io/gpu-milli": "250"}, True),  # in an init container too
            ):
                err = await refusal(core, "team-b", gpu_pod(name, resources, node=NODE, init=init))
                assert err.status == 403
                assert (
                    "ValidatingAdmissionPolicy 'seedance-pods-bound-by-seedance' with binding "
                    "'seedance-pods-bound-by-seedance' denied request: "
                    f"pod {name} asks for GPU resources Seedance serves with spec.nodeName "
                    f"{NODE} preset"
                ) in str(err.body)
            names = [p.metadata.name for p in (await core.list_namespaced_pod("team-b")).items]
            assert names == []
            # The same pod left for the scheduler, and a pod on the node asking for no GPU
            # resource of Seedance's, are created.
            await core.create_namespaced_pod(
                "team-b", gpu_pod("w", {"nvidia.com/gpu": "1"}, node=None)
            )
            await core.create_namespaced_pod("team-b", gpu_pod("c", {"cpu": "1"}, node=NODE))

        # The bridge's own service account is not stood in the way of.
        bridge = api.service_account_token("seedance-system", "k8s-bridge")
        async with as_user(api, tmp_path / "bridge", bridge) as core:
            await core.create_namespaced_pod(
                "team-b", gpu_pod("b", {"nvidia.com/gpu": "1"}, node=NODE)
            )

        # A token the server does not know is refused before anything else.
        async with as_user(api, tmp_path / "stranger", "not-a-token") as core:
            err = await refusal(core, "team-b", gpu_pod("x", {"cpu": "1"}, node=None))
            assert err.status == 401


SCHEDULED = REPO / "deploy" / "k8s" / "base" / "admission" / "pods-scheduled-by-seedance.yaml"


def scheduled_pod(name: str, resources: dict[str, str], scheduler: str | None) -> Any:
    body = gpu_pod(name, resources, node=None)
    if scheduler is None:
        del body["spec"]["schedulerName"]
    else:
        body["spec"]["schedulerName"] = scheduler
    return body


async def test_the_shipped_policy_refuses_a_gpu_pod_left_to_another_scheduler(
    tmp_path: Path,
) -> None:
    """A pod asking for what the node agent serves must name Seedance's scheduler, or the
    default scheduler could put it on a node whose agent has no placement for it; in a
    namespace the operator labels ``seedance.io/gpu-scheduler=default`` (other GPU nodes keep
    NVIDIA's device plugin) only seedance.io/* still needs it."""
    async with KubeApiServer(KubeApiSettings()) as api:
        seed.namespace(api, "team-b")
        seed.namespace(api, "mixed", labels={"seedance.io/gpu-scheduler": "default"})
        async with as_user(api, tmp_path / "admin", "seedance-test") as admin:
            admission = client.AdmissionregistrationV1Api(admin.api_client)
            policy, binding = yaml.safe_load_all(SCHEDULED.read_text())
            await admission.create_validating_admission_policy(policy)
            await admission.create_validating_admission_policy_binding(binding)

        tenant = api.service_account_token("team-b", "default")
        async with as_user(api, tmp_path / "tenant", tenant) as core:
            for name, resources, scheduler in (
                ("d", {"nvidia.com/gpu": "1"}, None),
                ("k", {"nvidia.com/mig-1g.10gb": "1"}, "default-scheduler"),
                ("v", {"seedance.io/gpu-milli": "500"}, "volcano"),
            ):
                err = await refusal(core, "team-b", scheduled_pod(name, resources, scheduler))
                assert err.status == 403, name
                shown = scheduler or "default-scheduler"
                assert (
                    "ValidatingAdmissionPolicy 'seedance-pods-scheduled-by-seedance' with "
                    "binding 'seedance-pods-scheduled-by-seedance' denied request: "
                    f"pod {name} asks for GPU resources Seedance serves but names scheduler "
                    f"{shown}"
                ) in str(err.body)
            assert (await core.list_namespaced_pod("team-b")).items == []
            # Seedance's scheduler, or no resource of Seedance's: created.
            await core.create_namespaced_pod(
                "team-b", scheduled_pod("s", {"nvidia.com/gpu": "1"}, "seedance")
            )
            await core.create_namespaced_pod("team-b", scheduled_pod("c", {"cpu": "1"}, None))

        other = api.service_account_token("mixed", "default")
        async with as_user(api, tmp_path / "mixed", other) as core:
            # The install mode beside NVIDIA's device plugin: nvidia.com/* goes to the default
            # scheduler there; seedance.io/* exists only on Seedance's nodes.
            await core.create_namespaced_pod(
                "mixed", scheduled_pod("n", {"nvidia.com/gpu": "1"}, None)
            )
            err = await refusal(
                core, "mixed", scheduled_pod("m", {"seedance.io/gpu-milli": "1"}, None)
            )
            assert err.status == 403
