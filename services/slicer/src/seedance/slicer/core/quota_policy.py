"""A tenant quota policy: its values and the reading of its YAML document.

Owns the quota dimensions (`gpus`, `shared_gpus`, `gpu_mem_mib`, `mig/<profile>`), a tenant's
nominal quota and limits (`TenantQuota`), the whole policy (`QuotaPolicy`) and `QuotaError`,
which names the offending field and value. A MIG key is read by the one MIG parser
(`gpus.mig_gpu_instance`): `1g.10gb.me` counts `mig/1g.10gb+me`, the name a placement asks for.
It must not account usage nor admit anything: that is `quota`'s (`QuotaTracker`), which
re-exports these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from seedance.events.gpus import mig_gpu_instance
from seedance.slicer.core.bounded_yaml import DocumentError, bounded_name, bounded_repr, load

__all__ = [
    "GPUS",
    "GPU_MEM_MIB",
    "MIG_PREFIX",
    "SHARED_GPUS",
    "QuotaError",
    "QuotaPolicy",
    "TenantQuota",
]

GPUS = "gpus"
SHARED_GPUS = "shared_gpus"
GPU_MEM_MIB = "gpu_mem_mib"
MIG_PREFIX = "mig/"
_SCALAR_KEYS = (GPUS, SHARED_GPUS, GPU_MEM_MIB)


class QuotaError(ValueError):
    """The policy is invalid; the message names the field and the value."""


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
    _only_keys(
        body,
        {"cohort", "quota", "lending_limit", "borrowing_limit", "default_priority", "max_priority"},
        where,
    )
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
