"""Whether a tenant's job may be queued now: pauses, quotas, and the jobs held back.

Owns the admission part of the scheduler's state: the tenants the budget guard paused, the
jobs held back (paused, over quota, or evicted by a cohort reclaim) with the reason last
published, and the quota accounting of the admitted jobs (`QuotaTracker`, rebuilt from the
jobs on restore: it is derived, never persisted). It must not place anything (the scheduler
queues what is admitted); no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from seedance.slicer.core.inputs import JobSpec
from seedance.slicer.core.quota import QuotaDecision, QuotaPolicy, QuotaRequest, QuotaTracker
from seedance.slicer.core.snapshot import HeldJob

__all__ = ["Admission", "counts_quota"]


class Admission:
    def __init__(
        self,
        quota: QuotaPolicy | None,
        *,
        held: Iterable[HeldJob] = (),
        paused: Iterable[str] = (),
    ) -> None:
        self.quota = quota
        self._tracker = QuotaTracker(quota) if quota is not None else None
        self.held: list[HeldJob] = list(held)
        self.paused: list[str] = list(paused)

    # -- quota ------------------------------------------------------------------------------
    def capped(self, job: JobSpec) -> JobSpec:
        """The request with its priority capped at the tenant's quota bound."""
        if self.quota is None:
            return job
        quota = self.quota.tenants.get(job.tenant)
        if quota is None or job.priority <= quota.priority_cap:
            return job
        return msgspec.structs.replace(job, priority=quota.priority_cap)

    def usage(self) -> dict[str, dict[str, int]]:
        """Per tenant of the policy, what its admitted work holds (quota dimensions)."""
        if self._tracker is None or self.quota is None:
            return {}
        return {t: dict(self._tracker.usage(t)) for t in sorted(self.quota.tenants)}

    def unknown_tenant(self, tenant: str) -> bool:
        return self.quota is not None and tenant not in self.quota.tenants

    def with_quota(self, quota: QuotaPolicy | None, jobs: Mapping[str, JobSpec]) -> Admission:
        """The same held jobs and pauses under another policy, the admitted ones of `jobs`
        counted against it (`restore_admitted`)."""
        out = Admission(quota, held=self.held, paused=self.paused)
        out.restore_admitted(jobs)
        return out

    def restore_admitted(self, jobs: Mapping[str, JobSpec]) -> None:
        """Account the admitted ones of `jobs` (those not held back), as they are: admitted
        work counts against the policy even above it (a lowered quota, `Scheduler.set_quota`),
        so the same state under the same policy always counts the same."""
        if self._tracker is None:
            return
        held = {h.job_id for h in self.held}
        for key, job in jobs.items():
            if key not in held and counts_quota(job):
                self._tracker.account(quota_request(job))

    def admit(self, job: JobSpec) -> QuotaDecision | None:
        """Account `job` against its quota (None: no quota applies to it)."""
        if self._tracker is None or not counts_quota(job):
            return None
        return self._tracker.admit(quota_request(job))

    def victims(self, job: JobSpec) -> tuple[str, ...]:
        """The admitted jobs whose preemption would admit `job` (none when none would)."""
        assert self._tracker is not None
        plan = self._tracker.plan_preemption(quota_request(job))
        return plan.victims if plan.feasible else ()

    def may_reclaim(self, claimant: str, holder: str) -> bool:
        """Whether `claimant` may take GPUs back from `holder` under the cohort rules (never
        without a quota policy: then no tenant's work is another's to take)."""
        return self._tracker is not None and self._tracker.may_reclaim(claimant, holder)

    def release(self, key: str) -> None:
        """Give back the quota `key` was admitted with (nothing when it was not)."""
        if self._tracker is not None:
            self._tracker.release(key)

    # -- held jobs --------------------------------------------------------------------------
    def hold(self, key: str, reason: str, submitted_s: float) -> None:
        self.drop(key)
        self.held.append(HeldJob(job_id=key, reason=reason, submitted_s=submitted_s))

    def drop(self, key: str) -> None:
        self.held = [h for h in self.held if h.job_id != key]

    def held_job(self, key: str) -> HeldJob | None:
        return next((h for h in self.held if h.job_id == key), None)

    def set_reason(self, key: str, reason: str) -> None:
        self.held = [
            msgspec.structs.replace(h, reason=reason) if h.job_id == key else h for h in self.held
        ]


def counts_quota(job: JobSpec) -> bool:
    """CPU-only jobs consume no quota dimension (the quota covers GPUs and their memory)."""
    return job.gpus > 0 or job.mig_profile is not None


def quota_request(job: JobSpec) -> QuotaRequest:
    members = job.gang_size * max(job.gpus, 1)
    return QuotaRequest(
        workload_id=job.key,
        tenant=job.tenant,
        gpus=members,
        milli=0 if job.mig_profile else job.gpu_milli,
        mem_mib=job.gpu_mem_mib * members,
        mig_profile=job.mig_profile,
        priority=job.priority,
    )
