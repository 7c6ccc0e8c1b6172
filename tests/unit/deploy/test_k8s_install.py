"""The Kubernetes install in the brief's shape: namespace seedance-system, the CRDs (also on
their own with `kubectl apply -f deploy/k8s/crds/`), the controller (k8s-bridge and the slicer
it feeds) with RBAC, and the dashboard (Grafana with the compose boards, generated, not copied).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from seedance.k8s_bridge import rbac
from tests.unit.deploy.declared import DEPLOY
from tests.unit.deploy.test_crds import PRIORITY_CLASSES, valid_examples
from tests.unit.deploy.test_k8s import (
    KUBECTL,
    NODE_NAMESPACE,
    OVERLAYS,
    by_kind,
    errors_of,
    render,
    workloads,
)

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
    assert set(by_kind(docs, "Namespace")) == {"seedance-system", NODE_NAMESPACE}
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
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    }
    assert {d["metadata"]["namespace"] for d in docs} == {"seedance-system"}
    assert all(errors_of(d) == [] for d in docs)


# --- install friction: Pod Security, optional components, the dev cluster, RBAC, policies ----


def _pod_specs(docs: tuple[dict[str, Any], ...]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (w["metadata"]["namespace"], n): w["spec"]["template"]["spec"]
        for n, w in workloads(docs).items()
    }


#: Volume types Pod Security's `restricted` profile allows (the Kubernetes documentation's list).
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def _container_violations(c: dict[str, Any], pod_sc: dict[str, Any]) -> list[str]:
    sc = c.get("securityContext") or {}
    caps = sc.get("capabilities") or {}
    seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
    checks = {
        "privileged": bool(sc.get("privileged")),
        "allowPrivilegeEscalation not false": sc.get("allowPrivilegeEscalation") is not False,
        "capabilities not dropped": "ALL" not in (caps.get("drop") or []),
        "capabilities added": bool(set(caps.get("add") or []) - {"NET_BIND_SERVICE"}),
        "runAsNonRoot not set": not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")),
        "runAsUser 0": sc.get("runAsUser", pod_sc.get("runAsUser")) == 0,
        f"seccompProfile {seccomp}": seccomp not in ("RuntimeDefault", "Localhost"),
    }
    return [f"{c['name']}: {what}" for what, bad in checks.items() if bad]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in a pod spec Pod Security's `restricted` profile (v1.33) refuses: the baseline's
    host namespaces, hostPath and privilege, and restricted's own rules."""
    out = [f"{k}: true" for k in ("hostPID", "hostIPC", "hostNetwork") if pod.get(k)]
    for v in pod.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: {kind}")
    pod_sc = pod.get("securityContext") or {}
    for c in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        out += _container_violations(c, pod_sc)
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_security_labels_and_every_pod_meets_its_namespaces_level(overlay: str) -> None:
    """seedance-system enforces `restricted` and every pod there meets it; only the node agent,
    in the node's namespace, uses the host's PIDs and directories (test_hardening.py: what else
    it may not). The collector is there beside it (where, with
    the per-node credentials, it reads its node's password from the host) but needs no
    privilege: it meets `restricted` too."""
    docs = render(overlay, ("keda", "servicemonitor", "nvidia-runtime", "mig-manager"))
    namespaces = {n: d["metadata"]["labels"] for n, d in by_kind(docs, "Namespace").items()}
    assert namespaces["seedance-system"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert namespaces[NODE_NAMESPACE]["pod-security.kubernetes.io/enforce"] == "privileged"
    for labels in namespaces.values():
        assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"
        assert {"pod-security.kubernetes.io/warn", "pod-security.kubernetes.io/audit"} <= set(
            labels
        )
    pods = _pod_specs(docs)
    # dev runs no collector (no GPU for NVML to read)
    node_pods = {"node-agent", "telemetry-collector"} if overlay == "prod" else {"node-agent"}
    assert {name for ns, name in pods if ns == NODE_NAMESPACE} == node_pods
    problems = {
        name: restricted_violations(pod)
        for (ns, name), pod in pods.items()
        if (ns, name) != (NODE_NAMESPACE, "node-agent")
    }
    assert {n: p for n, p in problems.items() if p} == {}
    # The node agent would not pass it (which is why it has its own namespace).
    assert restricted_violations(pods[(NODE_NAMESPACE, "node-agent")])
    if overlay == "prod":
        # With the per-node credentials the collector's one departure is its node's password,
        # read-only from the host: why it runs in the node's namespace, not seedance-system.
        per_node = _pod_specs(render(overlay, ("per-node-credentials",)))
        collector = per_node[(NODE_NAMESPACE, "telemetry-collector")]
        assert restricted_violations(collector) == ["volume node-credentials: hostPath"]


def test_the_nvidia_runtime_component_sets_the_runtime_class_of_the_nvml_pods_only() -> None:
    plain = _pod_specs(render("prod"))
    assert not any("runtimeClassName" in p for p in plain.values())
    pods = _pod_specs(render("prod", ("nvidia-runtime",)))
    with_class = {name for (_ns, name), p in pods.items() if "runtimeClassName" in p}
    assert with_class == {"telemetry-collector", "node-agent"}
    assert {pods[k]["runtimeClassName"] for k in pods if k[1] in with_class} == {"nvidia"}


def test_the_mig_manager_component_points_the_agent_at_the_layouts_it_installs() -> None:
    from seedance.node_agent import rbac
    from seedance.node_agent.settings import NodeAgentSettings

    docs = render("prod", ("mig-manager",))
    (cm,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["namespace"] != ("seedance-system")
    ]
    assert (cm["metadata"]["namespace"], cm["metadata"]["name"]) == (
        rbac.MIG_LAYOUTS_NAMESPACE,
        rbac.MIG_LAYOUTS_CONFIG_MAP,
    )
    layouts = yaml.safe_load(cm["data"]["config.yaml"])
    assert layouts["version"] == "v1"
    assert "all-disabled" in layouts["mig-configs"]  # the operator's default label value
    ds = by_kind(docs, "DaemonSet")["node-agent"]
    env = {
        e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    settings = NodeAgentSettings(
        node_name="n", mig_manager_config=env["SEEDANCE_NODE_AGENT_MIG_MANAGER_CONFIG"]
    )
    assert settings.mig_manager_config_map == (cm["metadata"]["namespace"], cm["metadata"]["name"])
    (role,) = by_kind(docs, "Role").values()
    assert role["metadata"]["namespace"] == cm["metadata"]["namespace"]
    assert role["rules"][0]["resourceNames"] == [cm["metadata"]["name"]]
    binding = by_kind(docs, "RoleBinding")[role["metadata"]["name"]]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "node-agent", "namespace": NODE_NAMESPACE}
    ]
    # Without the component no Role exists: nothing else may call the API.
    assert not by_kind(render("prod"), "Role")


