"""One tenant's waiting jobs cannot stall everyone's job ends (`core.tenant_waiting`).

Before: nothing bounded a tenant's waiting jobs, and with a quota in force every job end
re-checked every held job of every tenant against it (probe F1: 5,000 of acme's over-quota jobs
made each release of globex's GPU take 7.1 s). These count the work instead of timing it:
`Scheduler.held_rechecked` (the metric `seedance_slicer_held_rechecked_total`).
"""

from __future__ import annotations

import random

import pytest

from seedance.slicer.core import (
    GpuSpec,
    JobSpec,
    NodeSpec,
    Placed,
    QuotaPolicy,
    Refused,
    Scheduler,
    SchedulerConfig,
    Waiting,
)
from seedance.slicer.core.inputs import job_key, tenant_of
from seedance.slicer.core.snapshot import HeldJob
from seedance.slicer.core.tenant_waiting import retry_order

TOO_MANY_WAITING = "too_many_waiting"  # the wire's RejectionReason

SOLO = QuotaPolicy.from_yaml(
    "version: 1\ntenants:\n  acme: {quota: {gpus: 1}}\n  globex: {quota: {gpus: 1}}\n"
)
COHORT = QuotaPolicy.from_yaml(
    "version: 1\ntenants:\n"
    "  acme: {cohort: c, quota: {gpus: 1}}\n"
    "  globex: {cohort: c, quota: {gpus: 1}}\n"
    "  initech: {quota: {gpus: 1}}\n"
)


def pool(quota: QuotaPolicy | None, gpus: int = 4, bound: int | None = None) -> Scheduler:
    s = Scheduler(
        SchedulerConfig() if bound is None else SchedulerConfig(max_waiting_per_tenant=bound)
    )
    if quota is not None:
        s.set_quota(quota, 0.0)
    gpu = GpuSpec(model="T4", mem_mib=16_000)
    s.upsert_node(NodeSpec(name="n1", cpu_milli=64_000, memory_mib=256_000, gpus=(gpu,) * gpus), 0)
    return s


def job(jid: str, tenant: str, **kw: object) -> JobSpec:
    return JobSpec(job_id=jid, tenant=tenant, gpus=1, **kw)  # type: ignore[arg-type]


def placed(effects: list[object]) -> list[str]:
    return [e.job.job_id for e in effects if isinstance(e, Placed)]


def test_a_release_rechecks_only_the_held_jobs_its_quota_may_admit() -> None:
    s = pool(SOLO)
    s.submit(job("g0", "globex"), 1.0)
    s.submit(job("a0", "acme"), 1.0)
    for i in range(1, 201):  # acme over its quota: held, same shape
        s.submit(job(f"a{i}", "acme"), 2.0)
    for i in range(201, 401):  # and distinct shapes (GPU memory)
        s.submit(job(f"a{i}", "acme", gpu_mem_mib=i), 2.0)
    s.submit(job("g1", "globex"), 3.0)
    assert len(s.waiting_jobs) == 401
    s.held_rechecked = 0
    # globex's end frees globex's quota: globex's one held job is re-checked, none of acme's.
    assert placed(s.finish("globex", "g0", 4.0)) == ["g1"]
    assert s.held_rechecked == 1
    # acme's end: a1 is admitted, a2 refused, and so (unchecked) is the rest of its shape;
    # each distinct shape is checked once, until REFUSED_PER_TENANT of acme's were refused.
    from seedance.slicer.core.tenant_waiting import REFUSED_PER_TENANT

    s.held_rechecked = 0
    assert placed(s.finish("acme", "a0", 5.0)) == ["a1"]
    assert s.held_rechecked == 1 + REFUSED_PER_TENANT
    # the shapes left unchecked are not lost: a raised quota re-checks every held job
    s.held_rechecked = 0
    s.set_quota(
        QuotaPolicy.from_yaml("version: 1\ntenants:\n  acme: {quota: {gpus: 3}}\n  globex: {}\n"),
        6.0,
    )
    assert s.held_rechecked == 399
    # an end of a job that held no quota (it waited) frees nothing: nothing is re-checked.
    s.held_rechecked = 0
    assert s.finish("acme", "a7", 6.0)[0].was_placed is False  # type: ignore[union-attr]
    assert s.held_rechecked == 0


