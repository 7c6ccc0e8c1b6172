"""Seedance's CRDs with the pinned kubectl against the test API server: `apply -f` of the CRD
folder and of the examples, the printer columns and short names, every invalid example refused
by the server's CEL evaluation with its rule's message (the tenant rename on update), and the
reconciler's statuses written through the /status subresource and shown by `kubectl get`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from seedance.k8s_bridge.core.policy import GROUP, VERSION, reconcile
from seedance.testing.kube_api import KubeApiServer
from seedance.testing.paths import REPO
from tests.integration.k8s.test_kubectl import _names, kubectl

CRDS = REPO / "deploy" / "k8s" / "crds"
EXAMPLES = REPO / "deploy" / "k8s" / "examples"
PLURALS = {"TenantQuota": "tenantquotas", "SlicingPolicy": "slicingpolicies"}


async def install(api: KubeApiServer, tmp: Path) -> None:
    code, out = await kubectl(api, tmp, "apply", "-f", str(CRDS))
    assert code == 0, out
    assert sorted(out.strip().splitlines()) == [
        "customresourcedefinition.apiextensions.k8s.io/slicingpolicies.seedance.io created",
        "customresourcedefinition.apiextensions.k8s.io/tenantquotas.seedance.io created",
    ]


async def test_the_crds_install_with_apply_f_and_the_examples_show_in_kubectl_get(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    await install(kube_api, tmp_path)
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(EXAMPLES))
    assert code == 0, out
    assert "tenantquota.seedance.io/team-a created" in out
    assert "slicingpolicy.seedance.io/default created" in out
    assert _names(kube_api, GROUP, VERSION, "tenantquotas") == ["acme", "team-a", "team-b"]
    code, out = await kubectl(kube_api, tmp_path, "get", "tq")
    assert code == 0, out
    header, *rows = out.strip().splitlines()
    assert header.split() == ["NAME", "TENANT", "COHORT", "GPUS", "USED", "READY", "REASON", "AGE"]
    assert rows[1].split()[:4] == ["team-a", "team-a", "research", "8"]
    code, out = await kubectl(kube_api, tmp_path, "get", "slicingpolicies")
    assert code == 0, out
    assert out.split()[:5] == ["NAME", "PLACEMENT", "MIG", "MIG-DEFAULT", "READY"]


async def test_every_invalid_example_is_refused_by_the_server_with_its_rules_message(
    kube_api: KubeApiServer, tmp_path: Path
) -> None:
    await install(kube_api, tmp_path)
    for path in sorted((EXAMPLES / "invalid").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        refused = docs[-1]
        message = refused["metadata"]["annotations"]["seedance.io/example-violates"]
        if len(docs) == 2:  # an update: create the old object first
            old = tmp_path / f"{path.stem}-old.yaml"
            old.write_text(yaml.safe_dump(docs[0]))
            code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(old))
            assert code == 0, out
        new = tmp_path / f"{path.stem}.yaml"
        new.write_text(yaml.safe_dump(refused))
        code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(new))
        assert code != 0, (path.stem, out)
        assert message in out, (path.stem, out)
    # only the old object of the update was stored
    assert _names(kube_api, GROUP, VERSION, "tenantquotas") == ["team-c"]
    assert _names(kube_api, GROUP, VERSION, "slicingpolicies") == []


async def test_the_reconcilers_statuses_pass_the_status_schema_and_show_in_kubectl(
    kube_api: KubeApiServer, k8s: client.ApiClient, tmp_path: Path
) -> None:
    await install(kube_api, tmp_path)
    code, out = await kubectl(kube_api, tmp_path, "apply", "-f", str(EXAMPLES))
    assert code == 0, out
    crs = client.CustomObjectsApi(k8s)
    listed: dict[str, list[dict[str, Any]]] = {}
    for kind, plural in PLURALS.items():
        listed[kind] = (await crs.list_cluster_custom_object(GROUP, VERSION, plural))["items"]
    out_ = reconcile(
        listed["SlicingPolicy"],
        listed["TenantQuota"],
        priority_classes={"seedance-high": 1000, "seedance-normal": 100},
        usage={"team-a": {"gpus": 9, "mig/1g.10gb": 2}},
        observed_at="2026-12-02T01:00:00Z",
    )
    for (kind, name), status in out_.statuses.items():
        await crs.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            PLURALS[kind],
            name,
            {"status": dict(status)},
            _content_type="application/merge-patch+json",  # its default is a JSON patch
        )
    code, out = await kubectl(kube_api, tmp_path, "get", "tq", "team-a")
    assert code == 0, out
    row = out.strip().splitlines()[1].split()
    assert row[:7] == ["team-a", "team-a", "research", "8", "9", "True", "InForce"]
    stored = await crs.get_cluster_custom_object(GROUP, VERSION, "tenantquotas", "team-a")
    assert stored["status"]["usage"] == {"gpus": 9, "mig": {"1g.10gb": 2}}
    assert stored["status"]["borrowed"] == {"gpus": 1}  # 9 of 8; the MIG 2 of 7 is its own
    assert stored["spec"]["quota"]["gpus"] == 8  # the status write left the spec alone
    code, out = await kubectl(kube_api, tmp_path, "describe", "tq", "team-b")
    assert code == 0, out
    assert "InForce" in out
