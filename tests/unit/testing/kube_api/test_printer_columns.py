"""Server-side printing of a CRD's additionalPrinterColumns: the JSONPath subset CRDs use."""

from __future__ import annotations

from datetime import UTC, datetime

from seedance.testing.kube_api.discovery import json_path, table
from seedance.testing.kube_api.resources import crd_resource_types

OBJ = {
    "metadata": {"name": "team-a", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"tenant": "a", "quota": {"gpus": 8}, "ns": ["x", "y"]},
    "status": {
        "conditions": [
            {"type": "Accepted", "status": "True"},
            {"type": "Ready", "status": "False", "reason": "NamespaceConflict"},
        ]
    },
}


def test_json_path_fields_indices_and_filters() -> None:
    assert json_path(OBJ, ".spec.quota.gpus") == 8
    assert json_path(OBJ, ".spec.ns[1]") == "y"
    assert json_path(OBJ, '.status.conditions[?(@.type=="Ready")].reason') == "NamespaceConflict"
    assert json_path(OBJ, '.status.conditions[?(@.type=="Gone")].status') is None
    assert json_path(OBJ, ".spec.cohort") is None
    assert json_path(OBJ, ".spec.ns[5]") is None


def test_a_crds_columns_replace_the_default_ones() -> None:
    crd = {
        "spec": {
            "group": "seedance.io",
            "scope": "Cluster",
            "names": {"plural": "tenantquotas", "kind": "TenantQuota"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "additionalPrinterColumns": [
                        {"name": "GPUs", "type": "integer", "jsonPath": ".spec.quota.gpus"},
                        {"name": "Cohort", "type": "string", "jsonPath": ".spec.cohort"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                        {"name": "T", "type": "string", "jsonPath": ".spec.tenant", "priority": 1},
                    ],
                }
            ],
        }
    }
    (rt,) = crd_resource_types(crd)
    out = table(rt, [OBJ], "7", datetime(2026, 1, 3, tzinfo=UTC), "None")
    assert [(c["name"], c["priority"]) for c in out["columnDefinitions"]] == [
        ("Name", 0),
        ("GPUs", 0),
        ("Cohort", 0),
        ("Age", 0),
        ("T", 1),
    ]
    assert out["rows"][0]["cells"] == ["team-a", 8, None, "2d", "a"]