def test_dev_runs_simulated_gpus_on_every_node_and_no_phantoms() -> None:
    """No fleet of nodes no kubelet runs: the node agent on every node advertises simulated
    GPUs of a model the GPU identity knows and publishes their inventory; the collector (no
    NVML to read) and the bridge's own inventory of Nodes are off."""
    from seedance.events.gpus import identify
    from seedance.k8s_bridge.settings import BridgeSettings
    from seedance.node_agent.settings import NodeAgentSettings

    docs = render("dev")
    assert "telemetry-collector" not in workloads(docs)
    assert not [d for d in docs if d["kind"] == "ConfigMap" and "nodes" in d["metadata"]["name"]]
    pod = w_spec(docs, "node-agent")
    assert "nodeSelector" not in pod  # every node of a kind or minikube cluster
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    fields = {
        k.removeprefix("SEEDANCE_NODE_AGENT_").lower(): v
        for k, v in env.items()
        if k.startswith("SEEDANCE_NODE_AGENT_") and v is not None
    }
    settings = msgspec.convert(
        {**fields, "node_name": "kind-worker"}, NodeAgentSettings, strict=False
    )
    assert settings.simulated_gpus >= 1
    assert identify(settings.simulated_gpu_model).known
    bridge = {e["name"]: e.get("value") for e in w_spec(docs, "k8s-bridge")["containers"][0]["env"]}
    assert bridge["SEEDANCE_K8S_BRIDGE_PUBLISH_INVENTORY"] == "false"
    assert BridgeSettings().publish_inventory is True  # prod keeps the bridge's
    prod = {e["name"] for e in w_spec(render("prod"), "node-agent")["containers"][0]["env"]}
    assert not {"SEEDANCE_NODE_AGENT_SIMULATED_GPUS"} & prod


def test_the_rbac_and_its_docs_carry_every_declared_call() -> None:
    """What `make rbac` rendered (and `make rbac-check`, part of `make test`, keeps current):
    each call the bridge declares is granted by its ClusterRole and listed, with its verbs, in
    every doc's RBAC table."""
    role = next(
        d
        for d in yaml.safe_load_all((K8S / "base" / "rbac" / "k8s-bridge.yaml").read_text())
        if d and d["kind"] == "ClusterRole"
    )
    granted = {(r["apiGroups"][0], r["resources"][0]): set(r["verbs"]) for r in role["rules"]}
    assert {k: v for k, v in granted.items() if k in EXPECTED_RULES} == EXPECTED_RULES
    begin = "<!-- rbac:begin (generated by `make rbac` from the services' declarations) -->"
    for doc in ("docs/deploy.md", "docs/k8s-crds.md", "docs/node-agent.md"):
        text = (DEPLOY.parent / doc).read_text()
        assert begin in text, doc
        table = text.split(begin)[1].split("<!-- rbac:end -->")[0]
        for rule in rbac.RULES.values():
            assert f"| `{rule.resource}` | {', '.join(sorted(rule.verbs))} |" in table, (doc, rule)


