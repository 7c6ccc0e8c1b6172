"""Tenant quotas: a declarative policy, admission accounting, cohort borrowing and reclaim.

This module owns the quota policy (parsed from YAML) and the accounting of what each tenant has
admitted. It decides whether a request fits its tenant's quota, may borrow idle quota from the
tenant's cohort, and which admitted workloads must be preempted to give a tenant back its
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
from typing import Any

from seedance.events.gpus import mig_gpu_instance
from seedance.slicer.core.bounded_yaml import DocumentError, bounded_name, bounded_repr, load

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

GPUS = "gpus"
SHARED_GPUS = "shared_gpus"
GPU_MEM_MIB = "gpu_mem_mib"
MIG_PREFIX = "mig/"
_SCALAR_KEYS = (GPUS, SHARED_GPUS, GPU_MEM_MIB)
_TENANT_FIELDS = {
    "cohort", "quota", "lending_limit", "borrowing_limit", "default_priority", "max_priority"
}  # fmt: skip


class QuotaError(ValueError):
    """The policy is invalid; the message names the field and the value."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class TenantQuota:
    name: str
    cohort: str | None
    nominal: Mapping[str, int]
    lending_limit: Mapping[str, int]
    borrowing_limit: Mapping[str, int]
    default_priority: int = 0
    #: The highest priority a request of this tenant gets: a higher one is capped here (Kueue
    #: bounds a ClusterQueue's workloads the same way). None: `default_priority`.
    max_priority: int | None = None

    @property
    def priority_cap(self) -> int:
        return self.default_priority if self.max_priority is None else self.max_priority

    def nominal_of(self, dim: str) -> int | None:
        """Nominal quota of a dimension; None means not enforced (only `gpu_mem_mib`)."""
        if dim in self.nominal:
            return self.nominal[dim]
        return None if dim == GPU_MEM_MIB else 0

    def lendable(self, dim: str) -> int:
        nominal = self.nominal_of(dim) or 0
        return min(nominal, self.lending_limit.get(dim, nominal))

    def guaranteed(self, dim: str) -> int:
        return (self.nominal_of(dim) or 0) - self.lendable(dim)


@dataclass(frozen=True, slots=True)
class QuotaPolicy:
    """Tenants and their cohorts, parsed and validated once."""

    tenants: Mapping[str, TenantQuota]
    priority_classes: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_yaml(cls, text: str) -> QuotaPolicy:
        """Parse a policy; raises QuotaError naming the offending field and value.

        Format (see docs/slicer-mig-quota-k8s.md)::

            version: 1
            priority_classes: {high: 1000, normal: 100, low: 0}   # optional
            tenants:
              team-a:
                cohort: research           # optional
                default_priority: 100      # optional, or a priority class name
                max_priority: high         # optional (default: default_priority), or a class
                quota: {gpus: 8, shared_gpus: 16, gpu_mem_mib: 655360,
                        mig: {1g.10gb: 7, 3g.40gb: 2}}
                lending_limit: {gpus: 4}   # optional, per dimension
                borrowing_limit: {gpus: 4} # optional, per dimension
        """
        try:
            doc = load(text)  # no aliases, bounded size and depth: text from the bus
        except DocumentError as exc:
            raise QuotaError(f"policy {exc}") from None
        if not isinstance(doc, dict):
            raise QuotaError(f"policy must be a mapping, got {type(doc).__name__}")
        _only_keys(doc, {"version", "priority_classes", "tenants"}, "policy")
        if doc.get("version") != 1:
            raise QuotaError(f"version: expected 1, got {bounded_repr(doc.get('version'))}")
        classes_raw = doc.get("priority_classes") or {}
        if not isinstance(classes_raw, dict):
            raise QuotaError(
                f"priority_classes: expected a mapping, got {bounded_repr(classes_raw)}"
            )
        classes = {
            str(k): _int(v, f"priority_classes.{bounded_name(k)}", minimum=None)
            for k, v in classes_raw.items()
        }
        tenants_raw = doc.get("tenants")
        if not isinstance(tenants_raw, dict) or not tenants_raw:
            raise QuotaError(
                f"tenants: expected a non-empty mapping, got {bounded_repr(tenants_raw)}"
            )
        tenants = {}
        for name, body in tenants_raw.items():
            tenants[str(name)] = _parse_tenant(str(name), body, classes)
        return cls(tenants=tenants, priority_classes=classes)

    def members(self, cohort: str) -> tuple[TenantQuota, ...]:
        return tuple(t for t in self.tenants.values() if t.cohort == cohort)


