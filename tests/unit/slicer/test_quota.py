"""Tenant quotas: policy parsing, admission, cohort borrowing, reclaim and preemption."""

from __future__ import annotations

import json

import pytest

from seedance.events.gpus import identify
from seedance.slicer.core.quota import (
    Admitted,
    QuotaError,
    QuotaPolicy,
    QuotaRequest,
    QuotaTracker,
    Rejected,
    RejectReason,
    usage_of,
)

POLICY = """
version: 1
priority_classes: {high: 1000, normal: 100, low: 0}
tenants:
  team-a:
    cohort: research
    default_priority: normal
    quota:
      gpus: 8
      shared_gpus: 4
      gpu_mem_mib: 655360
      mig: {1g.10gb: 7, 3g.40gb: 2}
    lending_limit: {gpus: 4}
  team-b:
    cohort: research
    quota: {gpus: 4, mig: {3g.40gb: 1}}
    borrowing_limit: {gpus: 2}
  team-c:
    cohort: research
    quota: {gpus: 2}
  solo:
    quota: {gpus: 2, shared_gpus: 2}
"""


def req(wid: str, tenant: str, **kw: object) -> QuotaRequest:
    return QuotaRequest(workload_id=wid, tenant=tenant, **kw)  # type: ignore[arg-type]


@pytest.fixture
def tracker() -> QuotaTracker:
    return QuotaTracker(QuotaPolicy.from_yaml(POLICY))


