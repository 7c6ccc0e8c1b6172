"""Validation of every object the test API server stores, as the real one refuses them (422
Invalid naming the field):

- built-in kinds against the Kubernetes JSON schemas shipped in the kubernetes-validate wheel
  (the ``local-strict`` variant of one fixed Kubernetes version: unknown fields are errors);
- custom resources against their CRD's structural ``openAPIV3Schema``: unknown fields pruned
  (or, with ``fieldValidation=Strict``, refused), defaults applied, ``nullable``,
  ``x-kubernetes-int-or-string`` and ``x-kubernetes-preserve-unknown-fields`` honoured, then the
  ``x-kubernetes-validations`` CEL rules (with ``oldSelf`` transition rules) run by cel-python.

It also hands strategic merge the schema of a built-in kind (``SchemaStrategy``). It owns no
objects and no HTTP; a validator is built once per kind and cached.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

from seedance.testing.kube_api.errors import Cause
from seedance.testing.kube_api.resources import ResourceType

__all__ = [
    "KUBERNETES_VERSION",
    "BuiltinSchemas",
    "CustomSchema",
    "SchemaStrategy",
    "json_path",
    "validate_name",
]

#: The Kubernetes version whose schemas built-in kinds are checked against; the same one
#: tools/gen/vendor_schemas.py vendors for the deployment tests.
KUBERNETES_VERSION = "v1.33.0"
_SCHEMA_DIR = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: Kinds whose names are path segments, not DNS subdomains (``system:controller:...``).
_PATH_SEGMENT_NAMED = frozenset({"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"})


def json_path(path: Iterator[Any] | list[Any] | tuple[Any, ...]) -> str:
    """``["spec", "containers", 0, "image"]`` -> ``spec.containers[0].image``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validate_name(kind: str, name: str) -> list[Cause]:
    if not name:
        return [
            Cause(
                field="metadata.name",
                message="Required value: name or generateName is required",
                reason="FieldValueRequired",
            )
        ]
    if kind in _PATH_SEGMENT_NAMED:
        bad = any(c in name for c in "/%") or name in (".", "..")
    else:
        bad = len(name) > 253 or not _DNS_SUBDOMAIN.match(name)
    if bad:
        return [
            Cause(
                field="metadata.name",
                message=f'Invalid value: "{name}": a lowercase RFC '
                "1123 subdomain must consist of lower case alphanumeric characters, '-' "
                "or '.'",
            )
        ]
    return []


# --- built-in kinds -------------------------------------------------------------------------


