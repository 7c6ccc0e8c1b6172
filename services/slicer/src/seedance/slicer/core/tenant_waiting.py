"""What one tenant's waiting jobs may cost everyone: the bound on them and the retry they cause.

Owns, for `seedance.slicer.core.scheduler.Scheduler`, the requests the scheduler refuses before
queueing them (`submit_refusal`: an invalid request, a tenant the quota file does not list, a
tenant already at its bound on waiting jobs) and which held jobs a release re-checks against
the quota (`freed_retry`). Both exist so that one tenant's flood of requests cannot stall the
others' job ends: before, every job end re-checked every held job of every tenant (7.1 s per
release with 5,000 of one tenant's over-quota jobs), and nothing bounded a tenant's waiting
jobs (each ~1.9 KiB of the slicer's memory, restored from the durable state after a crash).

* **The bound**: a tenant may have at most `SchedulerConfig.max_waiting_per_tenant` jobs
  waiting (queued, waiting for a MIG instance, or held back: not running); a submit past it is
  refused, `too_many_waiting`, naming the bound and the count. The count is derived from the
  state (the queue's, the held and the MIG waiting jobs of the tenant), so every replica
  refuses the same submit.
* **The retry**: a job end frees quota only when the job was admitted; then only the held jobs
  of its tenant's cohort (the tenant alone without one) waiting for quota, in a dimension the
  ended job held, are re-checked, in priority then submission order, and a request shape
  (tenant, quota usage, priority) refused once is not re-checked again in that pass: its later
  jobs would be refused alike (they wait for the next release); after `REFUSED_PER_TENANT`
  shapes of one tenant refused, its other held jobs wait for the next release unchecked. The
  count of re-checks is `Scheduler.held_rechecked` (`seedance_slicer_held_rechecked_total`).

It must not place anything; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from seedance.events.jobs import request_problem
from seedance.slicer.core.admission import counts_quota, quota_request
from seedance.slicer.core.effects import QUOTA_HELD, Effect, Refused, Waiting
from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.model import MAX_GPUS_PER_NODE
from seedance.slicer.core.quota import usage_of
from seedance.slicer.core.snapshot import HeldJob

if TYPE_CHECKING:
    from seedance.slicer.core.scheduler import Scheduler

__all__ = [
    "QUOTA_HELD",
    "REFUSED_PER_TENANT",
    "TOO_MANY_WAITING",
    "freed_retry",
    "invalid_reason",
    "retry",
    "retry_order",
    "shape_key",
    "submit_refusal",
]

#: The refusal of a submit past the tenant's bound on waiting jobs (a `RejectionReason`).
TOO_MANY_WAITING = "too_many_waiting"

#: A release re-checks at most this many of one tenant's request shapes that its quota still
#: refuses; the tenant's later held jobs wait, unchecked, for the next release.
REFUSED_PER_TENANT = 32


def submit_refusal(sched: Scheduler, job: JobSpec) -> Refused | None:
    """Why a new request is refused rather than queued (None: it is taken)."""
    bad = invalid_reason(job)
    if bad:
        return Refused(job, "invalid_request", bad)
    if sched.quota is not None and job.tenant not in sched.quota.tenants:
        return Refused(job, "unknown_tenant", f"tenant {job.tenant!r} is not in the quota file")
    bound = sched.config.max_waiting_per_tenant
    if bound <= 0:
        return None
    waiting = sched.waiting_count_of(job.tenant, bound)
    if waiting < bound:
        return None
    return Refused(
        job,
        TOO_MANY_WAITING,
        f"tenant {job.tenant!r} has {waiting} jobs waiting (queued or held), at its bound of "
        f"{bound} (SEEDANCE_SLICER_MAX_WAITING_PER_TENANT): end or cancel waiting jobs first",
    )


def freed_retry(sched: Scheduler, tenant: str, freed: Mapping[str, int]) -> list[HeldJob]:
    """The held jobs a release of `freed` (quota dimensions) by `tenant` may admit, in the
    order they are re-checked: its cohort's jobs held for quota in one of those dimensions."""
    admission, jobs = sched._admission, sched._jobs
    ready = [
        h
        for member in admission.cohort_of(tenant)
        for h in admission.held_of(member)
        if h.reason in QUOTA_HELD and _needs(jobs[h.job_id], freed)
    ]
    ready.sort(key=retry_order(jobs))
    return ready


def retry_order(jobs: Mapping[str, JobSpec]) -> Callable[[HeldJob], tuple[int, float, str]]:
    """The sort key of the order waiting jobs are tried again in (held ones on a release, an
    unpause or a fleet change, MIG ones at every pass): priority (their `jobs` entry's, as
    capped), then submission, then key, a total order so every replica tries them alike."""

    def order(h: HeldJob) -> tuple[int, float, str]:
        return (-jobs[h.job_id].priority, h.submitted_s, h.job_id)

    return order


def retry(
    sched: Scheduler,
    ready: list[HeldJob],
    now_s: float,
    alike: Callable[[JobSpec], object] | None = None,
) -> list[Effect]:
    """Admit `ready` again, in order (`Scheduler._admit`); with `alike`, a job alike one still
    held for quota in this pass stays held unchecked (its check would refuse it too), and so
    do a tenant's jobs after `REFUSED_PER_TENANT` of its shapes were refused in the pass."""
    out: list[Effect] = []
    refused: set[object] = set()
    refusals: dict[str, int] = {}  # by tenant, with `alike`
    for h in ready:
        job = sched._jobs[h.job_id]
        shape = alike(job) if alike is not None else None
        if alike is not None and (
            shape in refused or refusals.get(job.tenant, 0) >= REFUSED_PER_TENANT
        ):
            continue
        sched._admission.drop(h.job_id)
        sched.held_rechecked += 1
        effects = sched._admit(job, h.submitted_s, now_s)
        # Still waiting for the same reason: nothing new to say.
        again = sched._admission.held_job(h.job_id)
        if again is not None and again.reason == h.reason:
            effects = [e for e in effects if not isinstance(e, Waiting) or e.job is not job]
        if alike is not None and again is not None and again.reason in QUOTA_HELD:
            refused.add(shape)
            refusals[job.tenant] = refusals.get(job.tenant, 0) + 1
        out.extend(effects)
    return out


def shape_key(job: JobSpec) -> tuple[object, ...]:
    """What decides a quota re-check alike for two jobs: tenant, quota usage, priority."""
    usage = usage_of(quota_request(job)) if counts_quota(job) else {}
    return (job.tenant, tuple(sorted(usage.items())), job.priority)


def _needs(job: JobSpec, freed: Mapping[str, int]) -> bool:
    return counts_quota(job) and any(d in freed for d in usage_of(quota_request(job)))


def invalid_reason(job: JobSpec) -> str:
    """Why the scheduler can never take `job` ("" when it can): the request rule every
    submitter checks too (`seedance.events.jobs.request_problem`, which the SDK runs before
    publishing), and this core's node model (at most 8 GPUs per node, a limit of the pool, not
    of the request schema)."""
    problem = request_problem(
        gpus=job.gpus, gpu_milli=job.gpu_milli, mig_profile=job.mig_profile,
        gang_size=job.gang_size, mig=job.mig,
    )  # fmt: skip
    if problem:
        return problem
    if job.mig and job.mig_profile is None:
        return (
            "a MIG instance of the SlicingPolicy's default profile, and the policy in force "
            "names none (spec.mig.defaultProfile): name a profile or set one"
        )
    if job.gpus > MAX_GPUS_PER_NODE:
        return f"gpus={job.gpus} per gang member exceeds {MAX_GPUS_PER_NODE} GPUs per node"
    return ""