def test_policy_parses_every_field() -> None:
    policy = QuotaPolicy.from_yaml(POLICY)
    a = policy.tenants["team-a"]
    assert a.cohort == "research"
    assert a.default_priority == 100
    assert a.nominal == {
        "gpus": 8,
        "shared_gpus": 4,
        "gpu_mem_mib": 655360,
        "mig/1g.10gb": 7,
        "mig/3g.40gb": 2,
    }
    assert a.lendable("gpus") == 4
    assert a.guaranteed("gpus") == 4
    assert a.lendable("mig/3g.40gb") == 2  # no lending_limit: all of it is lendable
    assert policy.tenants["team-b"].borrowing_limit == {"gpus": 2}
    assert policy.tenants["solo"].cohort is None
    assert [t.name for t in policy.members("research")] == ["team-a", "team-b", "team-c"]
    # gpu_mem_mib is only enforced where given; other dimensions default to 0.
    assert policy.tenants["team-b"].nominal_of("gpu_mem_mib") is None
    assert policy.tenants["team-b"].nominal_of("shared_gpus") == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "policy must be a mapping, got list"),
        ("version: 2\ntenants: {a: {}}\n", "version: expected 1, got 2"),
        ("version: 1\ntenants: {}\n", "tenants: expected a non-empty mapping"),
        ("version: 1\ntenant: {}\n", "policy: unknown field 'tenant'"),
        ("version: 1\ntenants: {a: {quota: {gpus: -1}}}\n", "tenants.a.quota.gpus: must be >= 0"),
        (
            "version: 1\ntenants: {a: {quota: {gpus: two}}}\n",
            "tenants.a.quota.gpus: expected an integer, got 'two'",
        ),
        ("version: 1\ntenants: {a: {quota: {gpu: 1}}}\n", "tenants.a.quota: unknown field 'gpu'"),
        (
            "version: 1\ntenants: {a: {quota: {mig: {big: 1}}}}\n",
            "tenants.a.quota.mig: 'big' is not a MIG profile as NVIDIA names them",
        ),
        # a quota counts GPU instances NVIDIA names and some MIG GPU can hold
        (
            "version: 1\ntenants: {a: {quota: {mig: {1c.3g.20gb: 1}}}}\n",
            "tenants.a.quota.mig: '1c.3g.20gb' is a compute instance: count its GPU instance",
        ),
        (
            "version: 1\ntenants: {a: {quota: {mig: {9g.80gb: 1}}}}\n",
            "tenants.a.quota.mig: '9g.80gb' is a GPU instance no MIG GPU can hold (9 of 7 compute",
        ),
        (
            "version: 1\ntenants: {a: {quota: {mig: {1g.10gb+foo: 1}}}}\n",
            "tenants.a.quota.mig: '1g.10gb+foo' is not a MIG profile as NVIDIA names them",
        ),
        (  # two spellings of one profile: which count would hold is no guess to make
            "version: 1\ntenants: {a: {quota: {mig: {1g.10gb+me: 1, 1g.10gb.me: 2}}}}\n",
            "tenants.a.quota.mig: '1g.10gb.me' is a second key for mig/1g.10gb+me",
        ),
        (
            "version: 1\ntenants: {a: {quota: {mig: {3g.40gb: 1.5}}}}\n",
            "tenants.a.quota.mig.3g.40gb: expected an integer, got 1.5",
        ),
        (
            "version: 1\ntenants: {a: {quota: {gpus: 1}, borrowing_limit: {gpus: 1}}}\n",
            "tenants.a.borrowing_limit: only meaningful with a cohort",
        ),
        (
            "version: 1\ntenants: {a: {cohort: c, quota: {gpus: 1}, lending_limit: {gpus: 3}}}\n",
            "tenants.a.lending_limit.gpus: 3 exceeds the nominal quota 1",
        ),
        (
            "version: 1\ntenants: {a: {default_priority: urgent}}\n",
            "tenants.a.default_priority: unknown priority class 'urgent'",
        ),
        ("version: 1\ntenants: {a: {cohort: 7}}\n", "tenants.a.cohort: expected a non-empty"),
        ("version: 1\ntenants: {a: [1]}\n", "tenants.a: expected a mapping, got [1]"),
        ("version: 1\ntenants: {a: {quota: {gpus: true}}}\n", "expected an integer, got True"),
        ("version: 1\ntenants: [\n", "policy is not valid YAML"),
    ],
)
def test_bad_policies_name_the_field_and_value(text: str, message: str) -> None:
    with pytest.raises(QuotaError) as info:
        QuotaPolicy.from_yaml(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("request_kw", "usage"),
    [
        ({"gpus": 2}, {"gpus": 2}),
        ({"gpus": 1, "milli": 1000}, {"gpus": 1}),
        ({"gpus": 1, "milli": 470}, {"shared_gpus": 1}),
        ({"milli": 470, "mem_mib": 8000}, {"shared_gpus": 1, "gpu_mem_mib": 8000}),
        ({"mig_profile": "3g.40gb"}, {"mig/3g.40gb": 1}),
        ({"mig_profile": "1g.10gb", "gpus": 3}, {"mig/1g.10gb": 3}),
    ],
)
def test_usage_of_maps_requests_to_quota_dimensions(
    request_kw: dict[str, object], usage: dict[str, int]
) -> None:
    assert usage_of(req("w", "team-a", **request_kw)) == usage


def test_admit_within_quota_and_release(tracker: QuotaTracker) -> None:
    d = tracker.admit(req("w1", "solo", gpus=2))
    assert d == Admitted("w1", {})
    assert tracker.usage("solo") == {"gpus": 2}
    over = tracker.admit(req("w2", "solo", gpus=1))
    assert isinstance(over, Rejected)
    assert over.reason is RejectReason.OVER_QUOTA
    assert "'solo' would use 3 gpus over its quota 2" in over.message
    assert tracker.usage("solo") == {"gpus": 2}  # a rejection changes nothing
    assert tracker.release("w1") is True
    assert tracker.release("w1") is False  # idempotent
    assert tracker.usage("solo") == {}
    assert tracker.admit(req("w2", "solo", gpus=1)) == Admitted("w2", {})


