"""Tenant quotas: a declarative policy, admission accounting, cohort borrowing and reclaim.

This module owns the accounting of what each tenant has admitted under a quota policy (the
policy's values and the reading of its YAML are `quota_policy`'s, re-exported here). It
decides whether a request fits its tenant's quota, may borrow idle quota from the tenant's
cohort, and which admitted workloads must be preempted to give a tenant back its
own quota or make room for its higher-priority work. It must not place anything on a GPU, read
a clock or touch the bus: placement decides *where*, this decides *whether the tenant may*.

Semantics follow Kueue's ClusterQueue/cohort model, one tenant per ClusterQueue:
- each tenant has a nominal quota per resource; `lending_limit` caps how much of it the cohort
  may borrow (the rest is guaranteed to the tenant), `borrowing_limit` caps how far the tenant
  may go above its nominal quota by borrowing;
- a cohort's lendable pool per resource is the sum of its members' lendable quota; a tenant's
  usage above its guaranteed part draws on that pool;
- a tenant asking for quota within its nominal that others have borrowed gets it back by
  preempting borrowed workloads (Kueue's `reclaimWithinCohort: Any`); a tenant at its quota may
  preempt its own lower-priority workloads (`withinClusterQueue: LowerPriority`).

Resources are counted per dimension: `gpus` (whole GPUs), `shared_gpus` (shared-GPU instances:
time-sliced or MPS replicas), `gpu_mem_mib`, and `mig/<profile>` (MIG instances per profile,
e.g. `mig/3g.40gb`, keyed as NVIDIA writes the profile however the policy spells it:
`1g.10gb.me` counts `mig/1g.10gb+me`). A dimension a tenant does not list has nominal quota 0,
except `gpu_mem_mib`, which is only enforced when given.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from seedance.slicer.core.quota_policy import (
    GPU_MEM_MIB,
    GPUS,
    MIG_PREFIX,
    SHARED_GPUS,
    QuotaError,
    QuotaPolicy,
    TenantQuota,
)

__all__ = [
    "Admitted",
    "PreemptionPlan",
    "QuotaDecision",
    "QuotaError",
    "QuotaPolicy",
    "QuotaRequest",
    "QuotaTracker",
    "RejectReason",
    "Rejected",
    "TenantQuota",
    "usage_of",
]


class RejectReason(enum.StrEnum):
    """Why a request is not admitted now. A closed set: it is a metric label."""

    UNKNOWN_TENANT = "unknown_tenant"
    INVALID_REQUEST = "invalid_request"
    DUPLICATE_WORKLOAD = "duplicate_workload"
    # Above nominal quota and the tenant has no cohort to borrow from.
    OVER_QUOTA = "over_quota"
    # Borrowing would take the tenant past its borrowing_limit.
    BORROWING_LIMIT = "borrowing_limit"
    # The cohort has no idle lendable quota left.
    COHORT_EXHAUSTED = "cohort_exhausted"
    # Within the tenant's nominal quota, but others have borrowed it: reclaim first
    # (QuotaTracker.plan_preemption names the victims).
    RECLAIM_REQUIRED = "reclaim_required"


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaRequest:
    """What one workload asks of its tenant's quota.

    - `workload_id`: unique per admitted workload; `release` takes it back.
    - `gpus`: whole GPUs when `milli` is 0 (or 1000) and `mig_profile` is None; otherwise the
      number of instances (shared replicas or MIG instances), at least 1.
    - `milli`: per-GPU share in thousandths (the Alibaba trace's `gpu_milli`); 1..999 means a
      shared GPU (time-sliced or MPS).
    - `mem_mib`: GPU memory the workload needs in total, counted against `gpu_mem_mib`.
    - `mig_profile`: a MIG profile name such as "3g.40gb"; counted against `mig/<profile>`.
    - `priority`: higher wins; used to pick preemption victims. None takes the tenant's
      `default_priority`.
    """

    workload_id: str
    tenant: str
    gpus: int = 0
    milli: int = 0
    mem_mib: int = 0
    mig_profile: str | None = None
    priority: int | None = None


def usage_of(request: QuotaRequest) -> dict[str, int]:
    """The quota dimensions a request consumes (see `QuotaRequest`)."""
    usage: dict[str, int] = {}
    if request.mig_profile is not None:
        usage[MIG_PREFIX + request.mig_profile] = max(request.gpus, 1)
    elif 0 < request.milli < 1000:
        usage[SHARED_GPUS] = max(request.gpus, 1)
    elif request.gpus > 0:
        usage[GPUS] = request.gpus
    if request.mem_mib > 0:
        usage[GPU_MEM_MIB] = request.mem_mib
    return usage


@dataclass(frozen=True, slots=True)
class Admitted:
    workload_id: str
    # Per dimension, how much of this workload runs on quota borrowed from the cohort.
    borrowed: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: RejectReason
    message: str


QuotaDecision = Admitted | Rejected


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """Workloads to preempt so that a request is admitted; `feasible` False if none suffice."""

    victims: tuple[str, ...]
    feasible: bool
    reason: str


@dataclass(frozen=True, slots=True)
class _Workload:
    request: QuotaRequest
    usage: Mapping[str, int]
    seq: int


class QuotaTracker:
    """What each tenant has admitted, against a `QuotaPolicy`.

    Pure bookkeeping: no clock, no I/O. `admit` either records the workload or changes nothing.
    """

    def __init__(self, policy: QuotaPolicy) -> None:
        self._policy = policy
        self._workloads: dict[str, _Workload] = {}
        self._usage: dict[str, dict[str, int]] = {t: {} for t in policy.tenants}
        self._seq = 0

    @property
    def policy(self) -> QuotaPolicy:
        return self._policy

    def priority_of(self, request: QuotaRequest) -> int:
        """The request's priority, or its tenant's default when it gives none."""
        if request.priority is not None:
            return request.priority
        quota = self._policy.tenants.get(request.tenant)
        return quota.default_priority if quota else 0

    def usage(self, tenant: str) -> Mapping[str, int]:
        return dict(self._usage[tenant])

    def borrowed(self, tenant: str) -> dict[str, int]:
        """Per dimension, how far the tenant is above its nominal quota."""
        quota = self._policy.tenants[tenant]
        out = {}
        for dim, used in self._usage[tenant].items():
            nominal = quota.nominal_of(dim)
            if nominal is not None and used > nominal:
                out[dim] = used - nominal
        return out

    def may_reclaim(self, claimant: str, holder: str, dim: str = GPUS) -> bool:
        """Whether `claimant`'s work may take capacity back from `holder`'s (Kueue's
        `reclaimWithinCohort: Any`): two tenants of one cohort, `holder` above its nominal
        quota in `dim` (it borrows), `claimant` within its own (what it asks for is its own
        quota, lent out)."""
        policy = self._policy.tenants
        if claimant not in policy or holder not in policy or claimant == holder:
            return False
        cohort = policy[claimant].cohort
        if cohort is None or policy[holder].cohort != cohort:
            return False
        nominal = policy[claimant].nominal_of(dim)
        within = nominal is None or self._usage[claimant].get(dim, 0) <= nominal
        return within and self.borrowed(holder).get(dim, 0) > 0

    def admitted(self, tenant: str | None = None) -> tuple[str, ...]:
        return tuple(
            w for w, wl in self._workloads.items() if tenant is None or wl.request.tenant == tenant
        )

    def check(self, request: QuotaRequest) -> QuotaDecision:
        """What `admit` would decide, without recording anything."""
        invalid = _invalid(request)
        if invalid:
            return Rejected(RejectReason.INVALID_REQUEST, invalid)
        if request.tenant not in self._policy.tenants:
            return Rejected(
                RejectReason.UNKNOWN_TENANT,
                f"tenant {request.tenant!r} is not in the quota policy",
            )
        if request.workload_id in self._workloads:
            return Rejected(
                RejectReason.DUPLICATE_WORKLOAD,
                f"workload {request.workload_id!r} is already admitted",
            )
        verdict = self._fits(request.tenant, usage_of(request), self._usage)
        if isinstance(verdict, Rejected):
            return verdict
        return Admitted(request.workload_id, verdict)

    def admit(self, request: QuotaRequest) -> QuotaDecision:
        decision = self.check(request)
        if isinstance(decision, Admitted):
            usage = usage_of(request)
            self._seq += 1
            self._workloads[request.workload_id] = _Workload(request, usage, self._seq)
            _add(self._usage[request.tenant], usage, +1)
        return decision

    def account(self, request: QuotaRequest) -> bool:
        """Record a workload admitted earlier, under another policy, without checking it.

        A new policy (`Scheduler.set_quota`) takes over the workloads already admitted: they
        keep running and count against it, even above a lowered quota (which then admits
        nothing new until they end); nothing is preempted for it. False (nothing recorded) for
        a tenant the policy does not know, an invalid request, or a workload already recorded.
        """
        if (
            request.tenant not in self._policy.tenants
            or request.workload_id in self._workloads
            or _invalid(request)
        ):
            return False
        usage = usage_of(request)
        self._seq += 1
        self._workloads[request.workload_id] = _Workload(request, usage, self._seq)
        _add(self._usage[request.tenant], usage, +1)
        return True

    def release(self, workload_id: str) -> bool:
        """Give a workload's quota back; False if it was not admitted (idempotent)."""
        wl = self._workloads.pop(workload_id, None)
        if wl is None:
            return False
        _add(self._usage[wl.request.tenant], wl.usage, -1)
        return True

    def plan_preemption(self, request: QuotaRequest) -> PreemptionPlan:
        """Which admitted workloads to preempt so `request` is admitted.

        First reclaim, when the request stays within its tenant's nominal quota: workloads of
        other cohort members, lowest priority first, then most recently admitted, taken only
        while their tenant is above its nominal quota in a dimension the request needs. Then
        the tenant's own workloads of strictly lower priority, same order. Nothing is changed:
        the caller preempts, then calls `release` for each victim and `admit` again.
        """
        decision = self.check(request)
        if isinstance(decision, Admitted):
            return PreemptionPlan((), True, "fits without preemption")
        if decision.reason in (
            RejectReason.INVALID_REQUEST,
            RejectReason.UNKNOWN_TENANT,
            RejectReason.DUPLICATE_WORKLOAD,
        ):
            return PreemptionPlan((), False, decision.message)
        tenant = self._policy.tenants[request.tenant]
        need = usage_of(request)
        usage = {t: dict(u) for t, u in self._usage.items()}
        victims: list[str] = []

        def order(w: _Workload) -> tuple[int, int]:
            return (self.priority_of(w.request), -w.seq)

        # Reclaim is only for a tenant asking for its own nominal quota back, as in Kueue; a
        # request that would itself borrow may only preempt its own tenant's workloads.
        within_nominal = all(
            (nominal := tenant.nominal_of(dim)) is None
            or usage[tenant.name].get(dim, 0) + amount <= nominal
            for dim, amount in need.items()
        )
        borrowers = sorted(
            (
                w
                for w in self._workloads.values()
                if within_nominal
                and tenant.cohort is not None
                and w.request.tenant != tenant.name
                and self._policy.tenants[w.request.tenant].cohort == tenant.cohort
                and any(d in need for d in w.usage)
            ),
            key=order,
        )
        own = sorted(
            (
                w
                for w in self._workloads.values()
                if w.request.tenant == tenant.name
                and self.priority_of(w.request) < self.priority_of(request)
                and any(d in need for d in w.usage)
            ),
            key=order,
        )
        for candidates, is_reclaim in ((borrowers, True), (own, False)):
            for w in candidates:
                if not isinstance(self._fits(tenant.name, need, usage), Rejected):
                    break
                if is_reclaim and not self._is_borrowing(w, usage, need):
                    continue
                victims.append(w.request.workload_id)
                _add(usage[w.request.tenant], w.usage, -1)
        verdict = self._fits(tenant.name, need, usage)
        if not isinstance(verdict, Rejected):
            return PreemptionPlan(tuple(victims), True, f"preempt {len(victims)} workload(s)")
        return PreemptionPlan((), False, verdict.message)

    def _is_borrowing(
        self, w: _Workload, usage: Mapping[str, Mapping[str, int]], need: Mapping[str, int]
    ) -> bool:
        quota = self._policy.tenants[w.request.tenant]
        for dim in need:
            nominal = quota.nominal_of(dim)
            if (
                dim in w.usage
                and nominal is not None
                and usage[w.request.tenant].get(dim, 0) > (nominal)
            ):
                return True
        return False

    def _fits(
        self, tenant_name: str, need: Mapping[str, int], usage: Mapping[str, Mapping[str, int]]
    ) -> Rejected | dict[str, int]:
        """Rejected, or per dimension how much of `need` would be borrowed."""
        tenant = self._policy.tenants[tenant_name]
        borrowed: dict[str, int] = {}
        for dim, amount in need.items():
            nominal = tenant.nominal_of(dim)
            if nominal is None:
                continue
            used = usage[tenant_name].get(dim, 0) + amount
            label = dim.removeprefix(MIG_PREFIX)
            if tenant.cohort is None:
                if used > nominal:
                    return Rejected(
                        RejectReason.OVER_QUOTA,
                        f"tenant {tenant_name!r} would use {used} {label} over its quota "
                        f"{nominal} and has no cohort to borrow from",
                    )
                continue
            over = used - nominal
            limit = tenant.borrowing_limit.get(dim)
            if over > 0 and limit is not None and over > limit:
                return Rejected(
                    RejectReason.BORROWING_LIMIT,
                    f"tenant {tenant_name!r} would borrow {over} {label}, over its "
                    f"borrowing_limit {limit}",
                )
            # A member that does not enforce this dimension neither lends nor borrows it.
            members = [
                m for m in self._policy.members(tenant.cohort) if m.nominal_of(dim) is not None
            ]
            pool = sum(m.lendable(dim) for m in members)
            drawn = sum(
                max(0, usage[m.name].get(dim, 0) + (amount if m.name == tenant_name else 0)
                    - m.guaranteed(dim))
                for m in members
            )  # fmt: skip
            if drawn > pool:
                if over <= 0:
                    return Rejected(
                        RejectReason.RECLAIM_REQUIRED,
                        f"tenant {tenant_name!r} is within its {label} quota {nominal}, but "
                        f"cohort {tenant.cohort!r} has lent it out: reclaim first",
                    )
                return Rejected(
                    RejectReason.COHORT_EXHAUSTED,
                    f"cohort {tenant.cohort!r} has no idle {label} to lend "
                    f"(tenant {tenant_name!r} would use {used}, quota {nominal})",
                )
            if over > 0:
                borrowed[dim] = min(over, amount)
        return borrowed


def _invalid(request: QuotaRequest) -> str | None:
    if not request.workload_id:
        return "workload_id: must not be empty"
    for name in ("gpus", "milli", "mem_mib"):
        value = getattr(request, name)
        if value < 0:
            return f"{name}: must be >= 0, got {value}"
    if request.milli > 1000:
        return f"milli: a per-GPU share is at most 1000, got {request.milli}"
    if request.mig_profile is not None and 0 < request.milli < 1000:
        return f"mig_profile {request.mig_profile!r} and milli {request.milli} exclude each other"
    if not usage_of(request):
        return "request asks for nothing (gpus, milli, mem_mib and mig_profile all empty)"
    return None


def _add(into: dict[str, int], usage: Mapping[str, int], sign: int) -> None:
    for dim, amount in usage.items():
        into[dim] = into.get(dim, 0) + sign * amount
        if into[dim] == 0:
            del into[dim]
