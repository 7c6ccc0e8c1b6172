"""The Kubernetes install in the brief's shape: namespace seedance-system, the CRDs (also on
their own with `kubectl apply -f deploy/k8s/crds/`), the controller (k8s-bridge and the slicer
it feeds) with RBAC, and the dashboard (Grafana with the compose boards, generated, not copied).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from seedance.k8s_bridge import rbac
from tests.unit.deploy.declared import DEPLOY
from tests.unit.deploy.test_crds import PRIORITY_CLASSES, valid_examples
from tests.unit.deploy.test_k8s import KUBECTL, OVERLAYS, by_kind, errors_of, render, workloads

K8S = DEPLOY / "k8s"
GRAFANA = DEPLOY / "compose" / "grafana"

#: Issue #14's list of what the bridge does on the API, as (apiGroup, resource) -> verbs; plus
#: namespaces (list/watch: a namespace's seedance.io/tenant label, as the bridge reads it) and
#: events.k8s.io (the newer Events API, same verbs). The integrator's test derives the
#: ClusterRole from seedance.k8s_bridge.rbac.RULES instead.
#: What the bridge's ClusterRole must grant: its one declaration of the calls it makes.
EXPECTED_RULES = {(rule.api_group, rule.resource): set(rule.verbs) for rule in rbac.RULES.values()}


def kustomize(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_the_crd_folder_installs_alike_with_apply_k_and_apply_f() -> None:
    """`apply -f` reads every *.yaml/*.yml/*.json of the folder; the kustomization is named
    `Kustomization` so that it is not among them, and `-k` renders the same objects."""
    files = [p for p in (K8S / "crds").iterdir() if p.suffix in (".yaml", ".yml", ".json")]
    by_f = [d for p in sorted(files) for d in yaml.safe_load_all(p.read_text()) if d]
    assert {d["kind"] for d in by_f} == {"CustomResourceDefinition"}
    assert (K8S / "crds" / "Kustomization").exists()
    key = lambda d: d["metadata"]["name"]  # noqa: E731
    assert sorted(kustomize(K8S / "crds"), key=key) == sorted(by_f, key=key)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_installs_the_crds_the_bridge_and_the_dashboard(overlay: str) -> None:
    docs = render(overlay)
    assert set(by_kind(docs, "Namespace")) == {"seedance-system"}
    crds = by_kind(docs, "CustomResourceDefinition")
    assert set(crds) == {"slicingpolicies.seedance.io", "tenantquotas.seedance.io"}
    on_disk = {d["metadata"]["name"]: d for d in kustomize(K8S / "crds")}
    assert {n: {**c, "metadata": on_disk[n]["metadata"]} for n, c in crds.items()} == on_disk
    assert {"k8s-bridge", "slicer", "grafana"} <= set(workloads(docs))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_bridge_runs_as_its_service_account_bound_to_exactly_the_listed_verbs(
    overlay: str,
) -> None:
    docs = render(overlay)
    pod = workloads(docs)["k8s-bridge"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "k8s-bridge"
    assert pod["automountServiceAccountToken"] is True  # it calls the API
    # The node agent is the other API caller (list pods on its node: test_k8s.py checks it).
    callers = {"k8s-bridge", "node-agent"}
    others = [n for n, w in workloads(docs).items() if n not in callers]
    for name in others:
        assert w_spec(docs, name).get("automountServiceAccountToken") is False, name
    roles = {
        b["roleRef"]["name"]: b
        for b in by_kind(docs, "ClusterRoleBinding").values()
        if b["subjects"][0]["name"] == "k8s-bridge"
    }
    (role,) = [r for r in by_kind(docs, "ClusterRole").values() if r["metadata"]["name"] in roles]
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                granted.setdefault((group, res), set()).update(rule["verbs"])
        assert "*" not in rule["verbs"]
        assert "*" not in rule["resources"]
    assert granted == EXPECTED_RULES
    binding = roles[role["metadata"]["name"]]
    namespace = workloads(docs)["k8s-bridge"]["metadata"]["namespace"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "k8s-bridge", "namespace": namespace}
    ]
    assert not by_kind(docs, "Role")  # nothing else may call the API


def w_spec(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    spec: dict[str, Any] = workloads(docs)[name]["spec"]["template"]["spec"]
    return spec


def test_the_priority_classes_the_examples_name_are_installed() -> None:
    classes = by_kind(render("dev"), "PriorityClass")
    assert {n: c["value"] for n, c in classes.items()} == PRIORITY_CLASSES
    assert all(c["preemptionPolicy"] == "Never" for c in classes.values())
    named = {
        v
        for d in valid_examples()
        if d["kind"] == "TenantQuota"
        for k in ("defaultPriority", "maxPriority")
        if isinstance(v := d["spec"].get(k), str)
    }
    assert named
    assert named <= set(classes)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_dashboard_serves_the_compose_boards_generated_from_their_files(overlay: str) -> None:
    docs = render(overlay)
    maps = {n.rsplit("-", 1)[0]: m for n, m in by_kind(docs, "ConfigMap").items()}
    boards = maps["grafana-dashboards"]["data"]
    files = sorted((GRAFANA / "dashboards").glob("*.json"))
    assert sorted(boards) == [p.name for p in files]
    for path in files:
        assert boards[path.name] == path.read_text()  # byte for byte: generated, not copied
        json.loads(boards[path.name])
    provider_text = (GRAFANA / "provisioning" / "dashboards" / "seedance.yaml").read_text()
    assert maps["grafana-dashboard-provider"]["data"] == {"seedance.yaml": provider_text}
    (provider,) = yaml.safe_load(provider_text)["providers"]
    pod = w_spec(docs, "grafana")
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
    assert mounts["dashboards"] == provider["options"]["path"]
    assert volumes["dashboards"] == maps["grafana-dashboards"]["metadata"]["name"]
    assert mounts["datasource"] == "/etc/grafana/provisioning/datasources"
    (source,) = yaml.safe_load(maps["grafana-datasource"]["data"]["datasource.yaml"])["datasources"]
    compose = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"][0]
    assert {k: v for k, v in source.items() if k != "url"} == {
        k: v for k, v in compose.items() if k != "url"
    }
    image = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())["services"][
        "grafana"
    ]["image"]
    assert container["image"] == image


def test_the_dashboard_installs_on_its_own_in_seedance_system() -> None:
    docs = kustomize(K8S / "dashboard")
    assert {d["kind"] for d in docs} == {
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    }
    assert {d["metadata"]["namespace"] for d in docs} == {"seedance-system"}
    assert all(errors_of(d) == [] for d in docs)