def test_rejections_for_bad_requests(tracker: QuotaTracker) -> None:
    cases = [
        (req("w", "nobody", gpus=1), RejectReason.UNKNOWN_TENANT),
        (req("", "solo", gpus=1), RejectReason.INVALID_REQUEST),
        (req("w", "solo", gpus=-1), RejectReason.INVALID_REQUEST),
        (req("w", "solo", milli=1500), RejectReason.INVALID_REQUEST),
        (req("w", "solo"), RejectReason.INVALID_REQUEST),
        (req("w", "solo", milli=500, mig_profile="1g.10gb"), RejectReason.INVALID_REQUEST),
    ]
    for request, reason in cases:
        got = tracker.admit(request)
        assert isinstance(got, Rejected)
        assert got.reason is reason, (request, got)
        assert got.message
    assert tracker.admit(req("w", "solo", gpus=1)) == Admitted("w", {})
    dup = tracker.admit(req("w", "solo", gpus=1))
    assert isinstance(dup, Rejected)
    assert dup.reason is RejectReason.DUPLICATE_WORKLOAD


def test_mig_and_shared_quotas_are_per_dimension(tracker: QuotaTracker) -> None:
    assert isinstance(tracker.admit(req("s1", "solo", milli=300)), Admitted)
    assert isinstance(tracker.admit(req("s2", "solo", milli=300)), Admitted)
    third = tracker.admit(req("s3", "solo", milli=300))
    assert isinstance(third, Rejected)
    assert "shared_gpus" in third.message
    # Shared instances did not use whole-GPU quota.
    assert isinstance(tracker.admit(req("g1", "solo", gpus=2)), Admitted)
    # No MIG quota at all for solo: any profile is over quota.
    mig = tracker.admit(req("m1", "solo", mig_profile="1g.10gb"))
    assert isinstance(mig, Rejected)
    assert mig.reason is RejectReason.OVER_QUOTA
    assert "1g.10gb" in mig.message


def test_gpu_memory_is_enforced_only_where_declared(tracker: QuotaTracker) -> None:
    assert isinstance(tracker.admit(req("a1", "team-a", gpus=1, mem_mib=600_000)), Admitted)
    # team-a's 655360 MiB cap is a guaranteed-free dimension here: only team-a enforces it.
    assert isinstance(tracker.admit(req("a2", "team-a", gpus=1, mem_mib=55_360)), Admitted)
    over = tracker.admit(req("a3", "team-a", gpus=1, mem_mib=1))
    assert isinstance(over, Rejected)
    assert "gpu_mem_mib" in over.message
    # team-b declares no memory quota: memory is not counted against it.
    assert isinstance(tracker.admit(req("b1", "team-b", gpus=1, mem_mib=10**7)), Admitted)


def test_borrowing_from_the_cohort_up_to_the_limits(tracker: QuotaTracker) -> None:
    # Cohort pool of gpus: team-a lends 4 (of 8), team-b 4, team-c 2 = 10.
    assert tracker.admit(req("b1", "team-b", gpus=4)) == Admitted("b1", {})
    got = tracker.admit(req("b2", "team-b", gpus=2))
    assert got == Admitted("b2", {"gpus": 2})
    assert tracker.borrowed("team-b") == {"gpus": 2}
    limit = tracker.admit(req("b3", "team-b", gpus=1))
    assert isinstance(limit, Rejected)
    assert limit.reason is RejectReason.BORROWING_LIMIT
    assert "borrowing_limit 2" in limit.message
    # team-c has no borrowing limit: it may take what is left of the pool, here 10 - 6 = 4
    # on top of nothing; its own 2 plus 2 borrowed.
    assert tracker.admit(req("c1", "team-c", gpus=4)) == Admitted("c1", {"gpus": 2})
    # The pool is now fully drawn (b: 6, c: 4 = 10); team-a's guaranteed 4 are still its own.
    assert isinstance(tracker.admit(req("a1", "team-a", gpus=4)), Admitted)
    exhausted = tracker.admit(req("c2", "team-c", gpus=1))
    assert isinstance(exhausted, Rejected)
    assert exhausted.reason is RejectReason.COHORT_EXHAUSTED