def _cause_of(err: jsonschema.ValidationError) -> Cause:
    path = list(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(
            (err.schema or {}).get("properties", {}) if isinstance(err.schema, dict) else ()
        )
        extra = sorted(k for k in err.instance if k not in allowed)
        if extra:
            field = json_path([*path, extra[0]])
            return Cause(
                field=field, message=f'unknown field "{field}"', reason="FieldValueInvalid"
            )
    if err.validator == "required":
        return Cause(
            field=json_path(path) or "<root>",
            message=f"Required value: {err.message}",
            reason="FieldValueRequired",
        )
    return Cause(field=json_path(path) or "<root>", message=f"Invalid value: {err.message}")


class BuiltinSchemas:
    """The JSON schemas of one Kubernetes version; a validator per kind, built on first use."""

    def __init__(self, version: str = KUBERNETES_VERSION) -> None:
        self.dir = _SCHEMA_DIR / f"{version}-local-strict"
        if not self.dir.is_dir():
            raise ValueError(f"kubernetes-validate ships no schemas for {version}")
        self.defs: dict[str, Any] = json.loads((self.dir / "_definitions.json").read_text())
        self._registry: Registry[Any] = Resource.from_contents(self.defs) @ Registry()
        self._validators: dict[str, jsonschema.Draft202012Validator | None] = {}
        self._kinds: dict[str, dict[str, Any] | None] = {}

    def kind_schema(self, stem: str) -> dict[str, Any] | None:
        if stem not in self._kinds:
            path = self.dir / f"{stem}.json"
            self._kinds[stem] = json.loads(path.read_text()) if path.exists() else None
        return self._kinds[stem]

    def _validator(self, stem: str) -> jsonschema.Draft202012Validator | None:
        if stem not in self._validators:
            schema = self.kind_schema(stem)
            self._validators[stem] = (
                None
                if schema is None
                else jsonschema.Draft202012Validator(
                    schema, registry=Resource.from_contents(schema) @ self._registry
                )
            )
        return self._validators[stem]

    def has(self, stem: str) -> bool:
        return self._validator(stem) is not None

    def validate(self, stem: str, obj: dict[str, Any]) -> list[Cause]:
        validator = self._validator(stem)
        if validator is None:
            return []
        errors = sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
        return [_cause_of(e) for e in errors]

    def strategy(self, stem: str) -> SchemaStrategy | None:
        schema = self.kind_schema(stem)
        return None if schema is None else SchemaStrategy(schema, self.defs["$defs"])


@dataclass(frozen=True)
class SchemaStrategy:
    """A node of a built-in kind's schema, for strategic merge (``patch.Strategy``)."""

    node: dict[str, Any]
    defs: dict[str, Any]

    def _resolved(self) -> dict[str, Any]:
        node = self.node
        for _ in range(8):  # $ref chains are short; the bound guards a cycle
            ref = node.get("$ref")
            if ref is None and node.get("allOf"):
                ref = node["allOf"][0].get("$ref")
            if not isinstance(ref, str):
                break
            node = self.defs.get(ref.rsplit("/", 1)[1], {})
        return node

    def field(self, name: str) -> SchemaStrategy | None:
        props = self._resolved().get("properties") or {}
        sub = props.get(name)
        return SchemaStrategy(sub, self.defs) if isinstance(sub, dict) else None

    def item(self) -> SchemaStrategy | None:
        items = self._resolved().get("items")
        return SchemaStrategy(items, self.defs) if isinstance(items, dict) else None

    def merge_key(self) -> str | None:
        key = self.node.get("x-kubernetes-patch-merge-key")
        return key if isinstance(key, str) else None

    def merges(self) -> bool:
        return "merge" in str(self.node.get("x-kubernetes-patch-strategy", ""))


# --- custom resources -----------------------------------------------------------------------


def _to_jsonschema(node: Any) -> Any:
    """An OpenAPI v3 structural schema as JSON Schema (for the type/enum/range checks)."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "default", "description"):
            continue
        if key == "properties":
            out[key] = {k: _to_jsonschema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = _to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_to_jsonschema(v) for v in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **out}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def _uses_old_self(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


@dataclass(frozen=True)
class _Rule:
    rule: str
    message: str
    message_expression: str
    field_path: str
    reason: str

    @property
    def transition(self) -> bool:
        return _uses_old_self(self.rule)


class _Cel:
    """cel-python programs, compiled once per expression."""

    def __init__(self) -> None:
        self.env = celpy.Environment()
        self._programs: dict[str, Any] = {}

    def evaluate(self, expr: str, bindings: dict[str, Any]) -> Any:
        prog = self._programs.get(expr)
        if prog is None:
            prog = self.env.program(self.env.compile(expr))
            self._programs[expr] = prog
        return prog.evaluate({k: celpy.json_to_cel(v) for k, v in bindings.items()})


@dataclass
class _Walk:
    strict: bool
    unknown: list[str]
    causes: list[Cause]


class CustomSchema:
    """One CR version's ``openAPIV3Schema``: pruning and defaults, schema checks, CEL rules."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        body = copy.deepcopy(_to_jsonschema(schema))
        for meta in ("metadata", "apiVersion", "kind"):
            (body.get("properties") or {}).pop(meta, None)
        self._validator = jsonschema.Draft202012Validator(body)
        self._cel = _Cel()

    # pruning ----------------------------------------------------------------------------
    def prune(self, obj: dict[str, Any], *, strict: bool) -> tuple[dict[str, Any], list[str]]:
        """The object with unknown fields dropped and defaults applied, and the dropped paths
        (which a ``fieldValidation=Strict`` request refuses instead)."""
        out = {k: v for k, v in obj.items() if k in ("apiVersion", "kind", "metadata")}
        rest = {k: v for k, v in obj.items() if k not in out}
        walk = _Walk(strict=strict, unknown=[], causes=[])
        pruned = self._prune_node(rest, self.schema, [], walk, root=True)
        out.update(pruned)
        return out, walk.unknown

    def _prune_node(
        self, value: Any, node: dict[str, Any], path: list[Any], walk: _Walk, root: bool = False
    ) -> Any:
        if isinstance(value, dict):
            return self._prune_map(value, node, path, walk, root)
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            return [
                self._prune_node(v, node["items"], [*path, i], walk) for i, v in enumerate(value)
            ]
        return value

    def _prune_map(
        self, value: dict[str, Any], node: dict[str, Any], path: list[Any], walk: _Walk, root: bool
    ) -> dict[str, Any]:
        props: dict[str, Any] = node.get("properties") or {}
        extra = node.get("additionalProperties")
        keep_unknown = bool(node.get("x-kubernetes-preserve-unknown-fields"))
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if key in props:
                out[key] = self._prune_node(sub, props[key], [*path, key], walk)
            elif isinstance(extra, dict):
                out[key] = self._prune_node(sub, extra, [*path, key], walk)
            elif keep_unknown or extra is True:
                out[key] = sub
            elif not (root and key in ("apiVersion", "kind", "metadata")):
                walk.unknown.append(json_path([*path, key]))
        for key, sub in props.items():
            if key not in out and isinstance(sub, dict) and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
        return out

    # checks -----------------------------------------------------------------------------
    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        causes = [_cause_of(e) for e in self._validator.iter_errors(body)]
        if causes:
            return causes
        old_body = (
            None
            if old is None
            else {k: v for k, v in old.items() if k not in ("apiVersion", "kind", "metadata")}
        )
        # A root rule may read metadata.name and metadata.generateName, and nothing else of
        # the metadata (as the real server binds it).
        self._rules(_with_names(body, obj), _with_names(old_body, old), self.schema, [], causes)
        return causes

    def _rules(
        self, value: Any, old: Any, node: dict[str, Any], path: list[Any], causes: list[Cause]
    ) -> None:
        for raw in node.get("x-kubernetes-validations") or ():
            rule = _Rule(
                rule=raw["rule"],
                message=raw.get("message", ""),
                message_expression=raw.get("messageExpression", ""),
                field_path=raw.get("fieldPath", ""),
                reason=raw.get("reason", "FieldValueInvalid"),
            )
            cause = self._check(rule, value, old, path, str(node.get("type", "object")))
            if cause is not None:
                causes.append(cause)
        self._descend(value, old, node, path, causes)

    def _descend(
        self, value: Any, old: Any, node: dict[str, Any], path: list[Any], causes: list[Cause]
    ) -> None:
        if isinstance(value, dict):
            props: dict[str, Any] = node.get("properties") or {}
            extra = node.get("additionalProperties")
            for key, sub in value.items():
                sub_node = props.get(key, extra if isinstance(extra, dict) else None)
                if sub_node is not None:
                    sub_old = old.get(key) if isinstance(old, dict) else None
                    self._rules(sub, sub_old, sub_node, [*path, key], causes)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            # List items are correlated with the old list only for map lists (as the real
            # server does); others see no oldSelf, so their transition rules are skipped.
            olds = self._correlate(value, old, node)
            for i, item in enumerate(value):
                self._rules(item, olds[i], node["items"], [*path, i], causes)

    @staticmethod
    def _correlate(value: list[Any], old: Any, node: dict[str, Any]) -> list[Any]:
        keys = node.get("x-kubernetes-list-map-keys")
        if node.get("x-kubernetes-list-type") != "map" or not keys or not isinstance(old, list):
            return [None] * len(value)
        by_key = {tuple(o.get(k) for k in keys): o for o in old if isinstance(o, dict)}
        return [
            by_key.get(tuple(v.get(k) for k in keys)) if isinstance(v, dict) else None
            for v in value
        ]

    def _check(
        self, rule: _Rule, value: Any, old: Any, path: list[Any], node_type: str
    ) -> Cause | None:
        if rule.transition and old is None:
            return None
        bindings = {"self": value}
        if rule.transition:
            bindings["oldSelf"] = old
        field = json_path(path) or "<root>"
        if rule.field_path:
            field = (json_path(path) + rule.field_path) if path else rule.field_path.lstrip(".")
        try:
            result = self._cel.evaluate(rule.rule, bindings)
        except Exception as exc:  # cel-python raises its own error types for a bad rule
            return Cause(field=field, message=f"Invalid value: rule {rule.rule!r}: {exc}")
        if isinstance(result, Exception) or not isinstance(result, celpy.celtypes.BoolType):
            return Cause(field=field, message=f"Invalid value: rule {rule.rule!r}: {result}")
        if bool(result):
            return None
        message = rule.message or f"failed rule: {rule.rule}"
        if rule.message_expression:
            try:
                message = str(self._cel.evaluate(rule.message_expression, bindings))
            except Exception:  # the real server falls back to message on a failing expression
                message = rule.message or f"failed rule: {rule.rule}"
        # The real server names the schema type, not the value: `Invalid value: "object": ...`.
        return Cause(field=field, message=f'Invalid value: "{node_type}": {message}')


def _with_names(body: dict[str, Any] | None, obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if body is None or obj is None:
        return body
    meta = obj.get("metadata") or {}
    names = {k: meta[k] for k in ("name", "generateName") if k in meta}
    return {**body, "metadata": names} if names else body


@cache
def builtin_schemas(version: str = KUBERNETES_VERSION) -> BuiltinSchemas:
    return BuiltinSchemas(version)


def resource_stem(rt: ResourceType) -> str:
    return rt.schema_stem
