"""The slicer scheduler: admission (quotas, pauses), MIG allocation, health, exact persistence."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from seedance.slicer.core import (
    STATE_VERSION,
    Ended,
    Evicted,
    GpuSpec,
    JobSpec,
    MigPlanned,
    NodeSpec,
    Placed,
    QuotaError,
    QuotaPolicy,
    Refused,
    RejectedInput,
    Scheduler,
    SchedulerConfig,
    SchedulerSnapshot,
    SeedancePolicy,
    Waiting,
    mig_model,
    published_reason,
)
from seedance.slicer.core.mig import GpuModel
from seedance.slicer.core.queue import PlacementQueue


def node(name: str, gpus: int = 4, model: str = "T4", **kw: object) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=32_000,
        memory_mib=256_000,
        gpus=tuple(GpuSpec(model=model, **kw) for _ in range(gpus)),  # type: ignore[arg-type]
    )


def job(jid: str, tenant: str = "a", **kw: object) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, cause_id=f"c-{jid}", **kw)  # type: ignore[arg-type]


def kinds(effects: list[object]) -> list[tuple[str, str]]:
    out = []
    for e in effects:
        name = type(e).__name__
        jid = getattr(getattr(e, "job", None), "job_id", "")
        out.append((name, jid))
    return out


QUOTA = """
version: 1
tenants:
  a: {cohort: c, quota: {gpus: 2}, lending_limit: {gpus: 2}}
  b: {cohort: c, quota: {gpus: 2}}
  solo: {quota: {gpus: 1, mig: {3g.40gb: 1}}}