def test_a_release_in_a_cohort_rechecks_the_cohorts_held_jobs_and_admits_a_borrower() -> None:
    s = pool(COHORT)
    s.submit(job("g0", "globex"), 1.0)
    s.submit(job("a0", "acme"), 1.0)
    s.submit(job("a1", "acme"), 2.0)  # acme's own quota used, globex's lent out: waits
    s.submit(job("i0", "initech"), 1.0)
    s.submit(job("i1", "initech"), 2.0)  # initech has no cohort: over its quota
    assert {e.job.job_id for e in s.submit(job("x", "acme"), 2.5) if isinstance(e, Waiting)} == {
        "x"
    }
    s.held_rechecked = 0
    # globex's end frees quota the cohort may borrow: acme's oldest held job is admitted,
    # then x is refused; initech, in no cohort, is not re-checked.
    assert placed(s.finish("globex", "g0", 3.0)) == ["a1"]
    assert s.held_rechecked == 2


def test_a_tenant_past_its_bound_on_waiting_jobs_is_refused_by_name() -> None:
    s = pool(None, gpus=1, bound=3)
    assert placed(s.submit(job("a0", "acme"), 1.0)) == ["a0"]  # running: not waiting
    for i in (1, 2, 3):
        assert [type(e) for e in s.submit(job(f"a{i}", "acme"), 2.0)] == [Waiting]
    refused = s.submit(job("a4", "acme"), 3.0)
    assert [(type(e), e.reason) for e in refused] == [(Refused, TOO_MANY_WAITING)]  # type: ignore[union-attr]
    detail = refused[0].detail  # type: ignore[union-attr]
    assert "'acme' has 3 jobs waiting" in detail
    assert "bound of 3" in detail
    assert ("acme", "a4") not in s.waiting_jobs
    assert len(s.waiting_jobs) == 3
    # another tenant is not counted against acme's bound
    assert [type(e) for e in s.submit(job("g0", "globex"), 3.0)] == [Waiting]
    # a replica restoring the state refuses the same submit (the count is the state's)
    again = Scheduler.restore(s.snapshot(), SchedulerConfig(max_waiting_per_tenant=3))
    assert [e.reason for e in again.submit(job("a4", "acme"), 3.0)] == [TOO_MANY_WAITING]  # type: ignore[union-attr]
    # a waiting job's end makes room: the next submit waits
    s.finish("acme", "a2", 4.0)
    assert [type(e) for e in s.submit(job("a4", "acme"), 5.0)] == [Waiting]
    assert [e.reason for e in s.submit(job("a5", "acme"), 5.0)] == [TOO_MANY_WAITING]  # type: ignore[union-attr]


def test_jobs_held_for_quota_count_against_the_bound() -> None:
    s = pool(SOLO, gpus=4, bound=2)
    s.submit(job("a0", "acme"), 1.0)
    s.submit(job("a1", "acme"), 1.0)  # held: over quota
    s.submit(job("a2", "acme"), 1.0)  # held
    assert [e.reason for e in s.submit(job("a3", "acme"), 1.0)] == [TOO_MANY_WAITING]  # type: ignore[union-attr]
    # a repeat of a live job's request is still answered as a repeat (nothing), not refused
    assert s.submit(job("a1", "acme"), 2.0) == []


@pytest.mark.parametrize("quota", [None, SOLO], ids=["no-quota", "quota"])
def test_the_bound_counts_exactly_the_tenants_waiting_jobs_under_churn(
    quota: QuotaPolicy | None,
) -> None:
    """Random submits (shares, two GPUs, priorities that preempt), ends and pauses: a submit
    is refused exactly when its tenant already has the bound's count of jobs in
    `waiting_jobs` (the O(1) count the queue keeps agrees with the scheduler's view)."""
    if quota is not None:
        quota = QuotaPolicy.from_yaml(
            "version: 1\ntenants:\n"
            "  acme: {quota: {gpus: 3, shared_gpus: 2}, max_priority: 5}\n"
            "  globex: {quota: {gpus: 2, shared_gpus: 2}, max_priority: 5}\n"
        )
    bound, rng = 4, random.Random(7)
    s = pool(quota, gpus=3, bound=bound)
    live: list[tuple[str, str]] = []
    refusals = 0
    for step in range(400):
        tenant = rng.choice(["acme", "globex"])
        roll = rng.random()
        if roll < 0.6:
            kw: dict[str, object] = {"priority": rng.randint(0, 5)}
            if rng.random() < 0.3:
                kw["gpu_milli"] = 500
            elif rng.random() < 0.3:
                kw["gpus"] = 2
            spec = JobSpec(job_id=f"j{step}", tenant=tenant, **{"gpus": 1, **kw})  # type: ignore[arg-type]
            waiting = sum(1 for t, _ in s.waiting_jobs if t == tenant)
            effects = s.submit(spec, float(step))
            refused = [e for e in effects if isinstance(e, Refused)]
            assert bool(refused) == (waiting >= bound), (step, waiting, effects)
            refusals += bool(refused)
            if not refused:
                live.append((tenant, spec.job_id))
        elif roll < 0.95 and live:
            t, j = live.pop(rng.randrange(len(live)))
            s.finish(t, j, float(step))
        else:
            s.set_paused(tenant, rng.random() < 0.5, float(step))
    assert refusals > 20  # the bound was reached, many times


