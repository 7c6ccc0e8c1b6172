"""Seedance's CRs (SlicingPolicy, TenantQuota) to what the slicer reads, and each CR's status.

Owns the reconciliation of the `seedance.io/v1alpha1` custom resources (plain mappings, as the
API server returns them) into three things:

- the quota document the slicer parses (`QuotaPolicy.from_yaml`'s mapping: `version: 1`,
  `priority_classes`, `tenants`), which the bridge writes to the bus (KV `seedance-policy`, key
  `quota`; see docs/k8s-crds.md);
- the namespace -> tenant bindings the bridge gives each pod its tenant by;
- per CR a status (`observedGeneration`, `Accepted` and `Ready` conditions with a reason, and
  for a TenantQuota its usage) for what only the reconciler can know: a namespace claimed by
  two tenants, two CRs naming one tenant, a cohort with one member, an unknown PriorityClass,
  a quota the slicer's parser would refuse.

The CRDs' schemas and CEL rules refuse most bad specs at the API server; this module checks
them again with the slicer's own rules (a CR admitted before a rule existed, or by a server
that does not evaluate CEL, must not reach the slicer and make it refuse the whole document).
It does not import the slicer (services never import each other): the rules are mirrored, and
a test runs both on the same inputs. It must do no I/O and read no clock: the time stamped on a
changed condition comes in as `observed_at`.

Precedence is deterministic, so two bridges (or a restart) reconcile the same objects to the
same result: among CRs that claim the same tenant or namespace, the oldest (creationTimestamp,
then name) wins and the others are told why in their status.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seedance.events.gpus import mig_gpu_instance
from seedance.events.slicing_policy import SlicingApplied
from seedance.events.tokens import InvalidToken, check_tenant
from seedance.k8s_bridge.core.cr_status import ACCEPTED, MIG_PROFILE, READY, Reason
from seedance.k8s_bridge.core.cr_status import Invalid as _Invalid
from seedance.k8s_bridge.core.cr_status import cr_name as _name
from seedance.k8s_bridge.core.cr_status import oldest_first as _oldest_first
from seedance.k8s_bridge.core.cr_status import status as _status
from seedance.k8s_bridge.core.slicing_cr import (
    SLICING_POLICY,
    SLICING_POLICY_IN_FORCE,
    merge_applied,
    reconcile_policies,
)

__all__ = [
    "ACCEPTED",
    "GROUP",
    "MIG_PROFILE",
    "READY",
    "SLICING_POLICY",
    "SLICING_POLICY_IN_FORCE",
    "TENANT_QUOTA",
    "VERSION",
    "Reason",
    "Reconciled",
    "merge_applied",
    "merge_usage",
    "quota_dims",
    "reconcile",
    "tenant_entry",
]

GROUP = "seedance.io"
VERSION = "v1alpha1"
TENANT_QUOTA = "TenantQuota"

#: CR quota field (camelCase, the Kubernetes convention) -> the slicer's quota dimension.
_SCALARS = (("gpus", "gpus"), ("sharedGpus", "shared_gpus"), ("gpuMemMiB", "gpu_mem_mib"))
#: Reserved tenant ids (their subjects would overlap non-tenant ones: seedance.events.permissions).
_RESERVED_TENANTS = frozenset({"node"})


@dataclass(frozen=True, slots=True)
class Reconciled:
    """What the CRs say, for the slicer, the pod translation and each CR's status.

    - `quota_document`: the mapping `QuotaPolicy.from_yaml` parses (dump it as YAML or JSON);
      None when no TenantQuota is accepted (then the slicer has no quota from Kubernetes).
    - `slicing`: the spec of the SlicingPolicy in force (`default`), None when there is none;
      `slicing_document`: it as the slicer reads it (`SlicingPolicyDoc` JSON, for the KV key
      ``slicing``; None: delete the key).
    - `namespaces`: namespace -> tenant id, for accepted quotas only.
    - `statuses`: (kind, name) -> the status to write on that CR's /status subresource.
    """

    quota_document: Mapping[str, Any] | None
    slicing: Mapping[str, Any] | None
    namespaces: Mapping[str, str]
    statuses: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    slicing_document: bytes | None = None


def reconcile(
    policies: Sequence[Mapping[str, Any]],
    quotas: Sequence[Mapping[str, Any]],
    *,
    priority_classes: Mapping[str, int] | None = None,
    usage: Mapping[str, Mapping[str, int]] | None = None,
    observed_at: str = "",
    slicing_applied: Mapping[str, SlicingApplied] | None = None,
) -> Reconciled:
    """Reconcile the SlicingPolicy and TenantQuota objects (the API's JSON, as dicts).

    `priority_classes`: the cluster's PriorityClasses (name -> value), against which a quota's
    `defaultPriority`/`maxPriority` names are resolved; `usage`: per tenant id, what the slicer
    has admitted now, in its quota dimensions (`gpus`, `shared_gpus`, `gpu_mem_mib`,
    `mig/<profile>`); `observed_at`: RFC 3339 time stamped on a condition whose status or
    reason changed (default: the CR's creationTimestamp, so the result stays a pure function).
    """
    classes = dict(priority_classes or {})
    statuses: dict[tuple[str, str], Mapping[str, Any]] = {}
    slicing, slicing_document = reconcile_policies(
        policies, observed_at, statuses, slicing_applied or {}
    )
    accepted: list[tuple[Mapping[str, Any], str, dict[str, Any]]] = []
    taken: dict[str, str] = {}  # tenant id -> the CR that holds it
    for cr in _oldest_first(quotas):
        name = _name(cr)
        try:
            tenant, entry = _checked_entry(cr, classes)
        except _Invalid as bad:
            statuses[(TENANT_QUOTA, name)] = _status(cr, observed_at, (bad.reason, bad.message))
            continue
        if tenant in taken:
            message = f"tenant {tenant!r} is already defined by TenantQuota {taken[tenant]!r}"
            statuses[(TENANT_QUOTA, name)] = _status(
                cr, observed_at, (Reason.DUPLICATE_TENANT, message)
            )
            continue
        taken[tenant] = name
        accepted.append((cr, tenant, entry))
    namespaces, conflicts = _bind_namespaces(accepted)
    cohorts = _cohort_sizes(entry for _, _, entry in accepted)
    for cr, tenant, entry in accepted:
        ready = _readiness(entry, conflicts.get(_name(cr), []), cohorts)
        status = dict(_status(cr, observed_at, None, ready))
        status["usage"] = _cr_dims((usage or {}).get(tenant, {}))
        status["borrowed"] = _cr_dims(_borrowed(entry, (usage or {}).get(tenant, {})))
        statuses[(TENANT_QUOTA, _name(cr))] = status
    document: dict[str, Any] | None = None
    if accepted:
        document = {
            "version": 1,
            "priority_classes": dict(sorted(classes.items())),
            "tenants": {tenant: entry for _, tenant, entry in sorted(accepted, key=_by_tenant)},
        }
    return Reconciled(
        quota_document=document,
        slicing=slicing,
        namespaces=namespaces,
        statuses=statuses,
        slicing_document=slicing_document,
    )


def merge_usage(documents: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """The slicers' usage documents (KV ``usage.<pool>``: ``{"revision": n, "tenants":
    {tenant: {dimension: amount}}}``, one per pool) summed per tenant: `reconcile`'s `usage`.
    A malformed entry is skipped, never raised on (a status figure, not a decision)."""
    out: dict[str, dict[str, int]] = {}
    for doc in documents:
        tenants = doc.get("tenants") if isinstance(doc, Mapping) else None
        if not isinstance(tenants, Mapping):
            continue
        for tenant, dims in tenants.items():
            if not isinstance(dims, Mapping):
                continue
            into = out.setdefault(str(tenant), {})
            for dim, amount in dims.items():
                if isinstance(amount, int) and not isinstance(amount, bool):
                    into[str(dim)] = into.get(str(dim), 0) + amount
    return out


def _by_tenant(item: tuple[Mapping[str, Any], str, dict[str, Any]]) -> str:
    return item[1]


# --- TenantQuota ----------------------------------------------------------------------------


def tenant_entry(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A TenantQuota's spec as one `tenants.<id>` entry of the slicer's document, unchecked.

    The mapping only (field names and shapes): `reconcile` checks the result with the
    slicer's rules before it goes into the document. Priority class names stay names (the
    document carries the classes they resolve against)."""
    entry: dict[str, Any] = {"quota": _dims_or_as_is(spec.get("quota") or {})}
    if spec.get("cohort") is not None:
        entry["cohort"] = spec["cohort"]
    for cr_key, key in (("lendingLimit", "lending_limit"), ("borrowingLimit", "borrowing_limit")):
        if spec.get(cr_key) is not None:
            entry[key] = _dims_or_as_is(spec[cr_key])
    for cr_key, key in (("defaultPriority", "default_priority"), ("maxPriority", "max_priority")):
        if spec.get(cr_key) is not None:
            entry[key] = spec[cr_key]
    return entry