"""


def test_reason_mapping_is_closed_over_the_published_enum() -> None:
    assert published_reason("cohort_exhausted") == "over_quota"
    assert published_reason("gang_no_allowed_gpu_model") == "no_matching_gpu"
    assert published_reason("insufficient_gpu") == "no_capacity"
    assert published_reason("tenant_paused") == "tenant_paused"
    assert mig_model("NVIDIA H100 80GB HBM3") == GpuModel.H100_80GB
    assert mig_model("A100-SXM4-40GB") == GpuModel.A100_40GB
    assert mig_model("T4") is None


def test_quota_borrowing_then_reclaim_preempts_the_borrower() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n", 8), 0)
    # b borrows a's idle quota: 4 GPUs against its 2.
    assert kinds(e.submit(job("b1", "b", gpus=4), 1)) == [("Placed", "b1")]
    # a asks for its own quota back: b1 is evicted (reclaim) and a1 runs.
    out = e.submit(job("a1", "a", gpus=2), 2)
    ev = [x for x in out if isinstance(x, Evicted)]
    assert [(x.job.job_id, x.reason, x.by_job_id, x.node) for x in ev] == [
        ("b1", "quota_reclaim", "a1", "n")
    ]
    assert ("Placed", "a1") in kinds(out)
    assert "b1" in e.waiting_ids
    # b1 comes back once a1 ends.
    assert ("Placed", "b1") in kinds(e.finish("a", "a1", 3))


def test_unknown_tenant_and_bad_requests_are_refused_not_queued() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n"), 0)
    (r,) = e.submit(job("x", "nobody", gpus=1), 1)
    assert isinstance(r, Refused)
    assert r.reason == "unknown_tenant"
    (r,) = e.submit(job("y", "a", gpus=2, mig_profile="1g.10gb"), 1)
    assert isinstance(r, Refused)
    assert r.reason == "invalid_request"
    assert e.waiting_ids == []


def test_over_quota_waits_and_is_admitted_when_quota_frees() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n"), 0)
    assert kinds(e.submit(job("s1", "solo", gpus=1), 1)) == [("Placed", "s1")]
    (w,) = e.submit(job("s2", "solo", gpus=1), 2)
    assert isinstance(w, Waiting)
    assert w.reason == "over_quota"
    assert kinds(e.finish("solo", "s1", 3)) == [("Ended", "s1"), ("Placed", "s2")]


def test_pause_holds_new_and_queued_work_and_unpause_releases_it() -> None:
    e = Scheduler()
    e.upsert_node(node("n", 2), 0)
    e.submit(job("r", gpus=2), 1)
    assert isinstance(e.submit(job("q", gpus=1), 2)[0], Waiting)  # queued for capacity
    out = e.set_paused("a", True, 3)
    assert [(type(x).__name__, x.reason) for x in out] == [("Waiting", "tenant_paused")]
    (w,) = e.submit(job("new", gpus=1), 4)
    assert isinstance(w, Waiting)
    assert w.reason == "tenant_paused"
    assert e.running_ids == ["r"]  # running work continues
    assert kinds(e.finish("a", "r", 5)) == [("Ended", "r")]  # free, but the tenant is paused
    placed = [x.job.job_id for x in e.set_paused("a", False, 6) if isinstance(x, Placed)]
    assert placed == ["q", "new"]  # original order kept


def test_mig_slot_choice_and_repartition_of_a_drained_gpu() -> None:
    e = Scheduler()
    e.upsert_node(node("h", 1, "H100-80GB", mig_capable=True, mig_enabled=True), 0)
    (p,) = e.submit(job("m1", mig_profile="3g.40gb"), 1)
    assert isinstance(p, Placed)
    assert (p.kind, p.gpus[0].mig_start_slot) == ("mig", 4)  # slot 0 kept for a 4g/7g
    (p2,) = e.submit(job("m2", mig_profile="1g.10gb"), 2)
    assert isinstance(p2, Placed)
    assert p2.gpus[0].mig_start_slot in range(4)
    (w,) = e.submit(job("big", mig_profile="7g.80gb"), 3)
    assert isinstance(w, Waiting)
    assert w.reason == "insufficient_mig_slices"
    assert kinds(e.finish("a", "m1", 4)) == [
        ("Ended", "m1")
    ]  # m2 still runs: the GPU has not drained
    out = e.finish("a", "m2", 5)
    plan = next(x for x in out if isinstance(x, MigPlanned))
    assert plan.create == (("7g.80gb", 0),)
    assert {p for p, _ in plan.destroy} == {"3g.40gb", "1g.10gb"}
    assert kinds(out)[-1] == ("Placed", "big")
    # An idle instance of the right profile is reused without a plan.
    e.finish("a", "big", 6)
    assert kinds(e.submit(job("again", mig_profile="7g.80gb"), 7)) == [("Placed", "again")]


def test_mig_gpus_take_no_whole_gpu_work_and_unknown_profiles_do_not_match() -> None:
    e = Scheduler()
    e.upsert_node(node("h", 1, "H200-141GB", mig_capable=True, mig_enabled=True), 0)
    (w,) = e.submit(job("w", gpus=1), 1)
    assert isinstance(w, Waiting)
    (w2,) = e.submit(job("m", mig_profile="3g.40gb"), 2)  # an H100 name, not an H200 one
    assert isinstance(w2, Waiting)
    assert published_reason(w2.reason) == "unsatisfiable"  # no GPU of the fleet offers it
    assert "3g.40gb: no GPU of the fleet offers it" in w2.detail


def test_unhealthy_gpu_is_not_used_until_it_recovers() -> None:
    e = Scheduler()
    e.upsert_node(node("n", 1), 0)
    e.set_health("n", 0, False, 1)
    assert isinstance(e.submit(job("j", gpus=1), 2)[0], Waiting)
    assert kinds(e.set_health("n", 0, True, 3)) == [("Placed", "j")]


def test_snapshot_round_trip_makes_the_same_decisions() -> None:
    """Run a random stream; at every step a restored copy must decide exactly as the live one."""
    rng = random.Random(7)
    cfg = SchedulerConfig(workload_refresh=5)
    live = Scheduler(cfg)
    for i in range(6):
        live.upsert_node(node(f"n{i}", rng.choice([2, 4, 8])), 0)
    active: list[str] = []
    for step_i in range(150):
        step = float(step_i)
        restored = Scheduler.from_bytes(live.to_bytes(), cfg)
        if active and rng.random() < 0.4:
            jid = active.pop(rng.randrange(len(active)))
            a, b = live.finish("a", jid, step), restored.finish("a", jid, step)
        else:
            jid = f"j{step_i}"
            active.append(jid)
            gpus = rng.choice([1, 1, 2, 4, 8])
            spec = job(
                jid,
                priority=rng.choice([0, 0, 5]),
                gpus=gpus,
                gpu_milli=rng.choice([250, 500, 1000]) if gpus == 1 else 1000,
                cpu_milli=rng.choice([0, 2000, 8000]),
                gang_size=rng.choice([1, 1, 2]),
            )
            a, b = live.submit(spec, step), restored.submit(spec, step)
        assert a == b, f"step {step}"
        assert live.to_bytes() == restored.to_bytes()
    assert live.running_ids
    assert isinstance(live._queue, PlacementQueue)
    assert isinstance(live._queue.policy, SeedancePolicy)


def test_first_fit_policy_is_fifo_with_head_of_line_blocking() -> None:
    e = Scheduler(SchedulerConfig(policy="first-fit"))
    e.upsert_node(node("n", 2), 0)
    e.submit(job("a1", gpus=1), 1)
    e.submit(job("big", gpus=2), 2)  # blocks the head
    e.submit(job("small", gpus=1), 3)
    assert "small" in e.waiting_ids


def test_jobs_are_keyed_by_tenant_and_one_tenants_end_frees_only_its_own() -> None:
    e = Scheduler()
    e.upsert_node(node("n", 4), 0)
    assert kinds(e.submit(job("train-1", "acme", gpus=4), 1)) == [("Placed", "train-1")]
    (w,) = e.submit(job("train-1", "globex", gpus=4), 2)
    assert isinstance(w, Waiting)
    (end,) = e.finish("globex", "train-1", 3)
    assert isinstance(end, Ended)
    assert (end.job.tenant, end.was_placed) == ("globex", False)
    assert e.running_jobs == [("acme", "train-1")]
    out = e.finish("acme", "train-1", 4, "failed")
    assert [(type(x).__name__, getattr(x, "outcome", "")) for x in out] == [("Ended", "failed")]


def test_repeats_duplicates_and_unknown_or_ended_jobs_are_answered() -> None:
    e = Scheduler()
    e.upsert_node(node("n", 4), 0)
    e.submit(job("j", gpus=1), 1)
    assert e.submit(job("j", gpus=1), 2) == []  # the same request again: idempotent
    (dup,) = e.submit(job("j", gpus=2), 3)
    assert isinstance(dup, RejectedInput)
    assert dup.reason == "duplicate_job"
    assert e.start("a", "j") == []
    assert [x.reason for x in e.start("a", "nope")] == ["unknown_job"]  # type: ignore[union-attr]
    assert [x.reason for x in e.finish("a", "nope", 4)] == ["unknown_job"]  # type: ignore[union-attr]
    e.finish("a", "j", 5)
    for again in (e.finish("a", "j", 6), e.start("a", "j"), e.submit(job("j", gpus=1), 7)):
        assert [(type(x).__name__, x.reason) for x in again] == [  # type: ignore[union-attr]
            ("RejectedInput", "job_ended")
        ]


def test_priority_is_capped_at_the_quota_bound_and_evicts_only_its_own_tenant() -> None:
    q = QuotaPolicy.from_yaml(
        "version: 1\ntenants:\n  a: {quota: {gpus: 8}}\n"
        "  b: {quota: {gpus: 8}, default_priority: 1, max_priority: 10}\n"
    )
    assert (q.tenants["a"].priority_cap, q.tenants["b"].priority_cap) == (0, 10)
    e = Scheduler(quota=q)
    e.upsert_node(node("n", 2), 0)
    e.submit(job("a-low", "a", gpus=1), 1)
    e.submit(job("b-low", "b", gpus=1), 2)
    (w,) = e.submit(job("a-top", "a", gpus=1, priority=2**31 - 1), 3)
    assert isinstance(w, Waiting)  # capped at 0: evicts nobody
    assert e.job("a", "a-top").priority == 0  # type: ignore[union-attr]
    out = e.submit(job("b-top", "b", gpus=1, priority=99), 4)
    assert [
        (x.job.tenant, x.job.job_id, x.by_job_id, x.by_tenant)
        for x in out
        if isinstance(x, Evicted)
    ] == [("b", "b-low", "b-top", "b")]


def test_a_job_id_keyed_state_migrates_to_tenant_keys() -> None:
    """The fixture is a snapshot the slicer of 6ef02a6 wrote (tests/fixtures/slicer)."""
    data = (Path(__file__).parents[2] / "fixtures/slicer/v1_snapshot.msgpack").read_bytes()
    engine_bytes = msgspec.msgpack.decode(data)["engine"]
    old = msgspec.msgpack.decode(engine_bytes, type=SchedulerSnapshot)
    assert old.version == 1
    assert "train-1" in old.jobs
    e = Scheduler.from_bytes(engine_bytes)
    snap = e.snapshot()
    assert snap.version == STATE_VERSION
    assert sorted(snap.jobs) == [
        "acme/mig-1",
        "acme/train-1",
        "acme/train-2",
        "acme/wait-1",
        "globex/g-1",
    ]
    assert sorted(e.running_jobs) == [("acme", "mig-1"), ("acme", "train-1"), ("acme", "train-2")]
    assert Scheduler.from_bytes(e.to_bytes()).to_bytes() == e.to_bytes()
    assert isinstance(e.finish("acme", "mig-1", 1)[0], Ended)


def test_quota_max_priority_is_validated() -> None:
    with pytest.raises(QuotaError, match=r"tenants.a.max_priority: 1 is below default_priority 5"):
        QuotaPolicy.from_yaml("version: 1\ntenants:\n  a: {default_priority: 5, max_priority: 1}\n")
    with pytest.raises(QuotaError, match=r"tenants.a.max_priority: unknown priority class 'top'"):
        QuotaPolicy.from_yaml("version: 1\ntenants:\n  a: {max_priority: top}\n")


# --- a new quota policy between inputs (Scheduler.set_quota) ------------------------------

ONE_GPU = "version: 1\ntenants:\n  solo: {quota: {gpus: 1}}\n"
TWO_GPUS = "version: 1\ntenants:\n  solo: {quota: {gpus: 2}}\n"
THREE_GPUS = "version: 1\ntenants:\n  solo: {quota: {gpus: 3}}\n"


def test_a_raised_quota_admits_the_held_jobs() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(ONE_GPU))
    e.upsert_node(node("n"), 0)
    assert kinds(e.submit(job("s1", "solo", gpus=1), 1)) == [("Placed", "s1")]
    (w,) = e.submit(job("s2", "solo", gpus=1), 2)
    assert isinstance(w, Waiting)
    assert w.reason == "over_quota"
    assert kinds(e.set_quota(QuotaPolicy.from_yaml(TWO_GPUS), 3)) == [("Placed", "s2")]
    assert e.quota is not None
    assert e.quota.tenants["solo"].nominal == {"gpus": 2}
    assert sorted(e.running_ids) == ["s1", "s2"]


def test_a_lowered_quota_keeps_admitted_work_and_admits_nothing_new_until_it_ends() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(THREE_GPUS))
    e.upsert_node(node("n"), 0)
    for i in (1, 2, 3):
        assert kinds(e.submit(job(f"s{i}", "solo", gpus=1), i)) == [("Placed", f"s{i}")]
    assert e.set_quota(QuotaPolicy.from_yaml(ONE_GPU), 4) == []  # nothing preempted
    assert sorted(e.running_ids) == ["s1", "s2", "s3"]
    (w,) = e.submit(job("s4", "solo", gpus=1), 5)
    assert isinstance(w, Waiting)
    assert w.reason == "over_quota"
    # two of three ended: the tenant still holds 1 = its new quota, so s4 still waits
    assert kinds(e.finish("solo", "s1", 6)) == [("Ended", "s1")]
    assert kinds(e.finish("solo", "s2", 7)) == [("Ended", "s2")]
    assert kinds(e.finish("solo", "s3", 8)) == [("Ended", "s3"), ("Placed", "s4")]


def test_a_tenant_dropped_from_the_policy_keeps_its_work_and_new_requests_are_refused() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n"), 0)
    assert kinds(e.submit(job("s1", "solo", gpus=1), 1)) == [("Placed", "s1")]
    e.set_quota(QuotaPolicy.from_yaml("version: 1\ntenants:\n  a: {quota: {gpus: 1}}\n"), 2)
    assert e.running_ids == ["s1"]
    (r,) = e.submit(job("s2", "solo", gpus=1), 3)
    assert isinstance(r, Refused)
    assert r.reason == "unknown_tenant"
    assert kinds(e.finish("solo", "s1", 4)) == [("Ended", "s1")]


def test_no_quota_releases_every_job_held_for_quota_but_not_the_paused() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n", gpus=8), 0)
    e.submit(job("s1", "solo", gpus=1), 1)
    e.submit(job("s2", "solo", gpus=1), 2)  # over quota
    e.set_paused("b", True, 3)
    e.submit(job("b1", "b", gpus=1), 4)  # paused
    out = e.set_quota(None, 5)
    assert kinds(out) == [("Placed", "s2")]
    assert e.quota is None
    assert ("b", "b1") in e.waiting_jobs


def test_a_restored_scheduler_under_the_new_policy_decides_as_the_original() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(THREE_GPUS))
    e.upsert_node(node("n"), 0)
    for i in (1, 2, 3):
        e.submit(job(f"s{i}", "solo", gpus=1), i)
    lowered = QuotaPolicy.from_yaml(ONE_GPU)
    e.set_quota(lowered, 4)
    twin = Scheduler.from_bytes(e.to_bytes(), quota=lowered)
    for s in (e, twin):
        s.submit(job("s4", "solo", gpus=1), 5)
        s.finish("solo", "s1", 6)
        s.finish("solo", "s2", 7)
    assert kinds(e.finish("solo", "s3", 8)) == kinds(twin.finish("solo", "s3", 8))
    assert e.to_bytes() == twin.to_bytes()


def test_quota_usage_is_what_admitted_work_holds() -> None:
    e = Scheduler(quota=QuotaPolicy.from_yaml(QUOTA))
    e.upsert_node(node("n", gpus=8), 0)
    e.submit(job("b1", "b", gpus=3), 1)  # borrows a's idle quota
    e.submit(job("s1", "solo", gpus=1), 2)
    e.submit(job("s2", "solo", gpus=1), 3)  # held: not admitted, not counted
    assert e.quota_usage() == {"a": {}, "b": {"gpus": 3}, "solo": {"gpus": 1}}
    e.finish("b", "b1", 4)
    assert e.quota_usage()["b"] == {}
    assert Scheduler().quota_usage() == {}


def test_a_mig_quota_in_the_device_plugins_spelling_admits_the_placement_it_names() -> None:
    """A quota written as a pod asks (``nvidia.com/mig-1g.10gb.me``: ``1g.10gb.me``) governs the
    ``1g.10gb+me`` instance the slicer places, and holds at its count."""
    quota = "version: 1\ntenants: {a: {quota: {mig: {1g.10gb.me: 1}}}}\n"
    e = Scheduler(quota=QuotaPolicy.from_yaml(quota))
    e.upsert_node(node("h", 1, "H100-80GB", mig_capable=True, mig_enabled=True), 0)
    (p,) = e.submit(job("m1", mig_profile="1g.10gb+me"), 1)
    assert isinstance(p, Placed)
    assert p.gpus[0].mig_profile == "1g.10gb+me"
    (w,) = e.submit(job("m2", mig_profile="1g.10gb+me"), 2)
    assert isinstance(w, Waiting)
    assert w.reason == "over_quota"