def test_jobs_waiting_for_a_mig_instance_count_against_the_bound() -> None:
    """A tenant's MIG jobs waiting for an instance count as its queued and held ones do: the
    scheduler's count of a tenant's waiting jobs (`waiting_count_of`, from the queue's, the
    held jobs' and the MIG pool's public counts) is its share of `waiting_jobs`."""
    s = Scheduler(SchedulerConfig(max_waiting_per_tenant=3))
    gpu = GpuSpec(model="H100-80GB", mig_capable=True, mig_enabled=True)
    s.upsert_node(NodeSpec(name="m1", cpu_milli=64_000, memory_mib=256_000, gpus=(gpu,)), 0)
    whole = "7g.80gb"  # the GPU's one instance of this profile: the next such job waits
    assert placed(s.submit(job("a0", "acme", mig_profile=whole), 1.0)) == ["a0"]
    for jid, tenant in (("a1", "acme"), ("a2", "acme"), ("g1", "globex")):
        (w,) = s.submit(job(jid, tenant, mig_profile=whole), 2.0)
        assert isinstance(w, Waiting)
        assert w.reason == "insufficient_mig_slices"
    assert [s.waiting_count_of(t) for t in ("acme", "globex", "initech")] == [2, 1, 0]
    assert s.submit(job("a3", "acme"), 3.0)  # a whole GPU: queued (its one GPU is in MIG mode)
    assert s.waiting_count_of("acme") == 3
    assert s.waiting_count_of("acme") == sum(1 for t, _ in s.waiting_jobs if t == "acme")
    refused = s.submit(job("a4", "acme", mig_profile=whole), 4.0)
    assert [(type(e), e.reason) for e in refused] == [(Refused, TOO_MANY_WAITING)]  # type: ignore[union-attr]
    assert "'acme' has 3 jobs waiting" in refused[0].detail  # type: ignore[union-attr]
    s.finish("acme", "a1", 5.0)  # a MIG job's end while it waited makes room
    assert s.waiting_count_of("acme") == 2
    assert [type(e) for e in s.submit(job("a4", "acme", mig_profile=whole), 6.0)] == [Waiting]


def test_a_job_key_splits_back_into_its_tenant() -> None:
    """`tenant_of` is `job_key`'s inverse for the tenant (the one parse every count by tenant
    uses): a job id may hold a `/`, a tenant id never does."""
    assert tenant_of(job_key("acme", "train/1")) == "acme"
    assert tenant_of(job_key("acme-2", "x")) == "acme-2"
    assert [tenant_of(job_key(t, "j")) for t in ("a", "ab")] == ["a", "ab"]


def test_waiting_jobs_are_tried_again_by_priority_then_submission_then_key() -> None:
    """`retry_order`, the one order of the held jobs a release, an unpause or a fleet change
    tries again and of the MIG jobs a pass tries: a total order, so every replica agrees."""
    jobs = {
        job_key("acme", j): job(j, "acme", priority=p) for j, p in [("a", 0), ("b", 0), ("c", 5)]
    }
    held = [
        HeldJob(job_id=job_key("acme", "b"), reason="over_quota", submitted_s=1.0),
        HeldJob(job_id=job_key("acme", "a"), reason="over_quota", submitted_s=1.0),
        HeldJob(job_id=job_key("acme", "c"), reason="over_quota", submitted_s=9.0),
    ]
    assert [h.job_id for h in sorted(held, key=retry_order(jobs))] == [
        "acme/c",  # the highest priority, though submitted last
        "acme/a",  # then by submission, then by key
        "acme/b",
    ]