def _dims_or_as_is(value: object) -> object:
    """A resource list in the document's names; anything else as it is (the API's JSON may
    hold anything where a schema was not enforced: the check refuses it, naming the field)."""
    return quota_dims(value) if isinstance(value, Mapping) else value


def quota_dims(cr: Mapping[str, Any]) -> dict[str, Any]:
    """A CR's resource list (`gpus`, `sharedGpus`, `gpuMemMiB`, `mig`) in the document's names
    (`gpus`, `shared_gpus`, `gpu_mem_mib`, `mig`); unknown fields are carried to be refused."""
    names = dict(_SCALARS)
    out: dict[str, Any] = {}
    for key, value in cr.items():
        if key == "mig":
            out["mig"] = dict(value) if isinstance(value, Mapping) else value
        else:
            out[names.get(key, key)] = value
    return out


def _checked_entry(cr: Mapping[str, Any], classes: Mapping[str, int]) -> tuple[str, dict[str, Any]]:
    """(tenant id, document entry), or `_Invalid` with the first problem the slicer would see."""
    spec = cr.get("spec")
    if not isinstance(spec, Mapping):
        raise _Invalid(Reason.INVALID_SPEC, "spec: expected an object")
    tenant = spec.get("tenant")
    try:
        check_tenant(tenant)  # type: ignore[arg-type]  # checked here: may be anything
    except InvalidToken as exc:
        raise _Invalid(Reason.INVALID_SPEC, f"spec.tenant: {exc}") from exc
    if tenant in _RESERVED_TENANTS:
        raise _Invalid(Reason.INVALID_SPEC, f"spec.tenant: {tenant!r} is reserved")
    assert isinstance(tenant, str)
    _check_namespaces(spec.get("namespaces"))
    entry = tenant_entry(spec)
    _check_entry(entry, classes)
    return tenant, entry