def test_lender_gets_its_quota_back_by_reclaim(tracker: QuotaTracker) -> None:
    # team-b and team-c borrow team-a's lendable 4 GPUs while team-a is idle.
    assert tracker.admit(req("b1", "team-b", gpus=4, priority=95)) == Admitted("b1", {})
    assert tracker.admit(req("b2", "team-b", gpus=2, priority=50)) == Admitted("b2", {"gpus": 2})
    assert tracker.admit(req("c1", "team-c", gpus=2, priority=95)) == Admitted("c1", {})
    assert tracker.admit(req("c2", "team-c", gpus=1, priority=10)) == Admitted("c2", {"gpus": 1})
    assert tracker.admit(req("c3", "team-c", gpus=1, priority=90)) == Admitted("c3", {"gpus": 1})
    # team-a takes its guaranteed 4 freely, then wants 2 more of its nominal 8 back.
    assert isinstance(tracker.admit(req("a1", "team-a", gpus=4)), Admitted)
    want = req("a2", "team-a", gpus=3)
    blocked = tracker.admit(want)
    assert isinstance(blocked, Rejected)
    assert blocked.reason is RejectReason.RECLAIM_REQUIRED
    plan = tracker.plan_preemption(want)
    assert plan.feasible
    # As in Kueue, victims come from tenants above their nominal quota, lowest priority first:
    # c2 (10), then b2 (50); c3 (90), b1 and c1 (95) are spared since two victims free 3 GPUs.
    assert plan.victims == ("c2", "b2")
    assert tracker.admitted("team-c") == ("c1", "c2", "c3")  # planning changes nothing
    for victim in plan.victims:
        assert tracker.release(victim)
    assert isinstance(tracker.admit(want), Admitted)
    assert tracker.borrowed("team-b") == {}
    # A request that would itself borrow (team-a at 7 of 8 asks for 2) reclaims nothing from
    # the cohort, even at top priority: it may only preempt its own lower-priority work.
    more = tracker.plan_preemption(req("a3", "team-a", gpus=2, priority=10**6))
    assert more.feasible
    assert more.victims == ("a2",)


def test_preemption_within_tenant_takes_lower_priority_only(tracker: QuotaTracker) -> None:
    assert isinstance(tracker.admit(req("lo", "solo", gpus=1, priority=1)), Admitted)
    assert isinstance(tracker.admit(req("hi", "solo", gpus=1, priority=9)), Admitted)
    urgent = req("new", "solo", gpus=1, priority=5)
    plan = tracker.plan_preemption(urgent)
    assert plan.feasible
    assert plan.victims == ("lo",)
    # A request of lower priority than everything running cannot preempt.
    meek = tracker.plan_preemption(req("meek", "solo", gpus=1, priority=0))
    assert not meek.feasible
    assert meek.victims == ()
    assert "over its quota" in meek.reason
    # More than the nominal can never fit, preemption or not.
    huge = tracker.plan_preemption(req("huge", "solo", gpus=3, priority=100))
    assert not huge.feasible


def test_default_priority_comes_from_the_tenant(tracker: QuotaTracker) -> None:
    assert tracker.priority_of(req("x", "team-a", gpus=1)) == 100
    assert tracker.priority_of(req("x", "team-a", gpus=1, priority=3)) == 3
    assert tracker.priority_of(req("x", "team-b", gpus=1)) == 0


def test_plan_preemption_when_it_already_fits_or_is_invalid(tracker: QuotaTracker) -> None:
    fits = tracker.plan_preemption(req("x", "solo", gpus=1))
    assert fits.feasible
    assert fits.victims == ()
    unknown = tracker.plan_preemption(req("x", "ghost", gpus=1))
    assert not unknown.feasible
    assert "ghost" in unknown.reason


def test_check_does_not_record(tracker: QuotaTracker) -> None:
    assert tracker.check(req("w", "solo", gpus=2)) == Admitted("w", {})
    assert tracker.usage("solo") == {}
    assert tracker.admitted() == ()


