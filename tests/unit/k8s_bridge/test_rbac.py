"""The bridge's RBAC declaration is exactly its calls: every API method names a rule, every
granted verb is used by a call, and the ClusterRole is derived from it."""

import inspect

import pytest
import yaml

from seedance.k8s_bridge import rbac
from seedance.k8s_bridge.kube import CALLS, KubeApi
from seedance.testing.paths import REPO

#: KubeApi's public methods that make no request: closing, and the rate-wait hook.
NOT_CALLS = {"close", "on_rate_wait"}


def test_every_api_call_names_its_rule() -> None:
    methods = {
        name
        for name, fn in inspect.getmembers(KubeApi, inspect.isfunction)
        if not name.startswith("_") and name not in NOT_CALLS
    }
    assert methods == set(CALLS)
    for resource, verb in CALLS.values():
        assert verb in rbac.needs(resource, verb).verbs


def test_no_verb_is_granted_that_no_call_uses() -> None:
    granted = {(r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert granted == set(CALLS.values())


def test_an_undeclared_call_fails() -> None:
    with pytest.raises(LookupError, match="no 'delete' on 'nodes'"):
        rbac.needs("nodes", "delete")  # the autoscaler removes nodes, never Seedance


def test_the_cluster_role_is_the_declaration() -> None:
    role = rbac.cluster_role()
    assert role["kind"] == "ClusterRole"
    rules = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in role["rules"]}
    assert rules[("", "pods/binding")] == ["create"]
    assert rules[("coordination.k8s.io", "leases")] == ["create", "get", "update"]
    assert len(rules) == len(rbac.RULES)


def test_the_shipped_cluster_role_is_exactly_the_declaration() -> None:
    """deploy/k8s/base/rbac/k8s-bridge.yaml grants what the calls use and nothing more."""
    docs = yaml.safe_load_all((REPO / "deploy/k8s/base/rbac/k8s-bridge.yaml").read_text())
    (role,) = [d for d in docs if d and d["kind"] == "ClusterRole"]
    granted = {
        (group, res, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for res in rule["resources"]
        for verb in rule["verbs"]
    }
    declared = {(r.api_group, r.resource, v) for r in rbac.RULES.values() for v in r.verbs}
    assert granted == declared
    assert ("seedance.io", "tenantquotas/status", "patch") in declared
    assert ("scheduling.k8s.io", "priorityclasses", "watch") in declared
