"""deploy/k8s/crds: the CRDs are valid apiextensions/v1 objects; the examples validate against
the CRDs' own schemas; each CEL rule refuses the invalid example written for it and accepts the
valid ones; the reconciler (seedance.k8s_bridge.core.policy) agrees with the rules.

CEL is evaluated with cel-python (`celpy`) the way the API server does: a rule at a schema node
runs with `self` bound to the value there, only where the value is present, and a transition
rule (one that names `oldSelf`) only on an update where the old object has that value too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from seedance.events.gpus import MIG_GPU_INSTANCE_PATTERN, mig_gpu_instance
from seedance.k8s_bridge.core.policy import (
    ACCEPTED,
    MIG_PROFILE,
    READY,
    SLICING_POLICY,
    TENANT_QUOTA,
    reconcile,
)
from tests.unit.deploy.declared import DEPLOY
from tests.unit.deploy.test_k8s import errors_of

CRDS = DEPLOY / "k8s" / "crds"
EXAMPLES = DEPLOY / "k8s" / "examples"
VIOLATES = "seedance.io/example-violates"


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def crds() -> dict[str, dict[str, Any]]:
    """kind -> CRD, from every *.yaml in deploy/k8s/crds (what `kubectl apply -f` reads)."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in load_all(path):
            out[doc["spec"]["names"]["kind"]] = doc
    return out