def _check_namespaces(raw: object) -> None:
    if raw is None:
        return
    if not isinstance(raw, list):
        raise _Invalid(Reason.INVALID_SPEC, f"spec.namespaces: expected a list, got {raw!r}")
    seen: set[str] = set()
    for ns in raw:
        if not isinstance(ns, str) or not _NAMESPACE.match(ns):
            raise _Invalid(Reason.INVALID_SPEC, f"spec.namespaces: {ns!r} is not a namespace name")
        if ns in seen:
            raise _Invalid(Reason.INVALID_SPEC, f"spec.namespaces: {ns!r} is listed twice")
        seen.add(ns)


_NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def _check_entry(entry: Mapping[str, Any], classes: Mapping[str, int]) -> None:
    """The slicer's `_parse_tenant` rules, on the document's names (see its QuotaError texts)."""
    cohort = entry.get("cohort")
    if cohort is not None and (not isinstance(cohort, str) or not cohort):
        raise _Invalid(
            Reason.INVALID_SPEC, f"spec.cohort: expected a non-empty string, got {cohort!r}"
        )
    nominal = _dims(entry["quota"], "spec.quota")
    lending = _dims(entry.get("lending_limit"), "spec.lendingLimit")
    borrowing = _dims(entry.get("borrowing_limit"), "spec.borrowingLimit")
    if cohort is None and (lending or borrowing):
        which = "spec.lendingLimit" if lending else "spec.borrowingLimit"
        raise _Invalid(Reason.INVALID_SPEC, f"{which}: only meaningful with a cohort, none given")
    for dim, limit in lending.items():
        if limit > nominal.get(dim, 0):
            raise _Invalid(
                Reason.INVALID_SPEC,
                f"spec.lendingLimit.{_cr_name(dim)}: {limit} exceeds the nominal quota "
                f"{nominal.get(dim, 0)}",
            )
    prio = _priority(entry.get("default_priority", 0), "spec.defaultPriority", classes)
    max_prio = _priority(entry.get("max_priority", prio), "spec.maxPriority", classes)
    if max_prio < prio:
        raise _Invalid(
            Reason.INVALID_SPEC, f"spec.maxPriority: {max_prio} is below defaultPriority {prio}"
        )


