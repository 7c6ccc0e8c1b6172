"""deploy/k8s egress: with the opt-in component components/egress-policies, every pod the
overlays render reaches what it connects to and nothing else; without it, no policy limits egress.

Each pod's needs are read from the rendered manifests where they say them (NATS_URL and
NATS_ROUTES resolved through the Services to the pods' container ports, the router's fallback
replicas, the graph-compiler's URL schemes, Grafana's datasource URL, the RBAC bindings of its
ServiceAccount) and from the docs where the destination is the cluster's (CoreDNS, the API
server, Prometheus, the inference example). The rendered NetworkPolicies are evaluated by
``netpol.egress_allowed``: the needs are allowed; the cloud metadata endpoint, another Seedance
pod's metrics port and, without RBAC, the API server are not.
"""

from __future__ import annotations

import itertools
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
import yaml

from seedance.graph_compiler.settings import GraphCompilerSettings
from seedance.router.settings import parse_replicas
from tests.unit.deploy.netpol import Destination, Source, egress_allowed, policy_types, selects
from tests.unit.deploy.test_k8s import COMPONENTS, K8S, OVERLAYS, by_kind, errors_of, render

EGRESS = "egress-policies"
#: Both overlays with the egress component: alone, with every other optional component (all of
#: COMPONENTS), and with the agent's own MIG mode (it cannot go with mig-manager, so not in
#: COMPONENTS).
RENDERS = [
    (o, c) for o in OVERLAYS for c in [(EGRESS,), COMPONENTS, ("agent-mig", EGRESS)]
]  # fmt: skip
RENDER_IDS = [f"{o}-{'+'.join(c)}" for o, c in RENDERS]

