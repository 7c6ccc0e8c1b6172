"""Validation: built-in kinds against the strict 1.33 schemas, custom resources against a
structural schema (pruning, defaults, int-or-string, nullable, preserve-unknown-fields) and its
CEL rules (messages, messageExpression, fieldPath, transition rules with oldSelf)."""

from __future__ import annotations

from typing import Any

from seedance.testing.kube_api.validation import CustomSchema, builtin_schemas, validate_name


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "main", "image": "i", **container}]},
    }


def test_builtin_pod_schema_names_the_bad_field() -> None:
    schemas = builtin_schemas()
    assert schemas.validate("pod-v1", _pod()) == []
    (cause,) = schemas.validate("pod-v1", _pod(ports=[{"containerPort": "eighty"}]))
    assert cause.field == "spec.containers[0].ports[0].containerPort"
    (unknown,) = schemas.validate("pod-v1", _pod(gpu=1))
    assert (unknown.field, unknown.message) == (
        "spec.containers[0].gpu",
        'unknown field "spec.containers[0].gpu"',
    )
    (missing,) = schemas.validate(
        "pod-v1", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}
    )
    assert missing.reason == "FieldValueRequired"


def test_names_must_be_dns_subdomains_except_rbac_path_segments() -> None:
    assert validate_name("Pod", "train-1.a") == []
    assert validate_name("Pod", "Train_1")[0].field == "metadata.name"
    assert validate_name("ClusterRole", "system:controller:x") == []
    assert validate_name("Pod", "")[0].reason == "FieldValueRequired"


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {
                    "rule": "self.min <= self.max",
                    "messageExpression": (
                        "'min ' + string(self.min) + ' exceeds max ' + string(self.max)"
                    ),
                },
                {
                    "rule": "self.max >= oldSelf.max",
                    "message": "max may only grow",
                    "fieldPath": ".max",
                },
            ],
            "properties": {
                "max": {"type": "integer"},
                "min": {"type": "integer", "default": 0},
                "burst": {"x-kubernetes-int-or-string": True},
                "note": {"type": "string", "nullable": True},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "pools": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "gpus": {"type": "integer"}},
                        "x-kubernetes-validations": [
                            {"rule": "self.gpus >= oldSelf.gpus", "message": "pools only grow"}
                        ],
                    },
                },
            },
        },
    },
}


def _cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "seedance.io/v1",
        "kind": "Policy",
        "metadata": {"name": "x"},
        "spec": spec,
    }


def test_pruning_defaults_and_preserved_fields() -> None:
    schema = CustomSchema(SCHEMA)
    pruned, unknown = schema.prune(
        _cr({"max": 4, "bogus": 1, "extra": {"any": {"thing": 1}}}), strict=False
    )
    assert pruned["spec"] == {"max": 4, "min": 0, "extra": {"any": {"thing": 1}}}
    assert unknown == ["spec.bogus"]
    assert pruned["metadata"] == {"name": "x"}


def test_schema_types_int_or_string_and_nullable() -> None:
    schema = CustomSchema(SCHEMA)
    assert schema.validate(_cr({"max": 4, "min": 0, "burst": 3, "note": None}), None) == []
    assert schema.validate(_cr({"max": 4, "min": 0, "burst": "10%"}), None) == []
    (bad,) = schema.validate(_cr({"max": 4, "min": 0, "burst": 1.5}), None)
    assert bad.field == "spec.burst"
    (bad,) = schema.validate(_cr({"max": "four", "min": 0}), None)
    assert bad.field == "spec.max"


def test_cel_rules_messages_and_transitions() -> None:
    schema = CustomSchema(SCHEMA)
    (cause,) = schema.validate(_cr({"max": 2, "min": 3}), None)
    assert cause.field == "spec"
    assert "min 3 exceeds max 2" in cause.message
    old = _cr({"max": 8, "min": 0})
    assert schema.validate(_cr({"max": 4, "min": 0}), None) == []  # no oldSelf on create
    (shrink,) = schema.validate(_cr({"max": 4, "min": 0}), old)
    assert (shrink.field, "max may only grow" in shrink.message) == ("spec.max", True)
    assert schema.validate(_cr({"max": 16, "min": 0}), old) == []


def test_transition_rules_on_map_list_items_follow_their_keys() -> None:
    schema = CustomSchema(SCHEMA)
    old = _cr({"max": 1, "min": 0, "pools": [{"name": "a", "gpus": 4}, {"name": "b", "gpus": 2}]})
    reordered = _cr(
        {
            "max": 1,
            "min": 0,
            "pools": [{"name": "b", "gpus": 2}, {"name": "a", "gpus": 4}, {"name": "c", "gpus": 0}],
        }
    )
    assert schema.validate(reordered, old) == []
    shrunk = _cr({"max": 1, "min": 0, "pools": [{"name": "b", "gpus": 1}]})
    (cause,) = schema.validate(shrunk, old)
    assert cause.field == "spec.pools[0]"
    assert "pools only grow" in cause.message