def _only_keys(body: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(body) - allowed, key=str)  # keys may be of mixed types
    if extra:
        raise QuotaError(
            f"{where}: unknown field {bounded_repr(extra[0])} (allowed: {sorted(allowed)})"
        )


def _int(value: object, where: str, *, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QuotaError(f"{where}: expected an integer, got {bounded_repr(value)}")
    if minimum is not None and value < minimum:
        raise QuotaError(f"{where}: must be >= {minimum}, got {bounded_repr(value)}")
    return value


def _parse_dims(raw: object, where: str) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise QuotaError(f"{where}: expected a mapping, got {bounded_repr(raw)}")
    _only_keys(raw, {*_SCALAR_KEYS, "mig"}, where)
    dims = {k: _int(raw[k], f"{where}.{k}") for k in _SCALAR_KEYS if k in raw}
    mig = raw.get("mig")
    if mig is not None:
        if not isinstance(mig, dict):
            raise QuotaError(
                f"{where}.mig: expected a mapping of profile to count, got {bounded_repr(mig)}"
            )
        for prof, count in mig.items():
            dim = MIG_PREFIX + _mig_key(prof, f"{where}.mig")
            if dim in dims:  # two spellings of one profile (1g.10gb+me, 1g.10gb.me)
                raise QuotaError(f"{where}.mig: {bounded_repr(prof)} is a second key for {dim}")
            dims[dim] = _int(count, f"{where}.mig.{bounded_name(prof)}")
    return dims


def _mig_key(prof: object, where: str) -> str:
    """A MIG key in any spelling NVIDIA writes, as placements name it (``gpus.mig_gpu_instance``:
    ``1g.10gb.me`` is ``1g.10gb+me``); QuotaError naming it where it is no GPU instance."""
    text = prof if isinstance(prof, str) else ""
    try:
        return mig_gpu_instance(text)
    except ValueError as exc:
        why = str(exc).removeprefix(repr(text))
        raise QuotaError(f"{where}: {bounded_repr(prof)}{why}") from None


def _parse_tenant(name: str, body: object, classes: Mapping[str, int]) -> TenantQuota:
    where = f"tenants.{bounded_name(name)}"
    if not isinstance(body, dict):
        raise QuotaError(f"{where}: expected a mapping, got {bounded_repr(body)}")
    _only_keys(body, _TENANT_FIELDS, where)
    cohort = body.get("cohort")
    if cohort is not None and (not isinstance(cohort, str) or not cohort):
        raise QuotaError(f"{where}.cohort: expected a non-empty string, got {bounded_repr(cohort)}")
    nominal = _parse_dims(body.get("quota"), f"{where}.quota")
    lending = _parse_dims(body.get("lending_limit"), f"{where}.lending_limit")
    borrowing = _parse_dims(body.get("borrowing_limit"), f"{where}.borrowing_limit")
    if cohort is None and (lending or borrowing):
        field_name = "lending_limit" if lending else "borrowing_limit"
        raise QuotaError(f"{where}.{field_name}: only meaningful with a cohort, none given")
    for dim, limit in lending.items():
        if limit > nominal.get(dim, 0):
            raise QuotaError(
                f"{where}.lending_limit.{bounded_name(dim.removeprefix(MIG_PREFIX))}: {limit} "
                f"exceeds the nominal quota {nominal.get(dim, 0)}"
            )
    prio = _priority(body.get("default_priority", 0), f"{where}.default_priority", classes)
    max_prio = _priority(body.get("max_priority", prio), f"{where}.max_priority", classes)
    if max_prio < prio:
        raise QuotaError(f"{where}.max_priority: {max_prio} is below default_priority {prio}")
    return TenantQuota(
        name=name,
        cohort=cohort,
        nominal=nominal,
        lending_limit=lending,
        borrowing_limit=borrowing,
        default_priority=prio,
        max_priority=max_prio,
    )


def _priority(raw: object, where: str, classes: Mapping[str, int]) -> int:
    """A priority: an integer or the name of one of `priority_classes`."""
    if isinstance(raw, str):
        if raw not in classes:
            raise QuotaError(
                f"{where}: unknown priority class {bounded_repr(raw)} "
                f"(known: {bounded_repr(sorted(classes))})"
            )
        return classes[raw]
    return _int(raw, where, minimum=None)


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
        quota, used = self._policy.tenants[w.request.tenant], usage[w.request.tenant]
        return any(
            dim in w.usage
            and (nominal := quota.nominal_of(dim)) is not None
            and used.get(dim, 0) > nominal
            for dim in need
        )

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
