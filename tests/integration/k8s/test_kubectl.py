"""The pinned kubectl (``.venv/bin/kubectl``) against the test API server: ``apply -k`` of each
overlay on a cluster without KEDA's CRD (it must exit 0: KEDA is a component), of an overlay
with the KEDA component once its CRD is there, and of the dev overlay twice (create, then the
three-way patch path); ``get``, ``describe`` with the pod's Events, ``delete``. kubectl runs as
a subprocess with a kubeconfig the server wrote and a throw-away cache directory."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import yaml

from seedance.testing.kube_api import KubeApiServer, seed
from seedance.testing.kube_api.selectors import Selector
from seedance.testing.paths import REPO

KUBECTL = Path(sys.executable).parent / "kubectl"
K8S = REPO / "deploy" / "k8s"
#: KEDA's CRD, as a cluster running KEDA has it (the keda component's ScaledObject needs it).
#: Only its names and one printer column matter here (the schema keeps every field).
KEDA_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "scaledobjects.keda.sh"},
    "spec": {
        "group": "keda.sh",
        "scope": "Namespaced",
        "names": {
            "plural": "scaledobjects",
            "singular": "scaledobject",
            "kind": "ScaledObject",
            "shortNames": ["so"],
        },
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicaCount"}
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


async def kubectl(api: KubeApiServer, tmp: Path, *args: str) -> tuple[int, str]:
    config = api.kubeconfig(tmp / "kubeconfig")
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(config),
        "--cache-dir",
        str(tmp / "kube-cache"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=90)
    return proc.returncode or 0, out.decode()


def _names(api: KubeApiServer, group: str, version: str, plural: str) -> list[str]:
    rt = api.api.resolve(group, version, plural)
    return sorted(o["metadata"]["name"] for o in api.api.select(rt, None, Selector()))


def with_components(tmp: Path, overlay: str, *components: str) -> Path:
    """A kustomization adding ``components`` to ``overlay``, as deploy/k8s's overlays tell a
    user to (kustomize wants the paths relative to it)."""
    root = tmp / f"{overlay}-{'-'.join(components)}"
    root.mkdir()
    (root / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(K8S / "overlays" / overlay, root)],
                "components": [os.path.relpath(K8S / "components" / c, root) for c in components],
            }
        )
    )
    return root


@pytest.mark.parametrize("overlay", ["dev", "prod"])
async def test_each_overlay_applies_on_a_cluster_without_keda(
    kube_api: KubeApiServer, tmp_path: Path, overlay: str
) -> None:
    code, out = await kubectl(kube_api, tmp_path, "apply", "-k", str(K8S / "overlays" / overlay))
    assert code == 0, out
    assert "deployment.apps/graph-compiler created" in out
    assert "daemonset.apps/node-agent created" in out
    assert "keda.sh" not in out
    namespaces = {
        n: kube_api.api.get(kube_api.api.resolve("", "v1", "namespaces"), "", n)
        for n in ("seedance-system", "seedance-node")
    }
    labels = {n: ns["metadata"]["labels"] for n, ns in namespaces.items()}
    assert labels["seedance-system"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["seedance-node"]["pod-security.kubernetes.io/enforce"] == "privileged"
    ds = kube_api.api.get(
        kube_api.api.resolve("apps", "v1", "daemonsets"), "seedance-node", "node-agent"
    )
    assert ds["metadata"]["namespace"] == "seedance-node"


async def test_an_overlay_with_the_keda_component_applies_once_kedas_crd_is_there(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    root = with_components(tmp_path, "prod", "keda")
    code, out = await kubectl(kube_api, tmp_path, "apply", "-k", str(root))
    # Without the CRD the component cannot be applied (kubectl exits non-zero; this server's
    # words for it are not the real one's: docs/k8s-test-api-server.md): why it is optional.
    assert code != 0
    assert "scaledobject" not in out
    seed.create(kube_api, "apiextensions.k8s.io", "v1", "customresourcedefinitions", KEDA_CRD)
    code, out = await kubectl(kube_api, tmp_path, "apply", "-k", str(root))
    assert code == 0, out
    assert "scaledobject.keda.sh/graph-compiler created" in out
    assert _names(kube_api, "keda.sh", "v1alpha1", "scaledobjects") == ["graph-compiler"]


async def test_kubectl_applies_the_dev_overlay_twice(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    code, out = await kubectl(kube_api, tmp_path, "apply", "-k", str(K8S / "overlays" / "dev"))
    assert code == 0, out
    assert "deployment.apps/router created" in out
    assert _names(kube_api, "apps", "v1", "deployments") == [
        "auth-callout",
        "cost-ledger",
        "grafana",
        "graph-compiler",
        "k8s-bridge",
        "router",
        "slicer",
    ]
    # The dev cluster's GPUs are the node agents' simulated ones: no collector replays a fleet.
    assert _names(kube_api, "apps", "v1", "daemonsets") == ["node-agent"]
    assert "nats" in _names(kube_api, "apps", "v1", "statefulsets")
    assert {"seedance-system", "seedance-node"} <= set(_names(kube_api, "", "v1", "namespaces"))
    crds = _names(kube_api, "apiextensions.k8s.io", "v1", "customresourcedefinitions")
    assert {"slicingpolicies.seedance.io", "tenantquotas.seedance.io"} <= set(crds)
    rv = kube_api.store.rv
    code, out = await kubectl(kube_api, tmp_path, "apply", "-k", str(K8S / "overlays" / "dev"))
    assert code == 0, out
    assert "deployment.apps/router unchanged" in out
    # The second apply read each deployment and found nothing to patch.
    assert {r.verb for r in kube_api.audit if r.resource == "deployments"} == {"get", "create"}
    router = kube_api.api.get(
        kube_api.api.resolve("apps", "v1", "deployments"), "seedance-system", "router"
    )
    assert int(router["metadata"]["resourceVersion"]) <= rv  # unchanged: no write at all
    assert "kubectl.kubernetes.io/last-applied-configuration" in router["metadata"]["annotations"]


async def test_kubectl_get_and_describe_show_a_pod_and_its_events(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    seed.namespace(kube_api, "tenants")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "train-1", "namespace": "tenants", "labels": {"app": "train"}},
                "spec": {
                    "schedulerName": "seedance",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/job:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
        )
    )
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "pod/train-1 created")
    pod = kube_api.api.get(kube_api.api.resolve("", "v1", "pods"), "tenants", "train-1")
    seed.create(
        kube_api,
        "",
        "v1",
        "events",
        {
            "metadata": {"name": "train-1.1", "namespace": "tenants"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": "tenants",
                "name": "train-1",
                "uid": pod["metadata"]["uid"],
                "apiVersion": "v1",
            },
            "reason": "Unschedulable",
            "type": "Warning",
            "message": "no MIG slice fits",
            "source": {"component": "seedance"},
            "count": 1,
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:00:00Z",
        },
        "tenants",
    )
    code, out = await kubectl(kube_api, tmp_path, "get", "pods", "-n", "tenants")
    assert code == 0, out
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert row.split()[:4] == ["train-1", "0/1", "Pending", "0"]
    code, out = await kubectl(kube_api, tmp_path, "describe", "pod", "train-1", "-n", "tenants")
    assert code == 0, out
    assert "nvidia.com/gpu:  1" in out
    events = out.split("Events:", 1)[1]
    assert "Unschedulable" in events
    assert "no MIG slice fits" in events
    code, out = await kubectl(kube_api, tmp_path, "delete", "pod", "train-1", "-n", "tenants")
    assert code == 0, out
    code, out = await kubectl(kube_api, tmp_path, "get", "pods", "-n", "tenants")
    assert "No resources found" in out


async def test_kubectl_apply_of_an_invalid_manifest_names_the_field(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "c"},
                "data": {"a": "b"},
                "dta": {"typo": "x"},
            }
        )
    )
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(manifest))
    assert code != 0
    assert "dta" in out
    assert _names(kube_api, "", "v1", "configmaps") == []


async def test_kubectl_create_and_custom_resources_by_short_name(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    ns = tmp_path / "ns.yaml"
    ns.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tenants"}})
    )
    code, out = await kubectl(kube_api, tmp_path, "create", "-f", str(ns))
    assert (code, out.strip()) == (0, "namespace/tenants created")
    code, out = await kubectl(kube_api, tmp_path, "create", "-f", str(ns))
    assert code != 0
    assert "AlreadyExists" in out
    # The generator subcommands post protobuf, which this server does not decode (415).
    code, out = await kubectl(kube_api, tmp_path, "create", "namespace", "other")
    assert code != 0
    assert "UnsupportedMediaType" in out
    seed.create(kube_api, "apiextensions.k8s.io", "v1", "customresourcedefinitions", KEDA_CRD)
    manifest = tmp_path / "so.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "router", "namespace": "tenants"},
                "spec": {"scaleTargetRef": {"name": "router"}, "maxReplicaCount": 4},
            }
        )
    )
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "scaledobject.keda.sh/router created")
    code, out = await kubectl(kube_api, tmp_path, "get", "so", "-n", "tenants", "-o", "name")
    assert (code, out.strip()) == (0, "scaledobject.keda.sh/router")
    code, out = await kubectl(kube_api, tmp_path, "get", "so", "-n", "tenants")
    assert [line.split() for line in out.strip().splitlines()] == [["NAME", "MAX"], ["router", "4"]]
    manifest.write_text(manifest.read_text().replace("maxReplicaCount: 4", "maxReplicaCount: 8"))
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(manifest))
    assert (code, out.strip()) == (0, "scaledobject.keda.sh/router configured")
    rt = kube_api.api.resolve("keda.sh", "v1alpha1", "scaledobjects")
    stored = kube_api.api.get(rt, "tenants", "router")
    assert (stored["spec"]["maxReplicaCount"], stored["metadata"]["generation"]) == (8, 2)