def _dims(raw: object, where: str) -> dict[str, int]:
    """Per slicer dimension (`mig/<profile>` for MIG), the count; `_Invalid` on a bad one."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _Invalid(Reason.INVALID_SPEC, f"{where}: expected an object, got {raw!r}")
    known = {key for _, key in _SCALARS} | {"mig"}
    extra = sorted(set(raw) - known)
    if extra:
        raise _Invalid(Reason.INVALID_SPEC, f"{where}: unknown field {extra[0]!r}")
    dims = {key: _count(raw[key], f"{where}.{_cr_name(key)}") for _, key in _SCALARS if key in raw}
    mig = raw.get("mig")
    if mig is None:
        return dims
    if not isinstance(mig, Mapping):
        raise _Invalid(Reason.INVALID_SPEC, f"{where}.mig: expected an object, got {mig!r}")
    for prof, count in mig.items():
        # keyed as the slicer keys it: NVIDIA's name of the profile, however the CR spells it
        try:
            dim = "mig/" + mig_gpu_instance(prof if isinstance(prof, str) else repr(prof))
        except ValueError as exc:
            raise _Invalid(Reason.INVALID_SPEC, f"{where}.mig: {exc}") from None
        if dim in dims:
            raise _Invalid(Reason.INVALID_SPEC, f"{where}.mig: {prof!r} is a second key for {dim}")
        dims[dim] = _count(count, f"{where}.mig.{prof}")
    return dims


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(Reason.INVALID_SPEC, f"{where}: expected an integer, got {value!r}")
    if value < 0:
        raise _Invalid(Reason.INVALID_SPEC, f"{where}: must be >= 0, got {value}")
    return value


def _priority(raw: object, where: str, classes: Mapping[str, int]) -> int:
    if isinstance(raw, str):
        if raw not in classes:
            raise _Invalid(
                Reason.UNKNOWN_PRIORITY_CLASS,
                f"{where}: no PriorityClass {raw!r} in the cluster (known: {sorted(classes)})",
            )
        return classes[raw]
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _Invalid(Reason.INVALID_SPEC, f"{where}: expected an integer or a name, got {raw!r}")
    return raw


def _cr_name(dim: str) -> str:
    """A slicer dimension as the CR names it (`shared_gpus` -> `sharedGpus`, `mig/1g.10gb` ->
    `mig.1g.10gb`)."""
    if dim.startswith("mig/"):
        return "mig." + dim.removeprefix("mig/")
    return {doc: cr for cr, doc in _SCALARS}.get(dim, dim)


def _cr_dims(dims: Mapping[str, int]) -> dict[str, Any]:
    """Slicer dimensions -> a CR resource list (`gpus`, `sharedGpus`, `gpuMemMiB`, `mig`)."""
    out: dict[str, Any] = {}
    for dim, amount in sorted(dims.items()):
        if dim.startswith("mig/"):
            out.setdefault("mig", {})[dim.removeprefix("mig/")] = amount
        else:
            out[_cr_name(dim)] = amount
    return out


def _borrowed(entry: Mapping[str, Any], used: Mapping[str, int]) -> dict[str, int]:
    """Per dimension, how far `used` is above the entry's nominal quota (as the slicer's
    `QuotaTracker.borrowed`: `gpu_mem_mib` counts only where it is given)."""
    nominal = _dims(entry["quota"], "spec.quota")
    out: dict[str, int] = {}
    for dim, amount in used.items():
        limit = nominal.get(dim, None if dim == "gpu_mem_mib" else 0)
        if limit is not None and amount > limit:
            out[dim] = amount - limit
    return out


def _bind_namespaces(
    accepted: Sequence[tuple[Mapping[str, Any], str, dict[str, Any]]],
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """namespace -> tenant (the oldest claim wins), and per CR name its refused claims."""
    bound: dict[str, tuple[str, str]] = {}  # namespace -> (tenant, CR name)
    conflicts: dict[str, list[str]] = {}
    for cr, tenant, _ in accepted:
        for ns in cr["spec"].get("namespaces") or ():
            holder = bound.get(ns)
            if holder is None:
                bound[ns] = (tenant, _name(cr))
            else:
                conflicts.setdefault(_name(cr), []).append(
                    f"namespace {ns!r} is already bound to tenant {holder[0]!r} "
                    f"(TenantQuota {holder[1]!r})"
                )
    return {ns: tenant for ns, (tenant, _) in sorted(bound.items())}, conflicts


def _cohort_sizes(entries: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for entry in entries:
        if entry.get("cohort") is not None:
            sizes[entry["cohort"]] = sizes.get(entry["cohort"], 0) + 1
    return sizes


def _readiness(
    entry: Mapping[str, Any], conflicts: Sequence[str], cohorts: Mapping[str, int]
) -> tuple[bool, str, str]:
    """(Ready, reason, message) of an accepted quota."""
    if conflicts:
        return False, Reason.NAMESPACE_CONFLICT, "; ".join(conflicts)
    cohort = entry.get("cohort")
    if cohort is not None and cohorts.get(cohort, 0) < 2:
        return (
            True,
            Reason.COHORT_HAS_ONE_MEMBER,
            f"cohort {cohort!r} has no other member: there is no idle quota to borrow and "
            "nobody to lend to",
        )
    return True, Reason.IN_FORCE, "the slicer enforces this quota"
