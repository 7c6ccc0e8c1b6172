"""The CR reconciler's pure core: documents, bindings, statuses; and that it agrees with the
slicer's own quota parser on what is valid (services never import each other; tests may)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from seedance.events.slicing_policy import SlicingApplied, digest, encode_policy, from_spec
from seedance.k8s_bridge.core.policy import (
    ACCEPTED,
    READY,
    SLICING_POLICY,
    TENANT_QUOTA,
    Reason,
    merge_applied,
    merge_usage,
    reconcile,
    tenant_entry,
)
from seedance.slicer.core.quota import QuotaError, QuotaPolicy, QuotaRequest, QuotaTracker

CLASSES = {"high": 1000, "normal": 100, "low": 0}


def quota(
    name: str, created: str = "2026-01-01T00:00:00Z", generation: int = 1, **spec: Any
) -> dict[str, Any]:
    spec.setdefault("tenant", name)
    spec.setdefault("quota", {"gpus": 4})
    return {
        "apiVersion": "seedance.io/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name, "creationTimestamp": created, "generation": generation},
        "spec": spec,
    }


def policy(name: str = "default", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "seedance.io/v1alpha1",
        "kind": "SlicingPolicy",
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z", "generation": 2},
        "spec": spec,
    }


def conditions(status: Any) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_a_cohort_of_two_becomes_the_slicer_document_and_the_slicer_parses_it() -> None:
    a = quota(
        "team-a",
        namespaces=["team-a", "team-a-batch"],
        cohort="research",
        quota={"gpus": 8, "sharedGpus": 16, "gpuMemMiB": 655360, "mig": {"1g.10gb": 7}},
        lendingLimit={"gpus": 4},
        borrowingLimit={"gpus": 4, "mig": {"1g.10gb": 2}},
        defaultPriority="normal",
        maxPriority="high",
    )
    b = quota("team-b", namespaces=["team-b"], cohort="research", quota={"gpus": 4})
    out = reconcile([], [a, b], priority_classes=CLASSES)
    assert out.quota_document == {
        "version": 1,
        "priority_classes": {"high": 1000, "low": 0, "normal": 100},
        "tenants": {
            "team-a": {
                "quota": {
                    "gpus": 8,
                    "shared_gpus": 16,
                    "gpu_mem_mib": 655360,
                    "mig": {"1g.10gb": 7},
                },
                "cohort": "research",
                "lending_limit": {"gpus": 4},
                "borrowing_limit": {"gpus": 4, "mig": {"1g.10gb": 2}},
                "default_priority": "normal",
                "max_priority": "high",
            },
            "team-b": {"quota": {"gpus": 4}, "cohort": "research"},
        },
    }
    assert out.namespaces == {"team-a": "team-a", "team-a-batch": "team-a", "team-b": "team-b"}
    parsed = QuotaPolicy.from_yaml(yaml.safe_dump(dict(out.quota_document or {})))
    ta = parsed.tenants["team-a"]
    assert ta.nominal == {"gpus": 8, "shared_gpus": 16, "gpu_mem_mib": 655360, "mig/1g.10gb": 7}
    assert (ta.default_priority, ta.max_priority, ta.lendable("gpus")) == (100, 1000, 4)
    assert ta.borrowing_limit == {"gpus": 4, "mig/1g.10gb": 2}
    for name in ("team-a", "team-b"):
        assert conditions(out.statuses[(TENANT_QUOTA, name)]) == {
            ACCEPTED: ("True", Reason.VALID),
            READY: ("True", Reason.IN_FORCE),
        }


def test_no_accepted_quota_means_no_document() -> None:
    out = reconcile([], [quota("a", quota={"gpus": -1})])
    assert out.quota_document is None
    assert out.namespaces == {}
    assert conditions(out.statuses[(TENANT_QUOTA, "a")]) == {
        ACCEPTED: ("False", Reason.INVALID_SPEC),
        READY: ("False", Reason.NOT_ACCEPTED),
    }


def test_a_namespace_claimed_twice_stays_with_the_oldest_claim() -> None:
    old = quota("a", created="2026-01-01T00:00:00Z", namespaces=["shared", "a"])
    new = quota("b", created="2026-01-02T00:00:00Z", namespaces=["shared", "b"])
    for order in ([old, new], [new, old]):
        out = reconcile([], order)
        assert out.namespaces == {"a": "a", "b": "b", "shared": "a"}
        status = out.statuses[(TENANT_QUOTA, "b")]
        assert conditions(status) == {
            ACCEPTED: ("True", Reason.VALID),
            READY: ("False", Reason.NAMESPACE_CONFLICT),
        }
        (ready,) = [c for c in status["conditions"] if c["type"] == READY]
        assert "'shared'" in ready["message"]
        assert "tenant 'a'" in ready["message"]
        assert conditions(out.statuses[(TENANT_QUOTA, "a")])[READY] == ("True", Reason.IN_FORCE)
        # b's quota is still enforced for its other namespace
        assert set((out.quota_document or {})["tenants"]) == {"a", "b"}


def test_two_crs_naming_one_tenant_the_newer_is_refused() -> None:
    first = quota("first", created="2026-01-01T00:00:00Z", tenant="team", namespaces=["x"])
    second = quota("second", created="2026-01-03T00:00:00Z", tenant="team", namespaces=["y"])
    out = reconcile([], [second, first])
    assert out.namespaces == {"x": "team"}
    assert conditions(out.statuses[(TENANT_QUOTA, "second")])[ACCEPTED] == (
        "False",
        Reason.DUPLICATE_TENANT,
    )
    assert (out.quota_document or {})["tenants"].keys() == {"team"}


def test_a_cohort_with_one_member_is_in_force_but_says_so() -> None:
    out = reconcile([], [quota("a", cohort="lonely"), quota("b")])
    assert conditions(out.statuses[(TENANT_QUOTA, "a")]) == {
        ACCEPTED: ("True", Reason.VALID),
        READY: ("True", Reason.COHORT_HAS_ONE_MEMBER),
    }
    assert conditions(out.statuses[(TENANT_QUOTA, "b")])[READY] == ("True", Reason.IN_FORCE)


def test_an_unknown_priority_class_keeps_the_quota_out() -> None:
    out = reconcile(
        [], [quota("a", defaultPriority="gold", namespaces=["a"])], priority_classes=CLASSES
    )
    assert out.quota_document is None
    assert out.namespaces == {}
    status = out.statuses[(TENANT_QUOTA, "a")]
    assert conditions(status)[ACCEPTED] == ("False", Reason.UNKNOWN_PRIORITY_CLASS)
    assert "'gold'" in status["conditions"][0]["message"]
    ok = reconcile([], [quota("a", defaultPriority="low")], priority_classes=CLASSES)
    assert ok.quota_document is not None


def test_usage_and_borrowing_are_written_in_the_crs_names() -> None:
    a = quota("a", cohort="c", quota={"gpus": 2, "mig": {"3g.40gb": 1}})
    b = quota("b", cohort="c")
    used = {"a": {"gpus": 3, "mig/3g.40gb": 1, "gpu_mem_mib": 1024, "shared_gpus": 2}}
    out = reconcile([], [a, b], usage=used)
    status = out.statuses[(TENANT_QUOTA, "a")]
    assert status["usage"] == {"gpus": 3, "gpuMemMiB": 1024, "mig": {"3g.40gb": 1}, "sharedGpus": 2}
    # 1 GPU over nominal 2; shared_gpus has nominal 0; gpu_mem_mib is not enforced here
    assert status["borrowed"] == {"gpus": 1, "sharedGpus": 2}
    assert out.statuses[(TENANT_QUOTA, "b")]["usage"] == {}


def test_the_usage_matches_the_slicers_own_borrowed_figure() -> None:
    a = quota("a", cohort="c", quota={"gpus": 2, "sharedGpus": 1})
    b = quota("b", cohort="c", quota={"gpus": 4})
    out = reconcile([], [a, b])
    tracker = QuotaTracker(QuotaPolicy.from_yaml(yaml.safe_dump(dict(out.quota_document or {}))))
    for i in range(4):
        tracker.admit(QuotaRequest(workload_id=f"w{i}", tenant="a", gpus=1))
    tracker.admit(QuotaRequest(workload_id="s", tenant="a", gpus=1, milli=500))
    used = {"a": dict(tracker.usage("a"))}
    status = reconcile([], [a, b], usage=used).statuses[(TENANT_QUOTA, "a")]
    # a borrowed b's idle GPUs; its one shared replica is within its own quota
    assert tracker.borrowed("a") == {"gpus": 2}
    assert status["borrowed"] == {"gpus": 2}
    assert status["usage"] == {"gpus": 4, "sharedGpus": 1}


def test_a_condition_keeps_its_transition_time_until_it_changes() -> None:
    cr = quota("a", generation=3)
    first = reconcile([], [cr], observed_at="2026-02-01T00:00:00Z").statuses[(TENANT_QUOTA, "a")]
    assert first["observedGeneration"] == 3
    assert {c["lastTransitionTime"] for c in first["conditions"]} == {"2026-02-01T00:00:00Z"}
    assert all(c["observedGeneration"] == 3 for c in first["conditions"])
    cr["status"] = copy.deepcopy(dict(first))
    again = reconcile([], [cr], observed_at="2026-02-02T00:00:00Z").statuses[(TENANT_QUOTA, "a")]
    assert again["conditions"] == first["conditions"]
    cr["spec"]["quota"] = {"gpus": "four"}
    bad = reconcile([], [cr], observed_at="2026-02-03T00:00:00Z").statuses[(TENANT_QUOTA, "a")]
    assert {c["lastTransitionTime"] for c in bad["conditions"]} == {"2026-02-03T00:00:00Z"}
    no_clock = reconcile([], [quota("b", created="2026-01-05T00:00:00Z")])
    (t,) = {c["lastTransitionTime"] for c in no_clock.statuses[(TENANT_QUOTA, "b")]["conditions"]}
    assert t == "2026-01-05T00:00:00Z"


def test_only_the_default_slicing_policy_is_in_force() -> None:
    spec = {
        "placementPolicy": "seedance",
        "mig": {"defaultProfile": "1g.10gb"},
        "sharedGpu": [{"gpuModel": "A100-SXM4-80GB", "mode": "mps", "replicas": 4}],
    }
    out = reconcile([policy("default", **spec), policy("other", **spec)], [])
    assert out.slicing == spec
    assert out.slicing_document == encode_policy(from_spec(spec))
    # Valid, but no slicer has said it applied it: not in force (a status never lies)
    assert conditions(out.statuses[(SLICING_POLICY, "default")]) == {
        ACCEPTED: ("True", Reason.VALID),
        READY: ("False", Reason.NOT_APPLIED),
    }
    assert conditions(out.statuses[(SLICING_POLICY, "other")])[READY] == (
        "False",
        Reason.NOT_THE_DEFAULT,
    )
    assert out.statuses[(SLICING_POLICY, "default")]["observedGeneration"] == 2


def test_a_slicing_policys_status_is_what_the_slicers_said_they_applied() -> None:
    spec = {"mig": {"defaultProfile": "1g.10gb"}}
    data = encode_policy(from_spec(spec))
    usage = {
        "usage.a": {"tenants": {}, "slicing": {"digest": digest(data), "key": "slicing"}},
        "usage.b": {"tenants": {}, "slicing": {"digest": "old", "key": "slicing"}},
        "usage.c": {"tenants": {}, "slicing": {"digest": "x", "key": "other-key"}},
        "usage.d": {"tenants": {}},  # a slicer that follows no SlicingPolicy key
        "usage.e": {"tenants": {}, "slicing": {"digest": 7}},  # malformed: never "applied"
    }
    applied = merge_applied(usage, "slicing")
    assert sorted(applied) == ["usage.a", "usage.b"]

    def ready(applied: dict[str, Any]) -> tuple[str, str, str]:
        out = reconcile([policy("default", **spec)], [], slicing_applied=applied)
        cond = {c["type"]: c for c in out.statuses[(SLICING_POLICY, "default")]["conditions"]}
        return cond[READY]["status"], cond[READY]["reason"], cond[READY]["message"]

    status, reason, message = ready(applied)
    assert (status, reason) == ("False", Reason.NOT_APPLIED)
    assert message == "the slicer of pool(s) b has not applied this spec yet"
    done = {"usage.a": applied["usage.a"]}
    assert ready(done) == ("True", Reason.IN_FORCE, "the slicer follows every field of this policy")
    partial = {
        "usage.a": SlicingApplied(
            digest=digest(data), key="slicing", unhonoured={"spec.mig.strategy": "not yet"}
        )
    }
    status, reason, message = ready(partial)
    assert (status, reason) == ("True", Reason.PARTIALLY_IN_FORCE)
    assert message == "the slicer follows it except spec.mig.strategy: not yet"


@pytest.mark.parametrize(
    "spec",
    [
        {"placementPolicy": "random"},
        {"mig": {"defaultProfile": "big"}},
        {"sharedGpu": [{"gpuModel": "H100"}, {"gpuModel": "H100"}]},
        {"sharedGpu": [{"gpuModel": "H100", "mode": "vgpu"}]},
    ],
)
def test_an_invalid_slicing_policy_is_refused_with_a_reason(spec: dict[str, Any]) -> None:
    out = reconcile([policy("default", **spec)], [])
    assert out.slicing is None
    assert conditions(out.statuses[(SLICING_POLICY, "default")])[ACCEPTED] == (
        "False",
        Reason.INVALID_SPEC,
    )


# --- agreement with the slicer's parser ---------------------------------------------------

#: Specs the slicer's parser must refuse, and the reconciler with it (mutations of a valid one).
INVALID = {
    "borrowing without a cohort": {"borrowingLimit": {"gpus": 1}},
    "lending without a cohort": {"lendingLimit": {"gpus": 1}},
    "lending above nominal": {"cohort": "c", "lendingLimit": {"gpus": 5}},
    "lending a dimension not held": {"cohort": "c", "lendingLimit": {"sharedGpus": 1}},
    "negative quota": {"quota": {"gpus": -1}},
    "a quota that is not a number": {"quota": {"gpus": "4"}},
    "a boolean quota": {"quota": {"gpus": True}},
    "an unknown resource": {"quota": {"cpus": 4}},
    "a malformed MIG profile": {"quota": {"mig": {"big": 1}}},
    "a negative MIG count": {"quota": {"mig": {"1g.10gb": -2}}},
    "max below default priority": {"defaultPriority": 10, "maxPriority": 5},
    "max class below default class": {"defaultPriority": "high", "maxPriority": "low"},
    "an unknown class": {"maxPriority": "platinum"},
    "an empty cohort": {"cohort": ""},
}
VALID = {
    "plain": {},
    "cohort with limits": {
        "cohort": "c",
        "lendingLimit": {"gpus": 4},
        "borrowingLimit": {"gpus": 9},
    },
    "mig and memory": {"quota": {"gpuMemMiB": 1, "mig": {"1g.10gb+me": 1, "7g.80gb": 0}}},
    "classes": {"defaultPriority": "low", "maxPriority": "high"},
    "integer priorities": {"defaultPriority": -5, "maxPriority": 7},
}


def slicer_accepts(spec: dict[str, Any]) -> bool:
    doc = {"version": 1, "priority_classes": CLASSES, "tenants": {"t": tenant_entry(spec)}}
    try:
        QuotaPolicy.from_yaml(yaml.safe_dump(doc))
    except QuotaError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(INVALID) + sorted(VALID))
def test_the_reconciler_and_the_slicers_parser_agree(case: str) -> None:
    spec = {"quota": {"gpus": 4}, **INVALID.get(case, VALID.get(case, {}))}
    out = reconcile([], [quota("t", **spec)], priority_classes=CLASSES)
    accepted = conditions(out.statuses[(TENANT_QUOTA, "t")])[ACCEPTED][0] == "True"
    assert accepted == slicer_accepts(spec) == (case in VALID)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"tenant": "Team_A"}, "spec.tenant"),
        ({"tenant": "node"}, "spec.tenant"),
        ({"namespaces": ["a", "a"]}, "spec.namespaces"),
        ({"namespaces": ["Not A Namespace"]}, "spec.namespaces"),
        ({"quota": {"gpus": 1.5}}, "spec.quota.gpus"),
        ({"lendingLimit": {"gpus": 1}}, "spec.lendingLimit"),
    ],
)
def test_a_refusal_names_the_field(spec: dict[str, Any], field: str) -> None:
    out = reconcile([], [quota("a", **spec)])
    accepted = out.statuses[(TENANT_QUOTA, "a")]["conditions"][0]
    assert (accepted["type"], accepted["status"]) == (ACCEPTED, "False")
    assert accepted["message"].startswith(field), accepted["message"]


def test_the_slicers_usage_documents_are_summed_over_pools() -> None:
    docs = [
        {"revision": 3, "tenants": {"a": {"gpus": 2, "mig/1g.10gb": 1}, "b": {}}},
        {"revision": 3, "tenants": {"a": {"gpus": 1}, "c": {"shared_gpus": 4}}},
        {"revision": 3, "tenants": {"a": {"gpus": "x", "gpu_mem_mib": True}, "d": 5}},
        {"tenants": None},
    ]
    assert merge_usage(docs) == {
        "a": {"gpus": 3, "mig/1g.10gb": 1},
        "b": {},
        "c": {"shared_gpus": 4},
    }


GARBAGE: list[Any] = [None, 5, "x", [], [1], {"a": 1}, True, -1, {"gpus": [1]}]


@pytest.mark.parametrize("value", GARBAGE)
@pytest.mark.parametrize(
    "field",
    [
        "quota",
        "lendingLimit",
        "borrowingLimit",
        "namespaces",
        "cohort",
        "defaultPriority",
        "tenant",
    ],
)
def test_a_malformed_tenant_quota_is_refused_never_raised(field: str, value: Any) -> None:
    cr = quota("a", cohort="c")
    cr["spec"][field] = value
    out = reconcile([], [cr, quota("b", namespaces=["b"])])
    assert (TENANT_QUOTA, "a") in out.statuses
    assert out.namespaces["b"] == "b"  # the others are unaffected


@pytest.mark.parametrize("value", GARBAGE)
@pytest.mark.parametrize("field", ["placementPolicy", "mig", "sharedGpu"])
def test_a_malformed_slicing_policy_is_refused_never_raised(field: str, value: Any) -> None:
    out = reconcile([policy("default", **{field: value})], [])
    assert (SLICING_POLICY, "default") in out.statuses


def test_an_object_without_a_spec_is_refused() -> None:
    bare = {"metadata": {"name": "x"}}
    out = reconcile([bare], [bare])
    assert conditions(out.statuses[(TENANT_QUOTA, "x")])[ACCEPTED][1] == Reason.INVALID_SPEC
    assert conditions(out.statuses[(SLICING_POLICY, "x")])[ACCEPTED][1] == Reason.INVALID_SPEC