def test_prometheus_and_grafanas_clients_are_let_in() -> None:
    docs = render("prod", ("servicemonitor",))
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    # default deny in both namespaces
    denies = {p["metadata"]["namespace"] for p in policies if p["spec"]["podSelector"] == {}}
    assert denies == {"seedance-system", NODE_NAMESPACE}

    def admitted(namespace: str, labels: dict[str, str], port: str, source: dict[str, str]) -> bool:
        for p in policies:
            if p["metadata"]["namespace"] != namespace or p["spec"]["podSelector"] == {}:
                continue
            sel = p["spec"]["podSelector"]
            if "matchLabels" in sel and not sel["matchLabels"].items() <= labels.items():
                continue
            if "matchExpressions" in sel and not all(
                labels.get(e["key"]) in e["values"] for e in sel["matchExpressions"]
            ):
                continue
            for rule in p["spec"].get("ingress", []):
                ports = {q["port"] for q in rule.get("ports", [])}
                froms = [f["namespaceSelector"]["matchLabels"] for f in rule["from"]
                         if "namespaceSelector" in f]  # fmt: skip
                if port in ports and any(m.items() <= source.items() for m in froms):
                    return True
        return False

    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    elsewhere = {
        "kubernetes.io/metadata.name": "observability",
        "seedance.io/metrics-client": "true",
    }
    ingress = {
        "kubernetes.io/metadata.name": "ingress-nginx",
        "seedance.io/dashboard-client": "true",
    }
    stranger = {"kubernetes.io/metadata.name": "team-a"}
    for namespace, name in _pod_specs(docs):
        labels = workloads(docs)[name]["spec"]["template"]["metadata"]["labels"]
        if name in ("nats", "auth-callout"):
            continue  # no http metrics port (NATS's monitor port is checked by its own policy)
        assert admitted(namespace, labels, "http", monitoring), name
        assert admitted(namespace, labels, "http", elsewhere), name
        assert not admitted(namespace, labels, "http", stranger), name
    grafana = workloads(docs)["grafana"]["spec"]["template"]["metadata"]["labels"]
    assert admitted("seedance-system", grafana, "http", ingress)


#: Real label sets (what a selector may match). A GPU-operator node: GFD's labels and the
#: operator's ``nvidia.com/gpu.present`` (gpu-operator's node labelling). A GKE node: Google's
#: driver and device plugin, no GPU operator, so no ``gpu.present`` ("About GPUs in GKE": the
#: ``cloud.google.com/gke-accelerator`` and ``gke-gpu`` labels). A CPU-only node.
NODES = {
    "gpu-operator": {
        "kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/mig.capable": "true",
    },
    "gke": {
        "kubernetes.io/os": "linux", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "cloud.google.com/gke-gpu": "true",
    },
    "cpu-only": {"kubernetes.io/os": "linux"},
}  # fmt: skip

#: Who publishes each node's inventory, per overlay. The base (prod) runs two publishers of a
#: GPU-operator node (the collector: UUIDs; the bridge: cordon, NotReady, deletion and
#: allocatable), the known defect the slicer warns of (docs/k8s-bridge.md, "Who publishes a
#: node's inventory"); the bridge alone describes GKE and CPU-only nodes (no collector runs
#: there) and is the only one to say any node is cordoned or gone.
PUBLISHERS = {
    "prod": {"gpu-operator": {"collector", "bridge"}, "gke": {"bridge"}, "cpu-only": {"bridge"}},
    "dev": {n: {"simulated node agent"} for n in NODES},
}


def env_of(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in w_spec(docs, name)["containers"][0]["env"]}


def _selects(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (pod.get("nodeSelector") or {}).items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_who_publishes_each_kind_of_nodes_inventory(overlay: str) -> None:
    """Renders the overlay and matches each publishing workload's node selector against real
    nodes' labels: the collector DaemonSet (NVML) where it is scheduled, the node agent where it
    simulates GPUs, the bridge (a Deployment reading every Node) wherever its
    ``PUBLISH_INVENTORY`` is on."""
    from seedance.k8s_bridge.settings import BridgeSettings

    docs = render(overlay)
    flag = env_of(docs, "k8s-bridge").get("SEEDANCE_K8S_BRIDGE_PUBLISH_INVENTORY")
    bridge = BridgeSettings().publish_inventory if flag is None else flag == "true"
    agent = env_of(docs, "node-agent").get("SEEDANCE_NODE_AGENT_SIMULATED_GPUS")
    found = {}
    for node, labels in NODES.items():
        who = set()
        if "telemetry-collector" in workloads(docs):
            source = env_of(docs, "telemetry-collector")["SEEDANCE_TELEMETRY_COLLECTOR_SOURCE"]
            assert source == "nvml"
            if _selects(w_spec(docs, "telemetry-collector"), labels):
                who.add("collector")
        if int(agent or 0) > 0 and _selects(w_spec(docs, "node-agent"), labels):
            who.add("simulated node agent")
        if bridge:
            who.add("bridge")
        found[node] = who
    assert found == PUBLISHERS[overlay]
