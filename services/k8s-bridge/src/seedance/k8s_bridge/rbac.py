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


RULES: dict[str, Rule] = {
    r.resource: r
    for r in (
        # list + watch with the spec.schedulerName field selector; get after a 409 Binding
        Rule("", "pods", ("get", "list", "watch", "delete")),
        # the Binding subresource (POST pods/<name>/binding)
        Rule("", "pods/binding", ("create",)),
        # PodScheduled=False with the slicer's reason
        Rule("", "pods/status", ("patch",)),
        Rule("", "nodes", ("list", "watch")),
        # a namespace's seedance.io/tenant label
        Rule("", "namespaces", ("list", "watch")),
        Rule("", "events", ("create",)),
        # the leader lease
        Rule("coordination.k8s.io", "leases", ("get", "create", "update")),
        # the policy reconciler: the CRs it turns into the slicer's quota, their status, and
        # the PriorityClasses a TenantQuota's priorities may name
        Rule("seedance.io", "slicingpolicies", ("list", "watch")),
        Rule("seedance.io", "tenantquotas", ("list", "watch")),
        Rule("seedance.io", "slicingpolicies/status", ("patch",)),
        Rule("seedance.io", "tenantquotas/status", ("patch",)),
        Rule("scheduling.k8s.io", "priorityclasses", ("list", "watch")),
        # the router replicas: the slices of Services labelled seedance.io/model (by label)
        Rule("discovery.k8s.io", "endpointslices", ("list", "watch")),
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
