"""The SlicingPolicy CR to the document the slicer reads, and a status that never lies.

Owns the SlicingPolicy half of the reconciliation (`seedance.k8s_bridge.core.policy.reconcile`
calls it): each CR checked again with the CRD's rules (one stored before a rule existed must
not reach the slicer), the one in force (named `default`; others are told `NotTheDefault`)
turned into `seedance.events.slicing_policy.SlicingPolicyDoc` bytes for the KV key
``slicing``, and its `Ready` condition from what the slicers say they applied (their
``usage.<pool>`` documents' ``slicing`` entry, `merge_applied`):

- `NotApplied` (False) until every slicer following the key reported this very document (by
  digest): a policy nobody read is not in force;
- `PartiallyInForce` (True) naming each field a slicer does not follow and why;
- `InForce` (True) only when they follow all of it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from seedance.events.slicing_policy import SlicingApplied, digest, encode_policy, from_spec
from seedance.k8s_bridge.core.cr_status import (
    MIG_PROFILE,
    Invalid,
    Reason,
    cr_name,
    oldest_first,
    status,
)

__all__ = [
    "SLICING_POLICY",
    "SLICING_POLICY_IN_FORCE",
    "merge_applied",
    "reconcile_policies",
]

SLICING_POLICY = "SlicingPolicy"
#: The one SlicingPolicy in force (as a Kueue or GPU-operator singleton): others are refused.
SLICING_POLICY_IN_FORCE = "default"
_PLACEMENT_POLICIES = ("seedance", "first-fit")
_SHARING_MODES = ("time-slicing", "mps")


def merge_applied(documents: Mapping[str, Any], key: str) -> dict[str, SlicingApplied]:
    """Per usage key (``usage.<pool>``), what that pool's slicer applied of the SlicingPolicy
    at KV key `key` (slicers following another key, or none, are left out). A malformed entry
    is left out too: it never counts as applied."""
    out: dict[str, SlicingApplied] = {}
    for usage_key, doc in documents.items():
        raw = doc.get("slicing") if isinstance(doc, Mapping) else None
        try:
            applied = msgspec.convert(raw, SlicingApplied)
        except msgspec.ValidationError:
            continue
        if applied.key == key:
            out[str(usage_key)] = applied
    return out


def reconcile_policies(
    policies: Sequence[Mapping[str, Any]],
    observed_at: str,
    statuses: dict[tuple[str, str], Mapping[str, Any]],
    applied: Mapping[str, SlicingApplied],
) -> tuple[Mapping[str, Any] | None, bytes | None]:
    """The spec in force and its document's bytes (None, None: no valid `default`); each CR's
    status into `statuses`."""
    in_force: Mapping[str, Any] | None = None
    document: bytes | None = None
    for cr in oldest_first(policies):
        name = cr_name(cr)
        try:
            spec = _checked_policy(cr.get("spec"))
        except Invalid as bad:
            statuses[(SLICING_POLICY, name)] = status(cr, observed_at, (bad.reason, bad.message))
            continue
        if name != SLICING_POLICY_IN_FORCE:
            ready = (
                False,
                Reason.NOT_THE_DEFAULT,
                f"only the SlicingPolicy named {SLICING_POLICY_IN_FORCE!r} is in force",
            )
        else:
            in_force, document = spec, encode_policy(from_spec(spec))
            ready = _readiness(document, applied)
        statuses[(SLICING_POLICY, name)] = status(cr, observed_at, None, ready)
    return in_force, document


def _readiness(document: bytes, applied: Mapping[str, SlicingApplied]) -> tuple[bool, str, str]:
    want = digest(document)
    if not applied:
        return False, Reason.NOT_APPLIED, "no slicer has reported applying this policy yet"
    behind = sorted(k.removeprefix("usage.") for k, a in applied.items() if a.digest != want)
    if behind:
        return (
            False,
            Reason.NOT_APPLIED,
            f"the slicer of pool(s) {', '.join(behind)} has not applied this spec yet",
        )
    fields: dict[str, str] = {}
    for a in applied.values():
        fields.update(a.unhonoured)
    if fields:
        listed = "; ".join(f"{f}: {why}" for f, why in sorted(fields.items()))
        return True, Reason.PARTIALLY_IN_FORCE, f"the slicer follows it except {listed}"
    return True, Reason.IN_FORCE, "the slicer follows every field of this policy"


def _checked_policy(spec: object) -> Mapping[str, Any]:
    """The spec, or `Invalid` with the first rule of the CRD it breaks (the same rules as its
    schema and CEL rules, for an object stored before a rule existed)."""
    if not isinstance(spec, Mapping):
        raise Invalid(Reason.INVALID_SPEC, "spec: expected an object")
    placement = spec.get("placementPolicy", "seedance")
    if placement not in _PLACEMENT_POLICIES:
        raise Invalid(
            Reason.INVALID_SPEC,
            f"spec.placementPolicy: {placement!r} is not one of {list(_PLACEMENT_POLICIES)}",
        )
    _check_mig(spec.get("mig") or {})
    models: set[str] = set()
    shared_gpus = spec.get("sharedGpu") or []
    if not isinstance(shared_gpus, list):
        raise Invalid(Reason.INVALID_SPEC, f"spec.sharedGpu: expected a list, got {shared_gpus!r}")
    for i, shared in enumerate(shared_gpus):
        where = f"spec.sharedGpu[{i}]"
        model = shared.get("gpuModel") if isinstance(shared, Mapping) else None
        if not isinstance(model, str) or not model or model in models:
            raise Invalid(Reason.INVALID_SPEC, f"{where}.gpuModel: {model!r} is missing or twice")
        models.add(model)
        mode = shared.get("mode", "time-slicing")
        if mode not in _SHARING_MODES:
            raise Invalid(
                Reason.INVALID_SPEC, f"{where}.mode: {mode!r} is not one of {list(_SHARING_MODES)}"
            )
        if mode != "mps" and shared.get("memoryMiBPerReplica") is not None:
            raise Invalid(
                Reason.INVALID_SPEC,
                f"{where}.memoryMiBPerReplica: needs mode mps (time-slicing cannot enforce it)",
            )
    return spec


def _check_mig(mig: object) -> None:
    if not isinstance(mig, Mapping):
        raise Invalid(Reason.INVALID_SPEC, f"spec.mig: expected an object, got {mig!r}")
    default = mig.get("defaultProfile")
    if default is None:
        return
    if not isinstance(default, str) or not MIG_PROFILE.match(default):
        raise Invalid(
            Reason.INVALID_SPEC,
            f"spec.mig.defaultProfile: {default!r} is not a MIG profile name like 3g.40gb",
        )
    if mig.get("strategy") == "none":
        raise Invalid(
            Reason.INVALID_SPEC, "spec.mig.defaultProfile: needs MIG on (strategy single or mixed)"
        )
