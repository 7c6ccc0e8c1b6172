"""Every Kubernetes API call the bridge makes, as RBAC rules: the one declaration the
manifests' ClusterRole is derived from (``cluster_role``) and tested against.

Each rule is (apiGroup, resource, verbs). The bridge's API adapter (`seedance.k8s_bridge.kube`)
names the rule each of its calls needs (``RULES`` keys), so a call without a rule fails its
test, and the ClusterRole grants nothing the code does not do. Must not call the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["RULES", "Rule", "cluster_role", "needs"]


@dataclass(frozen=True)
class Rule:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    #: Why the bridge makes the call: the generated manifest's comment and the docs' table
    #: (``make rbac``).
    why: str = ""


RULES: dict[str, Rule] = {
    r.resource: r
    for r in (
        Rule(
            "",
            "pods",
            ("get", "list", "watch", "delete"),
            "pods with its schedulerName: list + watch (field selector), get after a 409 "
            "Binding, delete a preemption's victim or a half-bound gang",
        ),
        Rule(
            "",
            "pods/binding",
            ("create",),
            "the Binding, carrying the placement annotation in its own metadata",
        ),
        Rule("", "pods/status", ("patch",), "PodScheduled=False with the slicer's reason"),
        Rule(
            "",
            "pods/eviction",
            ("create",),
            "a consolidation move's pod, evicted so that its PodDisruptionBudgets hold",
        ),
        Rule(
            "",
            "nodes",
            ("list", "watch", "patch"),
            "each Node's inventory for the slicer; patch: cordon and taint the nodes the "
            "slicer holds empty for the autoscaler to release, and lift both",
        ),
        Rule(
            "",
            "namespaces",
            ("list", "watch"),
            "a namespace's seedance.io/tenant label (one no TenantQuota binds)",
        ),
        Rule(
            "",
            "events",
            ("create",),
            "Seedance's Events on pods (Scheduled, FailedScheduling, Preempted, GangBindFailed)",
        ),
        Rule(
            "coordination.k8s.io",
            "leases",
            ("get", "create", "update"),
            "the leader lease (seedance-k8s-bridge in seedance-system)",
        ),
        Rule(
            "seedance.io",
            "slicingpolicies",
            ("list", "watch"),
            "the CRs it reconciles into the slicer's policy",
        ),
        Rule(
            "seedance.io",
            "tenantquotas",
            ("list", "watch"),
            "the CRs it reconciles into the slicer's quota",
        ),
        Rule("seedance.io", "slicingpolicies/status", ("patch",), "the CR's status"),
        Rule("seedance.io", "tenantquotas/status", ("patch",), "the CR's status (usage)"),
        Rule(
            "scheduling.k8s.io",
            "priorityclasses",
            ("list", "watch"),
            "a TenantQuota's defaultPriority/maxPriority may name a PriorityClass",
        ),
        Rule(
            "discovery.k8s.io",
            "endpointslices",
            ("list", "watch"),
            "the router's inference replicas: the EndpointSlices of Services labelled "
            "seedance.io/model (by label), registered in seedance-router-replicas",
        ),
    )
}


def needs(resource: str, verb: str) -> Rule:
    """The rule that allows ``verb`` on ``resource``; raises if the declaration lacks it."""
    rule = RULES.get(resource)
    if rule is None or verb not in rule.verbs:
        raise LookupError(f"rbac.RULES grants no {verb!r} on {resource!r}: declare it first")
    return rule


def cluster_role(name: str = "seedance-k8s-bridge") -> dict[str, Any]:
    """The ClusterRole granting exactly ``RULES`` (one rule per resource, verbs sorted)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": [r.api_group], "resources": [r.resource], "verbs": sorted(r.verbs)}
            for r in sorted(RULES.values(), key=lambda r: (r.api_group, r.resource))
        ],
    }
