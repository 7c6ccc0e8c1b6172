"""deploy/k8s: kustomize renders each overlay; every object validates; wiring matches the code.

The Kubernetes kinds validate against the carried v1.33 strict schemas, the KEDA ScaledObject
against its CRD's schema (deploy/schemas/, see its README). The renderer is the real kustomize
inside the pinned kubectl wheel (a dev dependency), not a re-implementation.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import msgspec
import pytest
import yaml

from seedance.core.auth_callout import new_issuer
from seedance.core.xkeys import CurveKeyPair, new_curve_keys
from seedance.events import nats_config, subjects
from seedance.events.nats_routes import ROUTE_PASSWORD_VAR, ROUTES_VAR
from seedance.events.permissions import CALLOUT_USER, IDENTITIES
from seedance.k8s_bridge.core.endpoints import FLEET_LABEL, MODEL_LABEL
from seedance.k8s_bridge.settings import BridgeSettings
from seedance.router.settings import RouterSettings, parse_replicas
from seedance.testing.servers import nats_server_binary
from tests.unit.deploy.declared import (
    DEPLOY,
    KUBERNETES_ONLY,
    REPO,
    auth_choices,
    auth_users,
    services,
)
from tests.unit.deploy.kubelet import pod_env

K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod")
SERVICES = services()
KUBECTL = REPO / ".venv" / "bin" / "kubectl"
INFERENCE_PORTS = [{"name": "grpc", "containerPort": 8001}, {"name": "rest", "containerPort": 8000}]
#: Kinds without a namespace (the rest of what the overlays render lands in seedance-system).
CLUSTER_SCOPED = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)


#: The optional components (deploy/k8s/components), each needing what a cluster may lack.
COMPONENTS = (
    "keda", "servicemonitor", "nvidia-runtime", "mig-manager", "per-node-credentials",
    "egress-policies",
)  # fmt: skip
#: Where a node's agents run, the node agent (Pod Security `privileged`) and the telemetry
#: collector; everything else is in seedance-system.
NODE_NAMESPACE = "seedance-node"


@cache
def render(overlay: str, components: tuple[str, ...] = ()) -> tuple[dict[str, Any], ...]:
    """``overlay`` rendered by the real kustomize, with ``components`` added the way the
    overlays' comments tell a user to (a kustomization naming the overlay and them)."""
    path = K8S / "overlays" / overlay
    with tempfile.TemporaryDirectory() as tmp:
        if components:
            Path(tmp, "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kustomize.config.k8s.io/v1beta1",
                        "kind": "Kustomization",
                        # kustomize takes no absolute root: relative to the temporary one
                        "resources": [os.path.relpath(path, tmp)],
                        "components": [
                            os.path.relpath(K8S / "components" / c, tmp) for c in components
                        ],
                    }
                )
            )
            path = Path(tmp)
        done = subprocess.run(
            [str(KUBECTL), "kustomize", str(path)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


@cache
def validators() -> dict[str, jsonschema.protocols.Validator]:
    k8s = json.loads((DEPLOY / "schemas" / "kubernetes-strict.json").read_text())
    out: dict[str, jsonschema.protocols.Validator] = {}
    for kind, schema in k8s["kinds"].items():
        full = {**schema, "$defs": k8s["$defs"]}
        out[kind] = jsonschema.Draft202012Validator(full)
    keda = json.loads((DEPLOY / "schemas" / "keda-scaledobject.json").read_text())
    out["ScaledObject"] = jsonschema.Draft202012Validator(keda)
    monitor = json.loads((DEPLOY / "schemas" / "servicemonitor.json").read_text())
    out["ServiceMonitor"] = jsonschema.Draft202012Validator(monitor)
    return out


def errors_of(doc: dict[str, Any]) -> list[str]:
    validator = validators().get(doc["kind"])
    assert validator is not None, f"no carried schema for kind {doc['kind']}"
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def by_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def workloads(docs: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        out.update(by_kind(docs, kind))
    return out


@pytest.mark.parametrize("components", [(), COMPONENTS], ids=["plain", "all-components"])
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates_against_its_schema(
    overlay: str, components: tuple[str, ...]
) -> None:
    docs = render(overlay, components)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "DaemonSet", "Deployment", "NetworkPolicy"} <= kinds
    assert {"PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceAccount"} <= kinds
    if not components:  # nothing an overlay renders needs a CRD a cluster may lack
        assert not kinds & {"ScaledObject", "ServiceMonitor"}
    problems = {f"{d['kind']}/{d['metadata']['name']}": errors_of(d) for d in docs}
    assert not {k: v for k, v in problems.items() if v}
    namespaced = [d for d in docs if d["kind"] not in CLUSTER_SCOPED]
    where = {(d["kind"], d["metadata"]["name"]): d["metadata"].get("namespace") for d in namespaced}
    node = {k for k, ns in where.items() if ns == NODE_NAMESPACE}
    # The node's agents' objects alone are in their namespace (the mig-manager component's in
    # the GPU operator's; egress-policies' node policies in theirs); the rest in seedance-system.
    assert {name for _kind, name in node} <= {
        "node-agent", "node-agent-metrics", "seedance-nats-passwords", "default-deny-ingress",
        "metrics-from-monitoring", "telemetry-collector", "telemetry-collector-metrics",
        "default-deny-egress", "egress-dns", "egress-nats-client", "egress-api-server",
    }  # fmt: skip
    assert ("DaemonSet", "node-agent") in node
    if overlay == "prod":  # dev runs no collector (no GPU for NVML to read)
        collector = "telemetry-collector"
        assert {("DaemonSet", collector), ("ServiceAccount", collector)} <= node
    others = {ns for k, ns in where.items() if k not in node}
    assert others <= {"seedance-system", "gpu-operator"}


def test_the_schemas_reject_what_the_api_server_would() -> None:
    deployment = json.loads(json.dumps(by_kind(render("dev"), "Deployment")["slicer"]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}  # misspelt
    assert errors_of(deployment)
    keda = render("dev", ("keda",))
    scaled = json.loads(json.dumps(by_kind(keda, "ScaledObject")["graph-compiler"]))
    scaled["spec"]["minReplicas"] = 1  # an HPA field, not a ScaledObject one
    assert errors_of(scaled)
    monitor = json.loads(
        json.dumps(by_kind(render("prod", ("servicemonitor",)), "ServiceMonitor")["seedance"])
    )
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"  # misspelt
    assert errors_of(monitor)


def test_service_monitor_scrapes_every_service_under_its_compose_job_name() -> None:
    """prod's ServiceMonitor reaches each service's `http` port through a Service; job names
    are the services' names, as in compose's prometheus.yml (the dashboards filter on them)."""
    docs = render("prod", ("servicemonitor",))
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    for overlay in OVERLAYS:  # no operator assumed: only the component brings it
        assert "ServiceMonitor" not in {d["kind"] for d in render(overlay)}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    job_label = monitor["spec"]["jobLabel"]
    (expr,) = monitor["spec"]["selector"]["matchExpressions"]
    namespaces = monitor["spec"]["namespaceSelector"]["matchNames"]
    selected = [
        svc
        for svc in (d for d in docs if d["kind"] == "Service")
        if svc["metadata"]["labels"].get(expr["key"]) in expr["values"]
        and svc["metadata"]["namespace"] in namespaces
    ]
    jobs = {svc["metadata"]["labels"][job_label] for svc in selected}
    scrape = yaml.safe_load((DEPLOY / "compose" / "prometheus" / "prometheus.yml").read_text())
    assert jobs == set(SERVICES)
    assert {c["job_name"] for c in scrape["scrape_configs"]} == set(SERVICES) - set(KUBERNETES_ONLY)
    works = workloads(docs)
    for svc in selected:
        name = svc["metadata"]["labels"][job_label]
        pod = works[name]["spec"]["template"]
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
        (container,) = pod["spec"]["containers"]
        assert port["targetPort"] in {p["name"] for p in container["ports"]}


#: Every (overlay, service) whose workload the overlay runs: all but the dev overlay's collector
#: (no GPU for NVML to read there: test_dev_runs_simulated_gpus_on_every_node_and_no_phantoms).
WORKLOADS = [
    (o, n) for o in OVERLAYS for n in sorted(SERVICES) if (o, n) != ("dev", "telemetry-collector")
]


@pytest.mark.parametrize(("overlay", "name"), WORKLOADS)
def test_service_workload_matches_the_code(overlay: str, name: str) -> None:
    decl = SERVICES[name]
    work = workloads(render(overlay))[name]
    pod = work["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (script,) = container["command"]
    assert decl.scripts[script] == f"{decl.package}.__main__:main"
    env = {e["name"]: e for e in container["env"]}
    ours = {k[len(decl.env_prefix) :].lower() for k in env if k.startswith("SEEDANCE_")}
    assert all(k.startswith(decl.env_prefix) for k in env if k.startswith("SEEDANCE_"))
    if decl.settings is None:
        assert ours == {"http_port"}  # the service's settings module does not exist yet
    else:
        assert not ours - decl.settings_fields, ours - decl.settings_fields
    port = int(env[decl.env_prefix + "HTTP_PORT"]["value"])
    # The endpoint binds loopback unless told: the kubelet's probes and Prometheus come from
    # outside the pod.
    assert env[decl.env_prefix + "HTTP_HOST"]["value"] == "0.0.0.0"
    # The metrics port first; the router adds its inference ports (test_router_inference_...).
    extra = INFERENCE_PORTS if name == "router" else []
    assert container["ports"] == [{"name": "http", "containerPort": port}, *extra]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["serviceAccountName"] == name
    assert work["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert env["NATS_USER"]["value"] == name
    assert env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == nats_config.password_var(
        name
    )
    assert name in by_kind(render(overlay), "ServiceAccount")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_topology_nats_cluster_daemonset_leader_election_and_disruption_budgets(
    overlay: str,
) -> None:
    docs = render(overlay)
    nats = by_kind(docs, "StatefulSet")["nats"]
    # Three servers in prod (JetStream clustered, quorum 2); one in dev (a one-node cluster).
    assert nats["spec"]["replicas"] == {"prod": 3, "dev": 1}[overlay]
    assert by_kind(docs, "Service")[nats["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    assert by_kind(docs, "DaemonSet")["node-agent"]
    assert by_kind(docs, "Deployment")["slicer"]["spec"]["replicas"] == 2
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["router"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "router",
    }
    assert "router" in by_kind(docs, "Service")
    pdb_selectors = [
        p["spec"]["selector"]["matchLabels"] for p in by_kind(docs, "PodDisruptionBudget").values()
    ]
    for name, work in workloads(docs).items():
        if work["kind"] == "DaemonSet":
            continue  # one per node by construction; drains evict it with the node
        labels = work["spec"]["template"]["metadata"]["labels"]
        assert any(sel.items() <= labels.items() for sel in pdb_selectors), f"no PDB for {name}"


def test_the_dev_overlay_schedules_on_one_node() -> None:
    """kind and minikube start with one node: no workload of the dev overlay with more than
    one replica may require its replicas on different nodes (the rest of one node's limits,
    CPU and memory, are the machine's). tests/integration/deploy/test_k8s_nats.py runs its NATS
    config on one server."""
    for name, work in workloads(render("dev")).items():
        if work["spec"].get("replicas", 1) <= 1:
            continue
        anti = work["spec"]["template"]["spec"].get("affinity", {}).get("podAntiAffinity", {})
        assert not anti.get("requiredDuringSchedulingIgnoredDuringExecution"), name


def test_prod_collector_runs_on_gpu_nodes_only() -> None:
    """On every GPU node, beside the node agent in the node's namespace, reaching NATS across
    namespaces, with its shared password from that namespace's Secret (a Secret is read only
    in its own namespace)."""
    docs = render("prod")
    ds = workloads(docs)["telemetry-collector"]
    assert ds["metadata"]["namespace"] == NODE_NAMESPACE
    pod = ds["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    nats = by_kind(docs, "Service")["nats"]
    assert env["NATS_URL"]["value"] == f"nats://nats.{nats['metadata']['namespace']}.svc:4222"
    node_agent = by_kind(docs, "DaemonSet")["node-agent"]["spec"]["template"]["spec"]
    node_env = {e["name"]: e for e in node_agent["containers"][0]["env"]}
    secret = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    assert secret == node_env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    dev_secrets = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d
        for d in render("dev")
        if d["kind"] == "Secret"
    }
    key = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"]
    assert key in dev_secrets[(NODE_NAMESPACE, secret)]["data"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scales_on_the_catalogues_consumers_of_the_target_service(overlay: str) -> None:
    docs = render(overlay, ("keda",))
    scaled = by_kind(docs, "ScaledObject")
    # The cost-ledger's replicas are deterministic and each does all the work: not scaled.
    assert set(scaled) == {"graph-compiler"}
    consumes = {n: set(d.consumes) for n, d in IDENTITIES.items()}
    for name, so in scaled.items():
        assert so["spec"]["scaleTargetRef"]["name"] in by_kind(docs, "Deployment")
        for trigger in so["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert trigger["type"] == "nats-jetstream"
            spec = subjects.consumer(meta["consumer"])
            assert spec.stream == meta["stream"]
            assert meta["consumer"] in consumes[name]
            host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
            assert host.split(".")[0] in by_kind(docs, "Service")
            assert port == "8222"


def test_dev_secret_has_a_password_for_every_user_and_prod_brings_its_own() -> None:
    users = auth_choices().users()
    secrets = {
        d["metadata"]["namespace"]: d
        for d in render("dev")
        if d["kind"] == "Secret" and d["metadata"]["name"] == "seedance-nats-passwords"
    }
    callout = (
        {nats_config.CALLOUT_ISSUER_VAR, nats_config.CALLOUT_XKEY_VAR}
        if auth_users().get("auth_callout")
        else set()
    )
    assert (
        set(secrets["seedance-system"]["data"])
        == {nats_config.password_var(u.name) for u in users} | callout
    )
    # The node's agents read theirs in their own namespace: the same passwords, nothing more.
    own = {nats_config.password_var(n) for n in ("node-agent", "telemetry-collector")}
    system = secrets["seedance-system"]["data"]
    assert secrets[NODE_NAMESPACE]["data"] == {k: system[k] for k in own}
    assert "seedance-nats-passwords" not in by_kind(render("prod"), "Secret")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_configmap_is_the_generated_auth_and_the_server_accepts_it(
    overlay: str, tmp_path: Path
) -> None:
    nats = by_kind(render(overlay), "StatefulSet")["nats"]
    (volume,) = [v for v in nats["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    config = by_kind(render(overlay), "ConfigMap")[volume["configMap"]["name"]]["data"]
    assert config["auth.conf"] == auth_choices().render()
    if nats["spec"]["replicas"] > 1:  # its routes: tests/unit/deploy/test_k8s_nats_routes.py
        assert re.search(r"^cluster\s*\{", config["nats.conf"], flags=re.M)
    else:  # a lone server runs JetStream standalone: a cluster block would wait for peers
        assert not re.search(r"^cluster\s*\{", config["nats.conf"], flags=re.M)
        (container,) = nats["spec"]["template"]["spec"]["containers"]
        assert ROUTES_VAR not in {e["name"] for e in container["env"]}  # nor the base's routes
    for name, text in config.items():
        (tmp_path / name).write_text(text)
    users = auth_choices().users()
    secret = {nats_config.password_var(u.name): "x" for u in users}
    secret[nats_config.CALLOUT_ISSUER_VAR] = new_issuer().public_key.decode()
    secret[nats_config.CALLOUT_XKEY_VAR] = new_curve_keys().public_key
    secret[ROUTE_PASSWORD_VAR] = "x"
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    secrets = {s["secretRef"]["name"]: secret for s in container["envFrom"]}
    env = {**os.environ, **pod_env(container, secrets, "nats-0")}
    done = subprocess.run(
        [nats_server_binary(), "-c", str(tmp_path / "nats.conf"), "-t"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr + done.stdout


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ledger_versions_never_overlap(overlay: str) -> None:
    # Two ledger versions may emit one output id with different amounts (docs/deploy.md).
    ledger = workloads(render(overlay))["cost-ledger"]
    assert ledger["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_auth_callout_runs_as_its_user_and_only_it_holds_the_signing_seed(
    overlay: str,
) -> None:
    docs = render(overlay)
    pod = workloads(docs)["auth-callout"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["seedance-auth", "serve"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NATS_USER"]["value"] == CALLOUT_USER
    pw = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert pw == {"name": "seedance-nats-passwords", "key": "NATS_PASSWORD_AUTH_CALLOUT"}
    seed = env["SEEDANCE_AUTH_CALLOUT_ISSUER_SEED"]["valueFrom"]["secretKeyRef"]
    assert seed["name"] != "seedance-nats-passwords"  # the server's env never sees the seed
    xkey = env["SEEDANCE_AUTH_CALLOUT_XKEY_SEED"]["valueFrom"]["secretKeyRef"]
    assert xkey == {"name": seed["name"], "key": "SEEDANCE_AUTH_CALLOUT_XKEY_SEED"}
    if overlay == "dev":
        secrets = by_kind(docs, "Secret")
        assert "SEEDANCE_AUTH_CALLOUT_ISSUER_SEED" in secrets[seed["name"]]["data"]
        # the curve seed the callout opens requests with is the pair of the key the server
        # seals them to: a mismatch fails every run-time login
        curve_seed = base64.b64decode(secrets[seed["name"]]["data"][xkey["key"]]).decode()
        (server,) = [
            d["data"] for d in docs
            if d["kind"] == "Secret" and d["metadata"]["name"] == "seedance-nats-passwords"
            and d["metadata"]["namespace"] == "seedance-system"
        ]  # fmt: skip
        public = server[nats_config.CALLOUT_XKEY_VAR]
        assert CurveKeyPair(curve_seed).public_key == base64.b64decode(public).decode()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_agent_reaches_the_kubelets_sockets_nvml_and_only_what_it_declares(
    overlay: str,
) -> None:
    """The DaemonSet mounts the kubelet's device-plugin and pod-resources directories (not
    the sockets: a kubelet restart replaces them) where its settings say, sees every GPU
    through the NVIDIA runtime, runs in the host PID namespace (NVML's PIDs -> cgroups), in its
    own namespace, reaches NATS across namespaces, and its RBAC is exactly its declaration."""
    from seedance.node_agent import rbac
    from seedance.node_agent.settings import NodeAgentSettings

    docs = render(overlay)
    ds = by_kind(docs, "DaemonSet")["node-agent"]
    assert ds["metadata"]["namespace"] == NODE_NAMESPACE
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["SEEDANCE_NODE_AGENT_NODE_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "spec.nodeName"}
    }
    nats = by_kind(docs, "Service")["nats"]
    assert env["NATS_URL"]["value"] == f"nats://nats.{nats['metadata']['namespace']}.svc:4222"
    assert pod["hostPID"] is True
    if overlay == "prod":
        # GPU nodes where the operator's device plugin is switched off: Seedance's replaces it.
        assert pod["nodeSelector"] == {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.deploy.device-plugin": "false",
        }
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    defaults = NodeAgentSettings(node_name="n")
    plugin_dir = env["SEEDANCE_NODE_AGENT_DEVICE_PLUGIN_DIR"]["value"]
    pod_resources = env["SEEDANCE_NODE_AGENT_POD_RESOURCES_SOCKET"]["value"]
    assert plugin_dir == defaults.device_plugin_dir
    assert pod_resources == defaults.pod_resources_socket
    assert mounts[plugin_dir] == "/var/lib/kubelet/device-plugins"
    assert mounts[os.path.dirname(pod_resources)] == "/var/lib/kubelet/pod-resources"
    (role,) = [
        r
        for r in by_kind(docs, "ClusterRole").values()
        if r["metadata"]["name"] == "seedance-node-agent"
    ]
    assert role["rules"] == [
        {"apiGroups": [r.api_group], "resources": [r.resource], "verbs": sorted(r.verbs)}
        for r in rbac.RULES
    ]
    binding = by_kind(docs, "ClusterRoleBinding")["seedance-node-agent"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NODE_NAMESPACE}
    ]
    account = [
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "node-agent"
    ]
    assert [a["metadata"]["namespace"] for a in account] == [NODE_NAMESPACE]
    secret = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    if overlay == "dev":
        assert any(
            d["kind"] == "Secret"
            and (d["metadata"]["name"], d["metadata"]["namespace"]) == (secret, NODE_NAMESPACE)
            for d in docs
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_router_inference_ports_reach_the_container_through_service_and_policy(
    overlay: str,
) -> None:
    """Clients reach router:8001 (gRPC) and router:8000 (REST): the Service's ports target
    container ports the settings make the router listen on, and the namespace's default-deny
    has a policy letting them in."""
    docs = render(overlay)
    pod = workloads(docs)["router"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    # Values from the pod (valueFrom: the instance's name, secrets) are the cluster's to fill.
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = msgspec.convert(
        {
            k[len("SEEDANCE_ROUTER_") :].lower(): v
            for k, v in env.items()
            if k.startswith("SEEDANCE_ROUTER_")
        },
        RouterSettings,
        strict=False,
    )
    listening = {
        "grpc": int(settings.listen_address.rsplit(":", 1)[1]),
        "rest": int(settings.rest_address.rsplit(":", 1)[1]),
    }
    assert listening == {"grpc": 8001, "rest": 8000}
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    service = by_kind(docs, "Service")["router"]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    for name, port in listening.items():
        assert ports[name]["port"] == port
        assert named[ports[name]["targetPort"]] == port
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert parse_replicas(settings.replicas), "no fallback replica configured"
    policy = by_kind(docs, "NetworkPolicy")["router-inference"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (rule,) = policy["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == set(listening)


def test_the_inference_example_is_a_replica_set_the_bridge_registers_and_keda_sizes() -> None:
    """deploy/k8s/examples/inference: the Service carries the labels and the port name the
    bridge registers by, selects the Deployment's pods on the container port that is Triton's
    gRPC, and the ScaledObject sizes that Deployment to the planner's gauge for the same model."""
    path = K8S / "examples" / "inference" / "triton-echo.yaml"
    docs = tuple(d for d in yaml.safe_load_all(path.read_text()) if d)
    problems = {f"{d['kind']}/{d['metadata']['name']}": errors_of(d) for d in docs}
    assert not {k: v for k, v in problems.items() if v}
    (service,) = by_kind(docs, "Service").values()
    model = service["metadata"]["labels"][MODEL_LABEL]
    assert service["metadata"]["labels"][FLEET_LABEL] == RouterSettings().fleet
    (port,) = [
        p for p in service["spec"]["ports"] if p["name"] == BridgeSettings().replica_port_name
    ]
    (deployment,) = by_kind(docs, "Deployment").values()
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == 8001  # Triton's gRPC
    assert "readinessProbe" in container  # not ready: registered, out of traffic
    (scaled,) = by_kind(docs, "ScaledObject").values()
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"], trigger["metadata"]["threshold"]) == (
        "prometheus",
        "AverageValue",
        "1",
    )
    assert trigger["metadata"]["query"] == (
        f'sum(seedance_router_recommended_replicas{{model="{model}"}})'
    )
    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"inference"}


@pytest.mark.parametrize(
    ("overlay", "name"),
    [("dev", "node-agent"), ("prod", "node-agent"), ("prod", "telemetry-collector")],
)
def test_per_node_credentials_give_each_node_agent_its_own_user_and_no_shared_password(
    overlay: str, name: str
) -> None:
    """The per-node-credentials component (issue 27): each of the node's agents, the node
    agent and the telemetry collector, connects as ``node-<its node name>`` with the password
    its node holds, never a shared user's: so every publisher of a node's telemetry speaks only
    for its own node, and ``shared_node_users: false`` can be set."""
    docs = render(overlay, ("per-node-credentials",))
    ds = by_kind(docs, "DaemonSet")[name]
    assert ds["metadata"]["namespace"] == NODE_NAMESPACE
    pod = ds["spec"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    names = [e["name"] for e in env]
    by_name = {e["name"]: e for e in env}
    assert by_name["NATS_USER"]["value"] == "node-$(SEEDANCE_NODE)"
    # Kubernetes expands $(VAR) only from variables defined earlier in the list.
    assert names.index("SEEDANCE_NODE") < names.index("NATS_USER")
    assert by_name["SEEDANCE_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "NATS_PASSWORD" not in by_name
    assert by_name["NATS_PASSWORD_FILE"]["value"] == "/etc/seedance/node/nats-password"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["node-credentials"] == {
        "name": "node-credentials", "mountPath": "/etc/seedance/node", "readOnly": True
    }  # fmt: skip
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["node-credentials"]["hostPath"]["path"] == "/etc/seedance/node"
    # No pod of the overlay mounts a shared node user's password any more.
    shared = {nats_config.password_var(n) for n in ("node-agent", "telemetry-collector")}
    for work in workloads(docs).values():
        if work["metadata"]["namespace"] != NODE_NAMESPACE:
            continue  # the NATS server reads every user's password, the shared ones too
        for c in work["spec"]["template"]["spec"]["containers"]:
            refs = [e["valueFrom"].get("secretKeyRef") for e in c["env"] if "valueFrom" in e]
            assert not {r["key"] for r in refs if r} & shared


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_job_provisions_as_the_provisioner_before_the_services_bind(overlay: str) -> None:
    """No service user may create a stream (docs/security.md): `kubectl apply` runs the
    `seedance admin provision` as a Job, from an image with the CLI (the cost-ledger's, as
    compose's one-shot), as the provisioner with its password from the Secret the services read
    theirs from, reaching NATS as a Seedance pod; the services wait for it (not ready)."""
    docs = render(overlay)
    job = by_kind(docs, "Job")["seedance-provision"]
    assert errors_of(job) == []
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["seedance", "admin", "provision"]
    ledger = workloads(docs)["cost-ledger"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == ledger["image"]
    env = {e["name"]: e for e in container["env"]}
    # the shipped provisioner, never the operator: the Job holds no unrestricted password
    assert env["NATS_USER"]["value"] == "provisioner"
    assert env["NATS_URL"] == {"name": "NATS_URL", "value": "nats://nats:4222"}
    secret = env["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "seedance-nats-passwords", "key": "NATS_PASSWORD_PROVISIONER"}
    assert pod["metadata"]["labels"]["app.kubernetes.io/part-of"] == "seedance"
    assert job["metadata"]["namespace"] == "seedance-system"
    assert pod["spec"]["serviceAccountName"] in by_kind(docs, "ServiceAccount")
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    # A finished Job's template is immutable: one left for an hour made the next apply with a
    # new tag fail and skip provision (review-grants F3). Gone soon; docs/deploy.md says to
    # delete it before an apply inside the window.
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 600
