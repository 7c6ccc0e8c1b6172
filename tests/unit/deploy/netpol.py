"""A NetworkPolicy egress evaluator for the rendered manifests: may a pod open a connection to a
destination (a pod, or an address outside the cluster's pods) on a port and protocol?

The semantics of networking.k8s.io/v1 for egress, no more: a policy applies to a pod iff it is
in the pod's namespace, its ``podSelector`` selects the pod and its ``policyTypes`` include
Egress (unset: Ingress, plus Egress where the policy has ``egress`` rules). A pod no policy
applies to may reach anything; otherwise a connection is allowed iff some rule of some applying
policy allows it (policies are additive). A rule's ``ports`` (none: every port) match by number,
``endPort`` range, or name (the destination pod's container port of that name), and protocol
(TCP unless told); its ``to`` (none: every destination) by peer: ``podSelector`` alone (pods of
the policy's namespace), ``namespaceSelector`` alone (every pod of the selected namespaces),
both (the selected pods of the selected namespaces), or ``ipBlock`` (the address is in ``cidr``
and in none of ``except``). Whether an ipBlock also matches pod addresses is the CNI's choice
(Calico and Cilium: yes): this evaluator matches them, the stricter reading for a "may not"
check. Must not: know which Seedance pod needs what (the tests say that).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from seedance.testing.kube_api.disruption import selects as label_selects

__all__ = ["Destination", "Source", "egress_allowed", "policy_types", "selects"]


@dataclass(frozen=True)
class Source:
    """A pod about to connect: its namespace and its labels."""

    namespace: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Destination:
    """Where a connection goes: an address and, when it is a pod's, that pod's namespace (with
    the namespace's labels), labels and named container ports."""

    ip: str
    namespace: str | None = None
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against ``labels`` (``{}`` selects everything; an absent one,
    None, nothing: a peer without a pod or namespace selector is not that kind of peer)."""
    return selector is not None and label_selects(dict(selector), dict(labels))


def policy_types(spec: Mapping[str, Any]) -> list[str]:
    """The types a policy applies to, as the API server defaults them."""
    if "policyTypes" in spec:
        return list(spec["policyTypes"])
    return ["Ingress", *(["Egress"] if spec.get("egress") else [])]


def _port_matches(
    ports: Iterable[Mapping[str, Any]] | None, dst: Destination, port: int, protocol: str
) -> bool:
    ports = list(ports or [])
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            if dst.named_ports.get(want) == port:
                return True
            continue
        if want == port or want <= port <= p.get("endPort", want):
            return True
    return False


def _in_block(block: Mapping[str, Any], ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    net = ipaddress.ip_network(block["cidr"])
    if address.version != net.version or address not in net:
        return False
    return not any(
        address in ipaddress.ip_network(e)
        for e in block.get("except", [])
        if ipaddress.ip_network(e).version == address.version
    )


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, dst: Destination) -> bool:
    if "ipBlock" in peer:
        return _in_block(peer["ipBlock"], dst.ip)
    if not dst.is_pod:
        return False
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:
        in_ns = dst.namespace == policy_ns
    else:
        in_ns = selects(namespaces, dst.namespace_labels)
    return in_ns and (pods is None or selects(pods, dst.labels))


def egress_allowed(
    policies: Iterable[Mapping[str, Any]],
    src: Source,
    dst: Destination,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether ``src`` may open ``protocol`` to ``dst`` on ``port`` under ``policies`` (the
    rendered NetworkPolicy documents, every namespace's: those of others are skipped)."""
    applying = [
        p
        for p in policies
        if p["metadata"]["namespace"] == src.namespace
        and selects(p["spec"]["podSelector"], src.labels)
        and "Egress" in policy_types(p["spec"])
    ]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get("egress") or []:
            if not _port_matches(rule.get("ports"), dst, port, protocol):
                continue
            peers = rule.get("to") or []
            ns = policy["metadata"]["namespace"]
            if not peers or any(_peer_matches(peer, ns, dst) for peer in peers):
                return True
    return False