def schema_of(kind: str) -> dict[str, Any]:
    (version,) = crds()[kind]["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def as_json_schema(node: Any) -> Any:
    """An openAPIV3Schema as a JSON Schema that also refuses unknown fields.

    The API server prunes an unknown field silently; an example with a misspelt field should
    fail here instead. `x-kubernetes-int-or-string` becomes integer-or-string."""
    if isinstance(node, list):
        return [as_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("properties") and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


def schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(as_json_schema(schema_of(doc["kind"])))
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]


def rules_at(schema: dict[str, Any], value: Any, path: str) -> Iterator[tuple[str, dict, Any]]:
    """(path, rule, value) for every CEL rule whose node is present in `value`."""
    for rule in schema.get("x-kubernetes-validations", ()):
        yield path, rule, value
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from rules_at(sub, value[key], f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, v in value.items():
                yield from rules_at(extra, v, f"{path}[{key}]")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            yield from rules_at(schema["items"], v, f"{path}[{i}]")


def value_at(doc: Any, path: str) -> tuple[bool, Any]:
    """The value of `doc` at a `rules_at` path (present?, value)."""
    node = doc
    for part in path.replace("[", ".[").split(".")[1:]:
        key: Any = part
        if part.startswith("["):
            key = part[1:-1]
            if isinstance(node, list):
                key = int(key)
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, node


ENV = celpy.Environment()


@cache
def program(rule: str) -> Any:
    return ENV.program(ENV.compile(rule))


def cel_failures(doc: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the CEL rules `doc` breaks (on an update from `old`, when given)."""
    failed = []
    for path, rule, value in rules_at(schema_of(doc["kind"]), doc, ""):
        activation = {"self": celpy.json_to_cel(value)}
        if "oldSelf" in rule["rule"]:
            present, before = value_at(old, path) if old is not None else (False, None)
            if not present:
                continue  # transition rules run on updates only
            activation["oldSelf"] = celpy.json_to_cel(before)
        result = program(rule["rule"]).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), f"{rule['rule']} gave {result!r}"
        if not result:
            failed.append(rule["message"])
    return failed


def valid_examples() -> list[dict[str, Any]]:
    return [d for p in sorted(EXAMPLES.glob("*.yaml")) for d in load_all(p)]


def invalid_examples() -> dict[str, tuple[dict[str, Any] | None, dict[str, Any]]]:
    """file stem -> (the old object of an update or None, the object refused)."""
    out = {}
    for path in sorted((EXAMPLES / "invalid").glob("*.yaml")):
        docs = load_all(path)
        out[path.stem] = (docs[0], docs[1]) if len(docs) == 2 else (None, docs[0])
    return out


def all_rules() -> list[str]:
    return [rule["message"] for kind in crds() for rule in _walk_rules(schema_of(kind))]


def _walk_rules(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", ())
        for key, v in node.items():
            if key != "x-kubernetes-validations":
                yield from _walk_rules(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_rules(v)


# --- the CRDs themselves -------------------------------------------------------------------


def test_the_crds_are_valid_apiextensions_v1_objects() -> None:
    assert set(crds()) == {"SlicingPolicy", "TenantQuota"}
    for kind, crd in crds().items():
        assert errors_of(crd) == [], kind
        spec = crd["spec"]
        assert (spec["group"], spec["scope"]) == ("seedance.io", "Cluster")
        assert crd["metadata"]["name"] == f"{spec['names']['plural']}.seedance.io"
        (version,) = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
        assert version["subresources"] == {"status": {}}
        assert spec["names"]["shortNames"]
        assert any(c["name"] == "Ready" for c in version["additionalPrinterColumns"])


def test_the_carried_crd_schema_rejects_what_the_api_server_would() -> None:
    crd = copy.deepcopy(crds()["TenantQuota"])
    crd["spec"]["versions"][0]["served"] = "yes"
    assert errors_of(crd)
    crd = copy.deepcopy(crds()["TenantQuota"])
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = [
        {"rul": "self.spec.tenant != ''"}  # misspelt
    ]
    assert errors_of(crd)


def structural_problems(node: Any, path: str = "") -> Iterator[str]:
    """What makes a schema non-structural (apiextensions' rules that matter here): every node
    has a type (or is int-or-string / preserves unknown fields), and `properties` and
    `additionalProperties` are not used together."""
    if not isinstance(node, dict):
        return
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        yield f"{path}: no type"
    if "properties" in node and "additionalProperties" in node:
        yield f"{path}: properties and additionalProperties together"
    for key, sub in (node.get("properties") or {}).items():
        yield from structural_problems(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from structural_problems(node["additionalProperties"], f"{path}[*]")
    if "items" in node:
        yield from structural_problems(node["items"], f"{path}[]")


@pytest.mark.parametrize("kind", ["SlicingPolicy", "TenantQuota"])
def test_the_schemas_are_structural_and_bounded_for_cel(kind: str) -> None:
    schema = schema_of(kind)
    assert list(structural_problems(schema)) == []
    # The API server estimates each rule's cost from maxItems/maxProperties/maxLength: an
    # unbounded list or map under a rule makes it refuse the CRD.
    for path, rule, value in rules_at(schema, _skeleton(schema), ""):
        del rule, value
        node = _node_at(schema, path)
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def _skeleton(schema: dict[str, Any]) -> Any:
    """A value with every property present (one element per list, one key per map)."""
    if schema.get("type") == "array":
        return [_skeleton(schema["items"])]
    if schema.get("type") == "object":
        if isinstance(schema.get("additionalProperties"), dict):
            return {"k": _skeleton(schema["additionalProperties"])}
        return {k: _skeleton(v) for k, v in (schema.get("properties") or {}).items()}
    return None


def _node_at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    node = schema
    for part in path.replace("[", ".[").split(".")[1:]:
        if part.startswith("["):
            node = node["items"] if node.get("type") == "array" else node["additionalProperties"]
        else:
            node = node["properties"][part]
    return node


def test_the_mig_rules_and_the_reconcilers_use_one_expression() -> None:
    """A quota's MIG keys: the one MIG parser's syntax (``gpus.MIG_GPU_INSTANCE_PATTERN``); a
    SlicingPolicy's default profile: the reconciler's ``MIG_PROFILE`` (what a placement names)."""
    as_cel = {  # as written inside a CEL string: \\.
        "TenantQuota": json.dumps(MIG_GPU_INSTANCE_PATTERN)[1:-1],
        "SlicingPolicy": json.dumps(MIG_PROFILE.pattern)[1:-1],
    }
    for kind, pattern in as_cel.items():
        mig_rules = [r["rule"] for r in _walk_rules(schema_of(kind)) if "matches(" in r["rule"]]
        assert mig_rules, kind
        assert all(f"'{pattern}'" in r for r in mig_rules), mig_rules


#: MIG keys as real systems write them (NVML, the device plugin's resources, mig-parted's config)
#: and keys that are none; the CRD's rule and the slicer's reading must agree on each.
QUOTA_KEYS = [
    "1g.10gb", "3g.40gb", "1g.10gb+me", "1g.10gb.me", "1G.10GB", "1g.24gb-me", "1g.24gb+me.all",
    "1g.24gb.me.all", "1g.12gb+gfx", "2g.48gb.gfx", "7g.141gb",
    "3g-40gb", "1c.3g.20gb", "07g.80gb", "1g.10gb+foo", " 3g.40gb", "1g", "g.10gb",
    # RE2 ends a match at the end of the text and reads only ASCII digits; Python's ``$`` and
    # ``\d`` did not (a trailing newline, an Arabic-Indic zero)
    "1g.10gb\n", "1g.1\u0660gb", "1\u0660g.10gb", "1g.10gb\n\n",
]  # fmt: skip


@pytest.mark.parametrize("key", QUOTA_KEYS)
def test_the_quota_crd_admits_a_mig_key_exactly_where_the_parser_reads_one(key: str) -> None:
    """The API server's rule admits what ``gpus.mig_gpu_instance`` reads, and nothing the
    parser refuses as no name (a GPU instance no GPU holds, ``9g.80gb``, is the reconciler's
    to refuse, naming it: no regular expression knows the GPUs)."""
    (doc,) = [copy.deepcopy(d) for d in valid_examples() if d["metadata"]["name"] == "team-a"]
    doc["spec"]["quota"]["mig"] = {key: 1}
    try:
        mig_gpu_instance(key)
        parsed = True
    except ValueError:
        parsed = False
    assert (cel_failures(doc) == []) is parsed, key
    out = reconcile([], [doc], priority_classes=PRIORITY_CLASSES)
    states = {c["type"]: c["status"] for c in out.statuses[(TENANT_QUOTA, "team-a")]["conditions"]}
    assert states[READY] == ("True" if parsed else "False"), key


def test_a_quota_in_the_device_plugins_spelling_reports_usage_under_the_placements_name() -> None:
    """``1g.10gb.me`` in a CR is ``1g.10gb+me``, the dimension the slicer reports usage in: the
    CR's status counts the slicer's usage against it (borrowing nothing)."""
    (doc,) = [copy.deepcopy(d) for d in valid_examples() if d["metadata"]["name"] == "team-a"]
    doc["spec"]["quota"]["mig"] = {"1g.10gb.me": 2}
    doc["spec"].pop("lendingLimit", None)
    doc["spec"].pop("borrowingLimit", None)
    tenant = doc["spec"]["tenant"]
    out = reconcile(
        [], [doc], priority_classes=PRIORITY_CLASSES, usage={tenant: {"mig/1g.10gb+me": 2}}
    )
    status = out.statuses[(TENANT_QUOTA, "team-a")]
    assert {c["type"]: c["status"] for c in status["conditions"]}[READY] == "True"
    assert status["usage"]["mig"] == {"1g.10gb+me": 2}
    assert "mig" not in status.get("borrowed", {})


def test_two_spellings_of_one_mig_profile_in_one_quota_are_refused_by_name() -> None:
    (doc,) = [copy.deepcopy(d) for d in valid_examples() if d["metadata"]["name"] == "team-a"]
    doc["spec"]["quota"]["mig"] = {"1g.10gb+me": 1, "1g.10gb.me": 2}
    doc["spec"].pop("lendingLimit", None)
    doc["spec"].pop("borrowingLimit", None)
    out = reconcile([], [doc], priority_classes=PRIORITY_CLASSES)
    conditions = {c["type"]: c for c in out.statuses[(TENANT_QUOTA, "team-a")]["conditions"]}
    assert conditions[READY]["status"] == conditions[ACCEPTED]["status"] == "False"
    assert "'1g.10gb.me' is a second key for mig/1g.10gb+me" in conditions[ACCEPTED]["message"]


def all_rules_raw() -> list[dict[str, Any]]:
    return [rule for kind in crds() for rule in _walk_rules(schema_of(kind))]


# --- examples ------------------------------------------------------------------------------


def test_the_valid_examples_pass_the_schemas_and_every_rule() -> None:
    docs = valid_examples()
    assert {d["kind"] for d in docs} == {"SlicingPolicy", "TenantQuota"}
    for doc in docs:
        assert schema_errors(doc) == [], doc["metadata"]["name"]
        assert cel_failures(doc) == [], doc["metadata"]["name"]
        assert cel_failures(doc, old=doc) == []  # an update that changes nothing


def test_every_rule_has_an_invalid_example_that_it_alone_refuses() -> None:
    examples = invalid_examples()
    covered = set()
    for stem, (old, doc) in examples.items():
        assert schema_errors(doc) == [], stem  # only CEL can say what is wrong here
        assert cel_failures(doc, old) == [doc["metadata"]["annotations"][VIOLATES]], stem
        covered.add(doc["metadata"]["annotations"][VIOLATES])
    assert covered == set(all_rules())


def test_the_transition_rule_accepts_a_create_and_refuses_only_a_rename() -> None:
    old, renamed = invalid_examples()["tenant-renamed"]
    assert old is not None
    assert cel_failures(renamed) == []  # a create of the renamed object is fine
    assert cel_failures(old, old) == []


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [
        ("TenantQuota", lambda s: s["quota"].update(gpus=-1)),
        ("TenantQuota", lambda s: s["quota"].update(gpu=1)),  # misspelt
        ("TenantQuota", lambda s: s.update(tenant="Team_A")),
        ("TenantQuota", lambda s: s.pop("quota")),
        ("TenantQuota", lambda s: s["quota"]["mig"].update({"1g.10gb": "seven"})),
        ("SlicingPolicy", lambda s: s.update(placementPolicy="random")),
        ("SlicingPolicy", lambda s: s["sharedGpu"][0].update(replicas=1)),
        ("SlicingPolicy", lambda s: s["sharedGpu"][0].update(mode="vgpu")),
    ],
)
def test_the_schemas_refuse_what_needs_no_rule(kind: str, mutate: Any) -> None:
    # The examples that use every field (team-a's quota has MIG; acme's does not)
    (doc,) = [
        copy.deepcopy(d)
        for d in valid_examples()
        if d["kind"] == kind and d["metadata"]["name"] in ("team-a", "default")
    ]
    assert schema_errors(doc) == []
    mutate(doc["spec"])
    assert schema_errors(doc)


# --- the reconciler agrees with the rules --------------------------------------------------

#: The PriorityClasses the install ships (deploy/k8s/seedance-system/priorityclasses.yaml).
PRIORITY_CLASSES = {"seedance-high": 1000, "seedance-normal": 100, "seedance-low": 0}


def test_the_reconciler_accepts_the_valid_examples() -> None:
    docs = valid_examples()
    out = reconcile(
        [d for d in docs if d["kind"] == SLICING_POLICY],
        [d for d in docs if d["kind"] == TENANT_QUOTA],
        priority_classes=PRIORITY_CLASSES,
    )
    for (kind, name), status in out.statuses.items():
        states = {c["type"]: c["status"] for c in status["conditions"]}
        # A SlicingPolicy is Ready only once a slicer said it applied it (no slicer here).
        ready = "False" if kind == SLICING_POLICY else "True"
        assert states == {ACCEPTED: "True", READY: ready}, (kind, name, status)
    assert len(out.statuses) == len(docs)
    assert out.namespaces == {
        "team-a": "team-a",
        "team-a-batch": "team-a",
        "team-b": "team-b",
        "acme": "acme",
    }


@pytest.mark.parametrize(
    "stem", sorted({p.stem for p in (EXAMPLES / "invalid").glob("*.yaml")} - {"tenant-renamed"})
)
def test_the_reconciler_refuses_what_a_rule_refuses(stem: str) -> None:
    """A CR stored before a rule existed (or by a server without CEL) is refused again by the
    reconciler; the transition rule is the API server's alone (it needs the old object)."""
    _, doc = invalid_examples()[stem]
    kind = doc["kind"]
    out = reconcile([doc] if kind == SLICING_POLICY else [], [doc] if kind == TENANT_QUOTA else [])
    states = {
        c["type"]: c["status"] for c in out.statuses[(kind, doc["metadata"]["name"])]["conditions"]
    }
    assert states[READY] == "False", stem
    assert out.quota_document is None
    assert out.slicing is None


def test_the_lending_rule_says_it_compares_mig_keys_as_written() -> None:
    """CEL cannot read a key as the parser does, so the rule holds lendingLimit.mig to
    quota.mig's spelling and its message says so: lending 1 of a quota of 2 is not "more
    than the quota" because one is written as the device plugin writes it."""
    (doc,) = [copy.deepcopy(d) for d in valid_examples() if d["metadata"]["name"] == "team-a"]
    doc["spec"]["quota"]["mig"] = {"1g.10gb.me": 2}
    doc["spec"]["lendingLimit"] = {"mig": {"1g.10gb+me": 1}}
    (message,) = cel_failures(doc)
    assert "spelled as there" in message, message
    assert "exceed" in message, message
    doc["spec"]["lendingLimit"] = {"mig": {"1g.10gb.me": 1}}
    assert cel_failures(doc) == []
    doc["spec"]["lendingLimit"] = {"mig": {"1g.10gb.me": 3}}
    assert cel_failures(doc) == [message]