@pytest.mark.parametrize(
    ("key", "profile"),
    [("1g.10gb.me", "1g.10gb+me"), ("1G.10GB+ME", "1g.10gb+me"), ("3g.40gb", "3g.40gb"),
     ("1g.24gb.me.all", "1g.24gb+me.all"), ("1g.24gb-me", "1g.24gb-me"),
     ("1g.12gb+gfx", "1g.12gb+gfx")],
)  # fmt: skip
def test_a_mig_quota_in_any_nvidia_spelling_governs_the_profile_a_placement_asks_for(
    key: str, profile: str
) -> None:
    """The device plugin's ``1g.10gb.me`` (how a pod asks: ``nvidia.com/mig-1g.10gb.me``) is
    NVML's ``1g.10gb+me``, the name the placement asks the quota for."""
    policy = QuotaPolicy.from_yaml(
        f"version: 1\ntenants: {{a: {{quota: {{mig: {{{key}: 1}}}}}}}}\n"
    )
    assert policy.tenants["a"].nominal == {f"mig/{profile}": 1}
    tracker = QuotaTracker(policy)
    assert tracker.admit(req("m1", "a", mig_profile=profile)) == Admitted("m1", {})
    over = tracker.admit(req("m2", "a", mig_profile=profile))
    assert isinstance(over, Rejected)
    assert over.reason is RejectReason.OVER_QUOTA


@pytest.mark.parametrize(
    ("key", "why"),
    [
        # no MIG GPU holds these: NVIDIA ties a GI's memory to its slices and +gfx to GB20X parts
        ("1g.300gb", "is a GPU instance no MIG GPU can hold"),
        ("7g.12gb", "is a GPU instance no MIG GPU can hold"),
        ("7g.180gb+gfx", "is a GPU instance no MIG GPU can hold"),
        ("3g.40gb+me", "is a GPU instance no MIG GPU can hold"),
        # the API server's RE2 refuses these: Python's $ and \d took them
        ("1g.10gb\n", "is not a MIG profile as NVIDIA names them"),
        ("1g.1\u0660gb", "is not a MIG profile as NVIDIA names them"),
        # no compute instance at all: none is "a compute instance"
        ("0c.3g.40gb", "is no MIG device (a 3g instance has no 0c"),
        ("3c.3g.40gb", "is no MIG device (a 3g instance has no 3c"),
        ("1c.1g.10gb", "is no MIG device (a 1g instance has no 1c"),
        ("1c.3g.40gb", "is a compute instance: count its GPU instance 3g.40gb"),
        # copied from nvidia-smi mig -lgip's column or a pod's resource: told what to write
        ("MIG 1g.10gb", "is not a MIG profile as NVIDIA names them ('<g>g.<m>gb[+me|+me.all|"),
        ("MIG 1g.10gb", ": write '1g.10gb'"),
        ("nvidia.com/mig-1g.10gb.me", ": write '1g.10gb.me'"),
    ],
)
def test_a_mig_key_no_gpu_holds_is_refused_saying_why(key: str, why: str) -> None:
    doc = {"version": 1, "tenants": {"a": {"quota": {"mig": {key: 1}}}}}
    with pytest.raises(QuotaError) as err:
        QuotaPolicy.from_yaml(json.dumps(doc))
    assert str(err.value).startswith(f"tenants.a.quota.mig: {key!r} "), str(err.value)
    assert why in str(err.value)
    assert "[<c>c.]" not in str(err.value)  # a quota counts GPU instances only


@pytest.mark.parametrize(
    ("gpu", "profile"),
    [  # NVIDIA's profiles of parts without a table here (mig-parted's config), and the tabled
        ("GB200", "7g.189gb"), ("GB200", "3g.95gb"), ("GH200-144GB", "1g.18gb+me"),
        ("H20", "1g.24gb"), ("B300", "7g.269gb"), ("B300", "1g.34gb"), ("B300", "4g.135gb"),
        ("NVIDIA RTX PRO 5000 Blackwell 48GB", "1g.12gb-me"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "2g.48gb+me.all"),
    ],
)  # fmt: skip
def test_nvidias_own_profiles_of_each_part_stay_keys(gpu: str, profile: str) -> None:
    policy = QuotaPolicy.from_yaml(json.dumps({"version": 1, "tenants": {"a": {"quota": {
        "mig": {profile: 1}}}}}))  # fmt: skip
    assert policy.tenants["a"].nominal == {f"mig/{profile}": 1}
    assert identify(f"{gpu} MIG {profile}").mig_misfit is None
