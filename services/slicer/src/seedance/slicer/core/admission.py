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

from seedance.slicer.core.inputs import JobSpec, tenant_of
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
        # The held jobs by key, in the order held (a re-hold moves a job last), and their keys
        # by tenant: a release re-checks its cohort's alone, and a tenant's count is bounded
        # (`seedance.slicer.core.tenant_waiting`).
        self._held: dict[str, HeldJob] = {}
        self._by_tenant: dict[str, dict[str, None]] = {}
        for h in held:
            self._put(h)
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

    def with_quota(self, quota: QuotaPolicy | None, jobs: Mapping[str, JobSpec]) -> Admission:
        """The same held jobs and pauses under another policy, the admitted ones of `jobs`
        counted against it (`restore_admitted`)."""
        out = Admission(quota, held=self._held.values(), paused=self.paused)
        out.restore_admitted(jobs)
        return out

    def restore_admitted(self, jobs: Mapping[str, JobSpec]) -> None:
        """Account the admitted ones of `jobs` (those not held back), as they are: admitted
        work counts against the policy even above it (a lowered quota, `Scheduler.set_quota`),
        so the same state under the same policy always counts the same."""
        if self._tracker is None:
            return
        for key, job in jobs.items():
            if key not in self._held and counts_quota(job):
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

    def release(self, key: str) -> bool:
        """Give back the quota `key` was admitted with; False (nothing) when it was not."""
        return self._tracker is not None and self._tracker.release(key)

    def cohort_of(self, tenant: str) -> tuple[str, ...]:
        """The tenants whose quota a release of `tenant`'s may free: its cohort's (itself
        alone without a cohort)."""
        quota = self.quota.tenants.get(tenant) if self.quota is not None else None
        if quota is None or quota.cohort is None:
            return (tenant,)
        return tuple(m.name for m in self.quota.members(quota.cohort))  # type: ignore[union-attr]

    # -- held jobs --------------------------------------------------------------------------
    @property
    def held(self) -> list[HeldJob]:
        """The jobs held back, in the order held."""
        return list(self._held.values())

    def held_of(self, tenant: str) -> list[HeldJob]:
        """`tenant`'s held jobs, in the order held."""
        return [self._held[k] for k in self._by_tenant.get(tenant, ())]

    def held_count(self, tenant: str) -> int:
        return len(self._by_tenant.get(tenant, ()))

    def hold(self, key: str, reason: str, submitted_s: float) -> None:
        self.drop(key)
        self._put(HeldJob(job_id=key, reason=reason, submitted_s=submitted_s))

    def _put(self, h: HeldJob) -> None:
        self._held[h.job_id] = h
        self._by_tenant.setdefault(tenant_of(h.job_id), {})[h.job_id] = None

    def drop(self, key: str) -> None:
        if self._held.pop(key, None) is not None:
            tenant = tenant_of(key)
            keys = self._by_tenant[tenant]
            del keys[key]
            if not keys:
                del self._by_tenant[tenant]

    def held_job(self, key: str) -> HeldJob | None:
        return self._held.get(key)

    def set_reason(self, key: str, reason: str) -> None:
        if key in self._held:  # keeps its place, as before
            self._held[key] = msgspec.structs.replace(self._held[key], reason=reason)


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