METADATA = "169.254.169.254"
#: NodeLocal DNSCache's default listen address (a hostNetwork pod on every node), and its
#: metrics port.
NODE_LOCAL_DNS = "169.254.20.10"
NODE_LOCAL_DNS_METRICS = 9253
#: The API server as a pod meets it behind the `kubernetes` Service: an endpoint on a private
#: address (kubeadm's 6443, a managed control plane's 443) or a public one.
API_PRIVATE = [("10.0.0.5", 6443), ("172.20.0.1", 443)]
API_PUBLIC = [("203.0.113.10", 443), ("203.0.113.10", 6443)]
PUBLIC_HOST = ["203.0.113.20", "2001:db8::20"]
PRIVATE_HOST = ["10.1.2.3", "172.16.5.5", "192.168.1.1", "100.64.0.1", "fd00::1", "fe80::1"]
SCHEME_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Pod:
    kind: str
    name: str
    namespace: str
    labels: Mapping[str, str]
    spec: Mapping[str, Any]
    ip: str

    @property
    def named_ports(self) -> dict[str, int]:
        return {
            p["name"]: p["containerPort"]
            for c in self.spec["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }

    def env(self) -> dict[str, str]:
        return {
            e["name"]: e["value"] for c in self.spec["containers"] for e in c.get("env", [])
            if "value" in e
        }  # fmt: skip

    def source(self) -> Source:
        return Source(self.namespace, self.labels)


def namespace_labels(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, str]:
    """A namespace's labels as the API server holds them (it adds kubernetes.io/metadata.name)."""
    rendered = by_kind(docs, "Namespace").get(name, {}).get("metadata", {}).get("labels", {})
    return {**rendered, "kubernetes.io/metadata.name": name}


def pods(docs: tuple[dict[str, Any], ...]) -> list[Pod]:
    out = []
    kinds = ("Deployment", "DaemonSet", "StatefulSet", "Job")
    works = [d for d in docs if d["kind"] in kinds]
    for i, work in enumerate(works):
        template = work["spec"]["template"]
        out.append(
            Pod(
                work["kind"], work["metadata"]["name"], work["metadata"]["namespace"],
                template["metadata"]["labels"], template["spec"], f"10.244.0.{i + 2}",
            )
        )  # fmt: skip
    return out


def at(docs: tuple[dict[str, Any], ...], pod: Pod) -> Destination:
    return Destination(
        pod.ip, pod.namespace, namespace_labels(docs, pod.namespace), pod.labels, pod.named_ports
    )


def through_service(
    docs: tuple[dict[str, Any], ...], host: str, port: int, from_ns: str
) -> Iterator[tuple[Destination, int]]:
    """The pods (and their container ports) behind ``host:port``, a Service's DNS name
    (``svc``, ``svc.ns``, ``svc.ns.svc[.cluster.local]``, or a StatefulSet pod's
    ``pod.svc``) seen from ``from_ns``, as kube-proxy sends a connection there."""
    parts = host.split(".")
    headless = {
        s["metadata"]["name"] for s in by_kind_all(docs, "Service")
        if s["spec"].get("clusterIP") == "None"
    }  # fmt: skip
    if len(parts) > 1 and parts[1] in headless and re.fullmatch(r".+-\d+", parts[0]):
        parts = parts[1:]  # a StatefulSet pod's name: its pods all take the same rules
    svc_name, ns = parts[0], parts[1] if len(parts) > 1 else from_ns
    (svc,) = [
        d for d in by_kind_all(docs, "Service")
        if d["metadata"]["name"] == svc_name and d["metadata"]["namespace"] == ns
    ]  # fmt: skip
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
    found = False
    for pod in pods(docs):
        if pod.namespace != ns or not selects({"matchLabels": svc["spec"]["selector"]}, pod.labels):
            continue
        target = svc_port.get("targetPort", port)
        number = pod.named_ports[target] if isinstance(target, str) else target
        found = True
        yield at(docs, pod), number
    assert found, f"no pod behind {host}:{port}"


def kube_dns() -> Destination:
    ns = "kube-system"
    return Destination(
        "10.244.200.2", ns, {"kubernetes.io/metadata.name": ns}, {"k8s-app": "kube-dns"}
    )


@cache
def inference_example() -> tuple[Destination, int]:
    """The example's Triton pod and the container port its Service's `grpc` port targets."""
    path = K8S / "examples" / "inference" / "triton-echo.yaml"
    docs = tuple(d for d in yaml.safe_load_all(path.read_text()) if d)
    (ns,) = by_kind(docs, "Namespace").values()
    (svc,) = by_kind(docs, "Service").values()
    (deployment,) = by_kind(docs, "Deployment").values()
    template = deployment["spec"]["template"]
    (container,) = template["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    (grpc,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    name = ns["metadata"]["name"]
    labels = {**ns["metadata"]["labels"], "kubernetes.io/metadata.name": name}
    return Destination("10.244.201.2", name, labels, template["metadata"]["labels"], named), named[
        grpc["targetPort"]
    ]


def api_bound(docs: tuple[dict[str, Any], ...], pod: Pod) -> bool:
    """Whether the pod's ServiceAccount is a subject of any rendered (Cluster)RoleBinding."""
    account = pod.spec.get("serviceAccountName", "default")
    return any(
        s["kind"] == "ServiceAccount"
        and s["name"] == account
        and s.get("namespace", b["metadata"].get("namespace")) == pod.namespace
        for b in docs if b["kind"] in {"ClusterRoleBinding", "RoleBinding"}
        for s in b.get("subjects", [])
    )  # fmt: skip


Need = tuple[str, Destination, int, str]


def needs(docs: tuple[dict[str, Any], ...], pod: Pod) -> list[Need]:
    """What ``pod`` connects to: (why, destination, port, protocol)."""
    out = [
        (why, dst, 53, proto)
        for why, dst in [("dns", kube_dns()), ("node-local dns", Destination(NODE_LOCAL_DNS))]
        for proto in ("UDP", "TCP")
    ]
    env = pod.env()
    out += _nats(docs, pod, env)
    if api_bound(docs, pod):
        for ip, port in API_PRIVATE + API_PUBLIC:
            out.append(("API server", Destination(ip), port, "TCP"))
    if "SEEDANCE_ROUTER_REPLICAS" in env:
        out += _replicas(docs, pod, env["SEEDANCE_ROUTER_REPLICAS"])
    if pod.name == "graph-compiler":
        schemes = env.get(
            "SEEDANCE_GRAPH_COMPILER_URL_SCHEMES", GraphCompilerSettings().url_schemes
        )
        for scheme, ip in itertools.product(schemes.split(","), PUBLIC_HOST):
            out.append((f"model_url {scheme}", Destination(ip), SCHEME_PORTS[scheme], "TCP"))
    if pod.name == "grafana":
        out.append(_prometheus(docs, pod))
    return out


def _nats(docs: tuple[dict[str, Any], ...], pod: Pod, env: Mapping[str, str]) -> list[Need]:
    """NATS_URL's server and NATS_ROUTES' peers, through their Services to the pods."""
    out: list[Need] = []
    urls = [("NATS_URL", env["NATS_URL"])] if "NATS_URL" in env else []
    urls += [("NATS_ROUTES", u) for u in env.get("NATS_ROUTES", "").strip("[] \n").split(",")]
    for why, text in urls:
        if not text.strip():
            continue
        url = urllib.parse.urlsplit(text.strip())
        assert url.hostname
        assert url.port
        for dst, port in through_service(docs, url.hostname, url.port, pod.namespace):
            out.append((why, dst, port, "TCP"))
    return out


def _replicas(docs: tuple[dict[str, Any], ...], pod: Pod, replicas: str) -> list[Need]:
    """The router's replicas: its fallback list's, the example's shared pool, a tenant's."""
    out: list[Need] = []
    for address in parse_replicas(replicas).values():
        # the fallback Service (`triton` in the router's namespace) is the operator's, its
        # pods labelled as docs/deploy.md says
        triton = Destination(
            "10.244.202.2", pod.namespace, namespace_labels(docs, pod.namespace),
            {"app": "triton", "seedance.io/router-replica": "true"},
        )  # fmt: skip
        out.append(("fallback replica", triton, int(address.rsplit(":", 1)[1]), "TCP"))
    example, port = inference_example()
    out.append(("shared replica", example, port, "TCP"))
    tenant = Destination(
        "10.244.203.2", "team-a",
        {"kubernetes.io/metadata.name": "team-a", "seedance.io/tenant": "team-a"},
        {"app": "triton"},
    )  # fmt: skip
    out.append(("tenant's replica", tenant, port, "TCP"))
    return out


def _prometheus(docs: tuple[dict[str, Any], ...], pod: Pod) -> Need:
    """Grafana's datasource: a Prometheus pod in the namespace its URL names."""
    url = urllib.parse.urlsplit(_datasource_url(docs, pod))
    assert url.hostname
    assert url.port
    name, ns = url.hostname.split(".")[:2]
    prometheus = Destination(
        "10.244.204.2", ns, {"kubernetes.io/metadata.name": ns},
        {"app.kubernetes.io/name": "prometheus"}, {"web": url.port},
    )  # fmt: skip
    return (f"datasource {name}", prometheus, url.port, "TCP")


def _datasource_url(docs: tuple[dict[str, Any], ...], pod: Pod) -> str:
    (volume,) = [v for v in pod.spec["volumes"] if v["name"] == "datasource"]
    config = by_kind(docs, "ConfigMap")[volume["configMap"]["name"]]
    (source,) = yaml.safe_load(config["data"]["datasource.yaml"])["datasources"]
    return str(source["url"])


def forbidden(docs: tuple[dict[str, Any], ...], pod: Pod) -> list[tuple[str, Destination, int]]:
    """What ``pod`` may not reach: the metadata endpoint, every other pod's metrics or
    monitoring port, the API server unless bound, private addresses for model fetches."""
    out = [("cloud metadata", Destination(METADATA), p) for p in (80, 443)]
    out.append(("node-local dns metrics", Destination(NODE_LOCAL_DNS), NODE_LOCAL_DNS_METRICS))
    for other in pods(docs):
        if other.name == pod.name and other.namespace == pod.namespace:
            continue
        for name, number in other.named_ports.items():
            if name in {"http", "monitor"}:
                out.append((f"{other.name}'s {name} port", at(docs, other), number))
    if not api_bound(docs, pod):
        for ip, port in API_PRIVATE:
            out.append(("API server without RBAC", Destination(ip), port))
    if pod.name == "graph-compiler":
        for ip, port in itertools.product(PRIVATE_HOST, SCHEME_PORTS.values()):
            out.append(("a private address", Destination(ip), port))
    return out


@pytest.mark.parametrize(("overlay", "components"), RENDERS, ids=RENDER_IDS)
def test_every_pod_reaches_what_it_connects_to(overlay: str, components: tuple[str, ...]) -> None:
    docs = render(overlay, components)
    policies = list(by_kind_all(docs, "NetworkPolicy"))
    assert not [errors_of(p) for p in policies if errors_of(p)]
    refused = [
        f"{pod.namespace}/{pod.name} -> {why} {dst.namespace or dst.ip}:{port}/{proto}"
        for pod in pods(docs)
        for why, dst, port, proto in needs(docs, pod)
        if not egress_allowed(policies, pod.source(), dst, port, proto)
    ]
    assert not refused


@pytest.mark.parametrize(("overlay", "components"), RENDERS, ids=RENDER_IDS)
def test_no_pod_reaches_metadata_metrics_or_an_api_it_has_no_rbac_for(
    overlay: str, components: tuple[str, ...]
) -> None:
    docs = render(overlay, components)
    policies = list(by_kind_all(docs, "NetworkPolicy"))
    reached = [
        f"{pod.namespace}/{pod.name} -> {why} {dst.ip}:{port}"
        for pod in pods(docs)
        for why, dst, port in forbidden(docs, pod)
        if egress_allowed(policies, pod.source(), dst, port)
    ]
    assert not reached
    # Every namespace a pod lands in denies egress by default, so a pod no allow policy selects
    # (one an operator adds there) reaches nothing but DNS; by a policy of its own, not by
    # egress-dns's selecting every pod, which a patch narrowing it would undo.
    for ns in {pod.namespace for pod in pods(docs)}:
        assert [
            p for p in policies
            if p["metadata"]["namespace"] == ns and p["spec"]["podSelector"] == {}
            and policy_types(p["spec"]) == ["Egress"] and not p["spec"].get("egress")
        ], f"{ns} has no default-deny egress policy"  # fmt: skip
        stranger = Source(ns, {"app": "stranger"})
        assert not egress_allowed(policies, stranger, Destination(METADATA), 80)
        assert egress_allowed(policies, stranger, kube_dns(), 53, "UDP")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_without_the_component_no_policy_limits_egress(overlay: str) -> None:
    """The opt-in is real: an overlay alone, or with every other component, renders no Egress
    policy (the dashboard's none either), so a cluster whose DNS, replicas or Grafana the
    component's assumptions miss loses nothing on an upgrade that does not add it."""
    for components in [(), tuple(c for c in COMPONENTS if c != EGRESS)]:
        docs = render(overlay, components)
        policies = list(by_kind_all(docs, "NetworkPolicy"))
        assert {p["metadata"]["name"] for p in policies} >= {"default-deny-ingress", "grafana"}
        assert not [p["metadata"]["name"] for p in policies if "Egress" in policy_types(p["spec"])]


def test_only_the_api_callers_are_bound_and_the_rest_reach_no_api_server() -> None:
    """The RBAC the API rule follows: the k8s-bridge and the node agent, nobody else."""
    docs = render("prod", COMPONENTS)
    assert {p.name for p in pods(docs) if api_bound(docs, p)} == {"k8s-bridge", "node-agent"}


def by_kind_all(docs: tuple[dict[str, Any], ...], kind: str) -> Iterator[dict[str, Any]]:
    """Every object of ``kind`` (``by_kind`` keeps one per name; policies share names across
    the two namespaces)."""
    return (d for d in docs if d["kind"] == kind)


def test_the_evaluator_reads_selectors_ports_and_ip_blocks_as_kubernetes_does() -> None:
    """The evaluator the tests above trust, on hand-written policies."""
    meta = {"namespace": "a"}
    deny = {"metadata": meta, "spec": {"podSelector": {}, "policyTypes": ["Egress"]}}
    src = Source("a", {"app": "x"})
    pod_b = Destination(
        "10.1.0.1", "b", {"kubernetes.io/metadata.name": "b"}, {"app": "y"}, {"web": 80}
    )
    outside = Destination("203.0.113.1")
    assert egress_allowed([], src, outside, 80)  # no policy applies: everything
    assert egress_allowed([{**deny, "metadata": {"namespace": "b"}}], src, outside, 80)
    assert not egress_allowed([deny], src, outside, 80)
    block = {
        "metadata": meta,
        "spec": {
            "podSelector": {
                "matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]
            },
            # no policyTypes: Ingress, and Egress because it has egress rules
            "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["203.0.113.0/28"]}}],
                        "ports": [{"port": 440, "endPort": 450}]}],
        },
    }  # fmt: skip
    assert egress_allowed([deny, block], src, Destination("198.51.100.1"), 443)
    assert not egress_allowed([deny, block], src, Destination("198.51.100.1"), 451)
    assert not egress_allowed([deny, block], src, outside, 443)  # in except
    assert not egress_allowed([deny, block], src, Destination("198.51.100.1"), 443, "UDP")
    assert not egress_allowed([deny, block], Source("a", {"app": "z"}), Destination("1.1.1.1"), 443)
    to_b = {
        "metadata": meta,
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}},
                     "podSelector": {"matchLabels": {"app": "y"}}}], "ports": [{"port": "web"}]},
        ]},
    }  # fmt: skip
    assert egress_allowed([to_b], src, pod_b, 80)
    assert not egress_allowed([to_b], src, pod_b, 81)
    assert not egress_allowed(
        [to_b],
        src,
        Destination("10.1.0.2", "b", pod_b.namespace_labels, {"app": "q"}, {"web": 80}),
        80,
    )
    same_ns = {
        "metadata": meta,
        "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                 "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "y"}}}]}]},
    }  # fmt: skip
    assert not egress_allowed([same_ns], src, pod_b, 80)  # a podSelector alone: its own namespace
    assert egress_allowed([same_ns], src, Destination("10.1.0.3", "a", {}, {"app": "y"}), 80)
    assert selects({"matchExpressions": [{"key": "k", "operator": "NotIn", "values": ["v"]}]}, {})
    assert not selects({"matchExpressions": [{"key": "k", "operator": "Exists"}]}, {})
